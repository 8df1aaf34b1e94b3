"""Property tests (hypothesis) of sampling parameters, which come from workflow files, job configs
and Generate requests: any mapping of values either builds SamplingParams that satisfy their own
rules, or is refused with InvalidArgument naming the sampling field; proto round trips keep them."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from meshrl.api.rollout.v1 import rollout_pb2
from meshrl.common.errors import InvalidArgument
from meshrl.rollout.types import SamplingParams

SETTINGS = settings(max_examples=200, deadline=None)
ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True),
    st.text(max_size=4),
    st.lists(st.one_of(st.integers(-5, 2**33), st.text(max_size=2), st.floats()), max_size=3),
)
KEYS = st.sampled_from([*SamplingParams.field_names(), "temprature", "top-p", "n"])


def _valid(p: SamplingParams) -> bool:
    return (
        isinstance(p.max_tokens, int)
        and p.max_tokens > 0
        and math.isfinite(p.temperature)
        and p.temperature >= 0
        and 0 < p.top_p <= 1
        and isinstance(p.top_k, int)
        and not isinstance(p.top_k, bool)
        and p.top_k >= 0
        and all(isinstance(t, int) and t >= 0 for t in p.stop_token_ids)
    )


@SETTINGS
@given(st.dictionaries(KEYS, ANY, max_size=4))
def test_any_mapping_builds_valid_params_or_is_refused(values):
    try:
        params = SamplingParams.from_dict(values)
    except InvalidArgument as exc:
        assert "sampling" in str(exc) or "sampling" in (exc.field or "")
        return
    assert _valid(params)


proto_params = st.builds(
    rollout_pb2.SamplingParams,
    temperature=st.floats(width=32, allow_nan=True),
    top_p=st.floats(width=32, allow_nan=True),
    top_k=st.integers(-(2**31), 2**31 - 1),
    max_tokens=st.integers(-(2**31), 2**31 - 1),
    stop_token_ids=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=3),
    seed=st.integers(0, 2**63 - 1),
    ignore_eos=st.booleans(),
)


@SETTINGS
@given(proto_params)
def test_any_request_proto_is_valid_or_refused_and_round_trips(msg):
    try:
        params = SamplingParams.from_proto(msg)
    except InvalidArgument:
        return
    assert _valid(params)
    assert SamplingParams.from_proto(params.to_proto()) == params
