"""Property tests (hypothesis) of the tensor codec, which decodes what peers send: any array of a
supported dtype and any ragged column round-trips bit for bit; any header/payload a peer could
send either decodes or is refused with InvalidArgument -- never another exception."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from meshrl.api.common.v1 import tensor_pb2 as pb
from meshrl.common.codec import NUMPY_BY_DTYPE, Ragged, batch_from_proto, batch_to_proto, decode_batch, encode_batch
from meshrl.common.errors import InvalidArgument

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = [d for d in NUMPY_BY_DTYPE.values() if d.kind != "V"]  # bfloat16 has no hypothesis strategy
ROWS = st.integers(0, 6)


@st.composite
def columns(draw):
    rows = draw(ROWS)
    out = {}
    for i in range(draw(st.integers(1, 3))):
        dtype = draw(st.sampled_from(DTYPES))
        if draw(st.booleans()):
            lengths = draw(st.lists(st.integers(0, 5), min_size=rows, max_size=rows))
            values = draw(hnp.arrays(dtype, (sum(lengths),)))
            out[f"c{i}"] = Ragged(values, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))
        else:
            tail = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
            out[f"c{i}"] = draw(hnp.arrays(dtype, (rows, *tail)))
    return out


def _same(a, b) -> bool:
    if isinstance(a, Ragged):
        return isinstance(b, Ragged) and _same(a.values, b.values) and np.array_equal(a.offsets, b.offsets)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@SETTINGS
@given(columns())
def test_any_batch_round_trips_bit_for_bit(cols):
    header, views = encode_batch(cols)
    batch = decode_batch(header, b"".join(bytes(v) for v in views))
    assert all(_same(cols[k], batch.columns[k]) for k in cols)
    inline = batch_from_proto(batch_to_proto(batch))
    assert all(_same(cols[k], inline.columns[k]) for k in cols)


specs = st.builds(
    pb.TensorSpec,
    name=st.text(max_size=3),
    dtype=st.integers(-1, 15),
    shape=st.lists(st.integers(-2, 6), max_size=3),
    nbytes=st.integers(-4, 200),
    ragged=st.booleans(),
    offsets=st.lists(st.integers(-2, 12), max_size=5),
)


@SETTINGS
@given(st.lists(specs, max_size=3), st.integers(-4, 400), st.binary(max_size=400))
def test_any_header_and_payload_decode_or_are_refused(tensors, total, payload):
    header = pb.BatchHeader(tensors=tensors, total_bytes=total)
    try:
        batch = decode_batch(header, payload)
    except InvalidArgument:
        return
    for spec in tensors:  # what decoded agrees with its header
        column = batch.columns[spec.name]
        array = column.values if isinstance(column, Ragged) else column
        assert array.nbytes == spec.nbytes


@SETTINGS
@given(st.lists(st.builds(pb.Tensor, spec=specs, data=st.binary(max_size=64)), max_size=3))
def test_any_inline_batch_decodes_or_is_refused(tensors):
    try:
        batch_from_proto(pb.TensorBatch(tensors=tensors))
    except InvalidArgument:
        pass
