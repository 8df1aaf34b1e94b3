"""The manifest's digest algorithm: xxh3-128 by default, sha256 still written on request and read
from manifests that predate the choice, unknown algorithms refused with a clear error."""

from __future__ import annotations

import json
import os

import pytest
from _weights_workers import equal, make_tensors, zeros_like

from meshrl.common.errors import DataLoss, InvalidArgument
from meshrl.common.weights import load_version, read_manifest, read_version, write_version
from meshrl.common.weights.hashing import DEFAULT_DIGEST, TensorHashers


def _manifest(path: str) -> tuple[str, dict]:
    name = os.path.join(path, "manifest.json")
    with open(name) as f:
        return name, json.load(f)


def _flip_last_byte(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        byte = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x01]))


def test_default_digest_is_xxh3_128_and_named_in_the_manifest(tmp_path):
    disk = write_version(str(tmp_path), 1, make_tensors(1))
    _, doc = _manifest(disk.path)
    assert DEFAULT_DIGEST == "xxh3_128" and doc["digest"] == "xxh3_128"
    assert all(len(t["xxh3_128"]) == 32 and "sha256" not in t for t in doc["tensors"])
    assert read_manifest(disk.path)[0].digest == "xxh3_128"
    params = zeros_like(make_tensors(1))
    assert load_version(params, disk, current_version=0) == 1 and equal(params, make_tensors(1))


def test_manifest_from_before_the_choice_loads_as_sha256_and_still_catches_a_flipped_byte(tmp_path):
    disk = write_version(str(tmp_path), 1, make_tensors(1), digest="sha256")
    name, doc = _manifest(disk.path)
    del doc["digest"]  # what a manifest written before the field existed looks like
    with open(name, "w") as f:
        json.dump(doc, f)
    assert read_manifest(disk.path)[0].digest == "sha256"
    params = zeros_like(make_tensors(1))
    load_version(params, disk.path, current_version=0)
    assert equal(params, make_tensors(1))
    _flip_last_byte(os.path.join(disk.path, "model.safetensors"))
    fresh = zeros_like(make_tensors(1))
    with pytest.raises(DataLoss, match="does not match its sha256"):
        load_version(fresh, disk.path, current_version=0)
    assert all(not t.any() for t in fresh.values())  # nothing copied
    with pytest.raises(DataLoss, match="does not match its sha256"):
        list(read_version(disk.path))


def test_unknown_or_mismatched_algorithm_is_a_clear_error(tmp_path):
    with pytest.raises(InvalidArgument, match="digest algorithm 'md5' is unknown.*sha256.*xxh3_128"):
        write_version(str(tmp_path), 1, make_tensors(1), digest="md5")
    assert not os.listdir(tmp_path)  # refused before anything was written
    disk = write_version(str(tmp_path), 1, make_tensors(1))
    name, doc = _manifest(disk.path)
    for breakage, match in [
        (lambda d: d.update(digest="blake3"), "manifest field 'digest': digest algorithm 'blake3' is unknown"),
        (lambda d: d.update(digest="sha256"), r"tensors\[0\]\.sha256 None is not a lowercase sha256 hex digest"),
        (lambda d: d["tensors"][0].update(xxh3_128="ab" * 32), "not a lowercase xxh3_128 hex digest"),
    ]:
        bad = json.loads(json.dumps(doc))
        breakage(bad)
        with open(name, "w") as f:
            json.dump(bad, f)
        with pytest.raises(InvalidArgument, match=match):
            read_version(disk.path)


def test_hashers_refuse_an_unknown_algorithm():
    with pytest.raises(InvalidArgument, match="'crc32' is unknown"):
        TensorHashers([], "crc32")


def test_versions_are_not_fsynced_unless_asked(tmp_path, monkeypatch):
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd)))
    disk = write_version(str(tmp_path), 1, make_tensors(1), bucket_bytes=4096, extra_files={"config.json": b"{}"})
    assert synced == []  # the default: the rename makes it whole to readers, digests catch a torn one
    write_version(str(tmp_path), 2, make_tensors(2), bucket_bytes=4096, extra_files={"config.json": b"{}"}, fsync=True)
    shards = [f for f in os.listdir(tmp_path / "v000002") if f.endswith(".safetensors")]
    assert len(synced) >= len(shards) + 4  # every shard, config.json, manifest, the folder and the root
    params = zeros_like(make_tensors(1))
    assert load_version(params, disk, current_version=0) == 1 and equal(params, make_tensors(1))
