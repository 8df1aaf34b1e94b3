"""In-place application: everything is checked before the first copy; sinks for the collective path."""

from __future__ import annotations

import pytest
import torch
from _weights_workers import equal, make_tensors, zeros_like

from meshrl.api.common.v1 import weights_pb2
from meshrl.common.errors import InvalidArgument
from meshrl.common.weights import InPlaceSink, apply_to_state
from meshrl.common.weights.buckets import bucket_specs


def untouched(params) -> bool:
    return all(not p.any() for p in params.values())


def test_applies_in_place_under_no_grad_with_params_that_require_grad():
    model = torch.nn.Linear(4, 3)
    params = dict(model.named_parameters())
    before = {n: p.data_ptr() for n, p in params.items()}
    incoming = [("weight", torch.ones(3, 4)), ("bias", torch.full((3,), 2.0))]
    assert apply_to_state(params, incoming, current_version=0, new_version=1) == 2
    assert torch.equal(model.weight, torch.ones(3, 4)) and torch.equal(model.bias, torch.full((3,), 2.0))
    assert {n: p.data_ptr() for n, p in params.items()} == before and model.weight.requires_grad


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda t: t[:-1], "missing from the update"),
        (lambda t: [*t, ("extra.weight", torch.zeros(2))], "unknown tensor 'extra.weight'"),
        (lambda t: [*t, t[0]], "sent twice"),
        (lambda t: [(n, x.reshape(-1)) if i == 0 else (n, x) for i, (n, x) in enumerate(t)], "has shape"),
        (lambda t: [(n, x.double()) if i == 2 else (n, x) for i, (n, x) in enumerate(t)], "has dtype"),
    ],
)
def test_bad_updates_are_refused_before_any_copy(mutate, match):
    params = zeros_like(make_tensors(1))
    with pytest.raises(InvalidArgument, match=match) as err:
        apply_to_state(params, mutate(make_tensors(1)), current_version=1, new_version=2)
    assert "nothing was changed" in str(err.value) and untouched(params)


def test_versions_never_go_back_but_a_refit_of_the_same_version_is_allowed():
    params = zeros_like(make_tensors(1))
    with pytest.raises(InvalidArgument, match="older than the version 3"):
        apply_to_state(params, make_tensors(1), current_version=3, new_version=2)
    assert untouched(params)
    apply_to_state(params, make_tensors(1), current_version=3, new_version=3)
    assert equal(params, make_tensors(1))


def meta(version, index, bucket):
    return weights_pb2.WeightBucketMeta(version=version, bucket_index=index, tensors=bucket_specs(bucket))


def test_in_place_sink_checks_each_bucket_and_completeness():
    tensors = make_tensors(2)
    params = zeros_like(tensors)
    sink = InPlaceSink(params, current_version=1)
    sink.begin(2)
    targets = sink.targets(meta(2, 0, tensors[:2]))
    assert [t.data_ptr() for t in targets] == [params[n].data_ptr() for n, _ in tensors[:2]]
    for target, (_, t) in zip(targets, tensors[:2], strict=True):
        target.copy_(t)  # what the group does: receive straight into the parameters
    sink.apply(meta(2, 0, tensors[:2]), list(zip([n for n, _ in tensors[:2]], targets, strict=True)))
    sink.apply(meta(2, 1, tensors[2:4]), tensors[2:4])
    with pytest.raises(InvalidArgument, match="missing from the update") as err:
        sink.end(2)
    assert "refit this replica" in str(err.value) and sink.version == 1 and sink.touched
    sink.begin(2)
    for i, bucket in enumerate((tensors[:3], tensors[3:])):
        sink.apply(meta(2, i, bucket), bucket)
    sink.end(2)
    assert sink.version == 2 and not sink.touched and equal(params, tensors)


def test_in_place_sink_refuses_old_versions_and_bad_buckets_untouched():
    params = zeros_like(make_tensors(1))
    sink = InPlaceSink(params, current_version=4)
    with pytest.raises(InvalidArgument, match="older"):
        sink.begin(3)
    sink.begin(5)
    bad = [("model.norm.weight", torch.zeros(3, dtype=torch.bfloat16))]
    with pytest.raises(InvalidArgument, match="has shape"):
        sink.apply(meta(5, 0, bad), bad)
    assert untouched(params) and not sink.touched
    strided = {"w": torch.zeros(4, 3).t()}
    assert InPlaceSink(strided, 0).targets(meta(1, 0, [("w", torch.zeros(3, 4))])) is None  # stage instead
    assert InPlaceSink(params, 0, direct=False).targets(meta(1, 0, make_tensors(1)[:1])) is None
