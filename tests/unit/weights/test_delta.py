"""Delta weight versions: bit-exact apply, refusal without the base, corrupt deltas, the size fallback."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
import xxhash
from _weights_workers import equal, make_tensors, zeros_like

from meshrl.common.errors import DataLoss, FailedPrecondition, InvalidArgument
from meshrl.common.weights import (
    BaseMismatch,
    DeltaBase,
    apply_delta,
    list_versions,
    load_version,
    read_manifest,
    stage_delta,
    tensor_checksums,
    write_delta,
    write_version,
)
from meshrl.common.weights.delta_codec import apply, encode


def step(tensors, lr: float, seed: int = 1, frozen: tuple[str, ...] = ()) -> list[tuple[str, torch.Tensor]]:
    """One sign-like optimizer step in fp32, cast back to each tensor's dtype (`frozen` ones stay)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for name, t in tensors:
        moved = t.float() + lr * torch.randn(t.shape, generator=g).sign()
        out.append((name, t if name in frozen else moved.to(t.dtype)))
    return out


def published(tmp_path, lr=1e-2):
    """v1 complete (loaded by a replica, recorded as the base), and the trainer's v2 tensors."""
    v1 = make_tensors(1, scale=64)
    base = DeltaBase()
    full = write_version(str(tmp_path), 1, base.record(1, v1))
    params = zeros_like(v1)
    load_version(params, full, current_version=0)
    return base, params, v1, step(v1, lr, frozen=("model.norm.weight",))


def test_delta_apply_is_bit_exact_and_checksums_equal(tmp_path):
    base, params, v1, v2 = published(tmp_path)
    disk, stats = write_delta(str(tmp_path), 2, base, v2)
    assert disk.delta and disk.base_version == 1 and disk.path == str(tmp_path / "d000002")
    assert 0 < disk.delta_bytes == stats.delta_bytes < stats.full_bytes
    assert base.holds(2) and equal(base.tensors, v2)
    pointers = {n: p.data_ptr() for n, p in params.items()}
    staged = stage_delta(params, disk, current_version=1)
    assert equal(params, v1)  # staging touches nothing
    assert "model.norm.weight" not in {n for n, _ in staged.tensors}  # unchanged: not copied
    apply_delta(params, staged)
    assert equal(params, v2) and pointers == {n: p.data_ptr() for n, p in params.items()}
    assert tensor_checksums(params, names=sorted(params)) == tensor_checksums(dict(v2), names=sorted(params))
    assert list_versions(str(tmp_path)) == [(1, str(tmp_path / "v000001"))]  # a delta is not a complete version


def test_delta_digests_are_those_of_a_sha256_complete_version(tmp_path):
    base, _, _, v2 = published(tmp_path)
    delta, _ = write_delta(str(tmp_path), 2, base, v2)
    full = write_version(str(tmp_path / "full"), 2, v2, digest="sha256")
    manifest, _ = read_manifest(full.path)
    assert manifest.digest == "sha256"
    complete = {e.name: e.digest for entries in manifest.tensors.values() for e in entries}
    raw = (tmp_path / "d000002" / "manifest.json").read_text()
    assert all(sha in raw for sha in complete.values())
    assert delta.manifest_sha256 != full.manifest_sha256


@pytest.mark.parametrize("digest", ["sha256", "xxh3_128"])
def test_single_pass_hash_equals_a_separate_digest(tmp_path, digest):
    tensors = make_tensors(3, scale=8)
    disk = write_version(str(tmp_path), 1, tensors, digest=digest)
    manifest, _ = read_manifest(disk.path)
    written = {e.name: e.digest for entries in manifest.tensors.values() for e in entries}
    new = {"sha256": hashlib.sha256, "xxh3_128": xxhash.xxh3_128}[digest]
    separate = {n: new(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest() for n, t in tensors}
    assert manifest.digest == digest and written == separate


def test_delta_against_a_missing_base_is_refused_and_nothing_changes(tmp_path):
    base, params, v1, v2 = published(tmp_path)
    write_delta(str(tmp_path), 2, base, v2)
    v3 = step(v2, 1e-2, seed=2)
    disk, _ = write_delta(str(tmp_path), 3, base, v3)  # against v2, which this replica missed
    with pytest.raises(BaseMismatch, match="delta against version 2, but this replica serves 1"):
        stage_delta(params, disk, current_version=1)
    assert equal(params, v1)
    load_version(params, write_version(str(tmp_path), 3, base.tensors.items()), current_version=1)  # the refit
    assert equal(params, v3)


def test_replica_whose_weights_are_not_the_base_is_refused(tmp_path):
    base, params, v1, v2 = published(tmp_path)
    disk, _ = write_delta(str(tmp_path), 2, base, v2)
    name = next(n for n, t in v1 if t.dtype == torch.bfloat16)
    params[name].view(-1)[0] += 1  # same version number, other bits
    before = {n: p.clone() for n, p in params.items()}
    with pytest.raises(BaseMismatch, match="not version 1's"):
        stage_delta(params, disk, current_version=1)
    assert equal(params, list(before.items()))


@pytest.mark.parametrize("damage", ["flip", "truncate", "manifest"])
def test_corrupt_delta_is_a_clear_error_and_the_replica_is_unchanged(tmp_path, damage):
    base, params, v1, v2 = published(tmp_path)
    disk, _ = write_delta(str(tmp_path), 2, base, v2)
    data = os.path.join(disk.path, "delta.bin")
    raw = bytearray(open(data, "rb").read())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0xFF
        open(data, "wb").write(raw)
        match = "does not match its sha256"
    elif damage == "truncate":
        open(data, "wb").write(raw[:-3])
        match = "truncated"
    else:
        with open(os.path.join(disk.path, "manifest.json"), "a") as f:
            f.write(" ")
        match = "was published"
    with pytest.raises(DataLoss, match=match):
        stage_delta(params, disk, current_version=1)
    assert equal(params, v1)


def test_oversized_delta_writes_nothing_and_the_base_moves_on(tmp_path):
    base, _, _, v2 = published(tmp_path, lr=1.0)
    disk, stats = write_delta(str(tmp_path), 2, base, v2, max_fraction=0.01)
    assert disk is None and stats.delta_bytes > 0.01 * stats.full_bytes
    assert base.holds(2) and equal(base.tensors, v2) and not (tmp_path / "d000002").exists()
    with pytest.raises(InvalidArgument, match="max_fraction"):
        write_delta(str(tmp_path), 3, base, v2, max_fraction=0)


def test_export_that_is_not_the_base_drops_the_base(tmp_path):
    base, _, _, v2 = published(tmp_path)
    with pytest.raises(FailedPrecondition, match="not in the delta base"):
        write_delta(str(tmp_path), 2, base, [*v2[:-1], ("other", torch.zeros(3))])
    assert not base.holds(1) and not base.holds(2)
    with pytest.raises(FailedPrecondition, match="no base"):
        write_delta(str(tmp_path), 3, base, v2)


def test_codec_is_bit_exact_across_dtypes_and_extremes():
    cases = [
        (
            torch.tensor([0, -1, 32767, -32768, 5], dtype=torch.int16),
            torch.tensor([-32768, 32767, -32768, 0, 5], dtype=torch.int16),
        ),
        (
            torch.tensor([0, -1, 2**31 - 1, -(2**63), 5], dtype=torch.int64),
            torch.tensor([-(2**63), 2**63 - 1, -(2**31), 0, 5], dtype=torch.int64),
        ),
        (torch.tensor([True, False, True]), torch.tensor([False, False, True])),
        (torch.tensor([1.0, float("nan"), -0.0]), torch.tensor([float("inf"), 1.0, 0.0])),
    ]
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16, torch.float64):
        a = torch.randn(1000, generator=g).to(dtype)
        cases.append((a, (a.double() * 1.01).to(dtype)))
    cases.append((a, a.clone()))
    a = torch.randn(1000, generator=g).to(torch.bfloat16)
    cases.append((a, torch.where(torch.arange(1000) % 10 == 0, a * 2, a)))  # a tenth changes: sparse
    for old, new in cases:
        enc = encode(old, new)
        assert torch.equal(apply(enc.blob, old, enc.changed, "t").view(torch.uint8), new.view(torch.uint8))
    sparse, dense = encode(*cases[-1]), encode(torch.zeros(64), torch.ones(64))
    assert sparse.blob[0] != dense.blob[0]  # both forms were taken
    with pytest.raises(DataLoss, match="corrupt"):
        apply(b"\x00not zlib", cases[0][0], 4, "t")
    with pytest.raises(DataLoss, match="mode 7"):
        apply(b"\x07" + dense.blob[1:], torch.zeros(64), 64, "t")
