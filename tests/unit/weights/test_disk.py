"""Disk transport: versioned folders written atomically, verified on read, applied all or nothing."""

from __future__ import annotations

import json
import os

import pytest
import torch
from _weights_workers import equal, make_tensors, zeros_like
from safetensors.torch import load_file

from meshrl.api.common.v1 import weights_pb2
from meshrl.common.errors import AlreadyExists, DataLoss, InvalidArgument, NotFound
from meshrl.common.weights import (
    gc_versions,
    list_versions,
    load_version,
    read_manifest,
    read_version,
    stage_to_local,
    write_version,
)


def publish(root, version, seed=None, **kw) -> weights_pb2.DiskWeights:
    return write_version(str(root), version, make_tensors(seed if seed is not None else version), **kw)


def test_round_trip_is_bit_exact_and_readable_by_hf(tmp_path):
    disk = publish(tmp_path, 1, bucket_bytes=4096, extra_files={"config.json": b'{"model_type": "llama"}'})
    assert disk.version == 1 and disk.path == str(tmp_path / "v000001") and len(disk.manifest_sha256) == 64
    files = sorted(os.listdir(disk.path))
    shards = [f for f in files if f.endswith(".safetensors")]
    assert len(shards) > 1 and "model.safetensors.index.json" in files and "config.json" in files
    index = json.loads((tmp_path / "v000001" / "model.safetensors.index.json").read_text())
    hf = {}
    for shard in shards:  # plain safetensors: any HF loader reads them
        hf.update(load_file(os.path.join(disk.path, shard)))
    assert set(index["weight_map"]) == set(hf) and equal(hf, make_tensors(1))
    reader = read_version(disk.path, disk.manifest_sha256)
    assert reader.version == 1 and equal(dict(reader), make_tensors(1))
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]


def test_single_bucket_is_one_model_file_and_buckets_may_be_given(tmp_path):
    tensors = make_tensors(4)
    disk = write_version(str(tmp_path), 4, [tensors[:3], tensors[3:]])  # ready-made buckets
    assert sorted(f for f in os.listdir(disk.path) if f.endswith(".safetensors")) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    one = write_version(str(tmp_path), 5, make_tensors(5))
    assert "model.safetensors" in os.listdir(one.path)


def test_load_version_copies_in_place_without_reallocating(tmp_path):
    disk = publish(tmp_path, 1)
    params = zeros_like(make_tensors(1))
    pointers = {n: p.data_ptr() for n, p in params.items()}
    assert load_version(params, disk, current_version=0) == 1
    assert equal(params, make_tensors(1))
    assert {n: p.data_ptr() for n, p in params.items()} == pointers


def test_load_version_into_strided_parameters(tmp_path):
    tensors = [("w", torch.arange(12.0).view(3, 4)), ("b", torch.arange(3.0))]
    disk = write_version(str(tmp_path), 1, tensors)
    params = {"w": torch.zeros(4, 3).t(), "b": torch.zeros(3)}  # a transposed view, as some engines hold
    assert load_version(params, disk, 0) == 1
    assert torch.equal(params["w"], tensors[0][1]) and torch.equal(params["b"], tensors[1][1])


@pytest.mark.parametrize("digest", ["sha256", "xxh3_128"])
def test_corrupted_file_is_refused_and_old_weights_kept(tmp_path, digest):
    publish(tmp_path, 1)
    params = zeros_like(make_tensors(1))
    load_version(params, str(tmp_path / "v000001"), 0)
    disk = publish(tmp_path, 2, bucket_bytes=4096, digest=digest)
    last = sorted(f for f in os.listdir(disk.path) if f.endswith(".safetensors"))[-1]
    with open(os.path.join(disk.path, last), "r+b") as f:  # flip one byte of the last tensor data
        f.seek(-1, os.SEEK_END)
        byte = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(DataLoss, match=f"does not match its {digest}"):
        load_version(params, disk, current_version=1)
    assert equal(params, make_tensors(1))  # earlier shards were verified but nothing was copied


def test_truncated_or_missing_file_is_data_loss(tmp_path):
    disk = publish(tmp_path, 1, bucket_bytes=4096)
    shard = os.path.join(disk.path, sorted(f for f in os.listdir(disk.path) if f.endswith(".safetensors"))[0])
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 3)
    with pytest.raises(DataLoss, match="truncated or altered"):
        list(read_version(disk.path))
    os.remove(shard)
    with pytest.raises(DataLoss, match="missing"):
        list(read_version(disk.path))


def test_manifest_checks(tmp_path):
    disk = publish(tmp_path, 1)
    with pytest.raises(DataLoss, match="replaced or altered"):
        read_version(disk.path, "0" * 64)
    with pytest.raises(NotFound):
        read_version(str(tmp_path / "v000009"))
    manifest = tmp_path / "v000001" / "manifest.json"
    doc = json.loads(manifest.read_text())
    for breakage, match in [
        (lambda d: d.update(version="one"), "version"),
        (lambda d: d["tensors"][0].update(shape=[1, 2, 3]), "data_offsets"),
        (lambda d: d["tensors"][0].update(dtype="complex64"), "dtype"),
        (lambda d: d["tensors"][0].update(file="../../etc/passwd"), "does not list"),
        (lambda d: d["files"][0].update(file="../x"), "plain file name"),
        (lambda d: d["tensors"][0].update({d["digest"]: "xyz"}), "hex digest"),
        (lambda d: d.update(total_bytes=1), "total_bytes"),
        (lambda d: d.update(version=7), "folder"),
    ]:
        bad = json.loads(json.dumps(doc))
        breakage(bad)
        manifest.write_text(json.dumps(bad))
        with pytest.raises(InvalidArgument, match=match):
            read_version(disk.path)
    manifest.write_text("{not json")
    with pytest.raises(InvalidArgument, match="not valid JSON"):
        read_manifest(disk.path)


def test_header_tampering_is_data_loss(tmp_path):
    disk = publish(tmp_path, 1)
    path = os.path.join(disk.path, "model.safetensors")
    raw = bytearray(open(path, "rb").read())
    at = raw.index(b'"F32"')
    raw[at : at + 5] = b'"I32"'  # same size, other dtype: the manifest disagrees
    open(path, "wb").write(bytes(raw))
    with pytest.raises(DataLoss, match="differs from the manifest"):
        list(read_version(disk.path))


def test_versions_never_go_back_and_are_not_overwritten(tmp_path):
    publish(tmp_path, 3)
    with pytest.raises(InvalidArgument, match="older than v3"):
        publish(tmp_path, 2)
    with pytest.raises(AlreadyExists):
        publish(tmp_path, 3)
    again = publish(tmp_path, 3, seed=9, overwrite=True)
    assert equal(dict(read_version(again.path)), make_tensors(9))
    with pytest.raises(InvalidArgument, match="no tensors"):
        write_version(str(tmp_path), 4, [])
    with pytest.raises(InvalidArgument, match="twice"):
        write_version(str(tmp_path), 4, make_tensors(1) + make_tensors(1)[:1])
    with pytest.raises(InvalidArgument, match="complex"):
        write_version(str(tmp_path), 4, [("x", torch.zeros(2, dtype=torch.complex64))])
    assert [v for v, _ in list_versions(str(tmp_path))] == [3]
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".tmp")]


def test_garbage_collection_keeps_the_last_k(tmp_path):
    for v in range(1, 5):
        publish(tmp_path, v, keep_last=2 if v == 4 else 0)
    assert [v for v, _ in list_versions(str(tmp_path))] == [3, 4]
    stale = tmp_path / ".tmp-v000005-1-dead"
    stale.mkdir()
    os.utime(stale, (0, 0))
    assert str(stale) in gc_versions(str(tmp_path), keep_last=0)
    with pytest.raises(InvalidArgument):
        gc_versions(str(tmp_path), keep_last=-1)


def test_lower_version_is_refused_on_load(tmp_path):
    disk = publish(tmp_path, 1)
    params = zeros_like(make_tensors(1))
    with pytest.raises(InvalidArgument, match="older than the version 5"):
        load_version(params, disk, current_version=5)
    assert all(not p.any() for p in params.values())
    announced = weights_pb2.DiskWeights(path=disk.path, version=2)
    with pytest.raises(InvalidArgument, match="was announced"):
        load_version(params, announced, current_version=0)


def test_stage_to_local_copies_once_and_keeps_the_last_two(tmp_path):
    shared, local = tmp_path / "shared", tmp_path / "local"
    disks = [publish(shared, v, bucket_bytes=4096) for v in (1, 2, 3)]
    for disk in disks:
        staged = stage_to_local(disk.path, str(local), disk.manifest_sha256)
        assert staged == str(local / os.path.basename(disk.path))
        assert read_manifest(staged, disk.manifest_sha256)[1] == disk.manifest_sha256
    assert sorted(os.listdir(local)) == ["v000002", "v000003"]
    mtime = os.path.getmtime(local / "v000003" / "manifest.json")
    assert stage_to_local(disks[2].path, str(local)) == str(local / "v000003")  # reused, not copied again
    assert os.path.getmtime(local / "v000003" / "manifest.json") == mtime
    with pytest.raises(DataLoss):
        stage_to_local(disks[2].path, str(local), "f" * 64)
    params = zeros_like(make_tensors(3))
    staged_disk = weights_pb2.DiskWeights(path=disks[2].path, version=3, local_staging_dir=str(local))
    assert load_version(params, staged_disk, 2) == 3 and equal(params, make_tensors(3))
