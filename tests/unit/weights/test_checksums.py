"""Checksums of a deterministic sample of tensors, compared between trainer and replicas."""

from __future__ import annotations

import pytest
import torch
from _weights_workers import make_tensors

from meshrl.common.errors import DataLoss, InvalidArgument
from meshrl.common.weights import compare_checksums, sample_names, tensor_checksum, tensor_checksums, to_proto


def test_sample_is_first_last_and_evenly_spaced_by_sorted_name():
    names = [f"layer.{i:03d}" for i in range(100)]
    sample = sample_names(reversed(names), 5)
    assert sample == ["layer.000", "layer.025", "layer.050", "layer.074", "layer.099"]
    assert sample_names(names[:3], 8) == names[:3] and sample_names(names, 1) == ["layer.000"]
    assert sample_names(names, 0) == []


def test_checksums_agree_across_copies_and_catch_any_change():
    tensors = make_tensors(1)
    sums = tensor_checksums(tensors)
    assert set(sums) == set(sample_names(n for n, _ in tensors)) and all(len(v) == 64 for v in sums.values())
    copies = {n: t.clone() for n, t in tensors}
    assert tensor_checksums(copies, names=list(sums)) == sums
    copies["lm_head.weight"][3, 4] += 1e-3
    assert tensor_checksums(copies, names=list(sums))["lm_head.weight"] != sums["lm_head.weight"]
    # the same bytes under another dtype or shape are another tensor
    x = torch.arange(4, dtype=torch.int32)
    assert tensor_checksum(x) != tensor_checksum(x.view(torch.float32))
    assert tensor_checksum(x) != tensor_checksum(x.view(2, 2))
    assert tensor_checksum(torch.arange(6.0).view(2, 3).t()) == tensor_checksum(
        torch.arange(6.0).view(2, 3).t().contiguous()
    )
    with pytest.raises(InvalidArgument, match="not among"):
        tensor_checksums(copies, names=["nope"])


def test_compare_fails_loudly_on_a_mismatch():
    tensors = make_tensors(1)
    trainer = to_proto(3, tensor_checksums(tensors))
    compare_checksums(trainer, to_proto(3, tensor_checksums(dict(tensors), names=list(trainer.sha256))))
    other = to_proto(3, tensor_checksums(make_tensors(2), names=list(trainer.sha256)))
    with pytest.raises(DataLoss, match="differs"):
        compare_checksums(trainer, other, who="replica r1")
    with pytest.raises(DataLoss, match="serves version 2"):
        compare_checksums(trainer, to_proto(2, dict(trainer.sha256)))
