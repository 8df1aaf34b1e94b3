"""Tensor codec: bit-exact round trips for every dtype, ragged, zero-length and large batches."""

import ml_dtypes
import numpy as np
import pytest
import torch

from meshrl.api.common.v1 import tensor_pb2 as pb
from meshrl.common.codec import (
    NUMPY_BY_DTYPE,
    Batch,
    Ragged,
    batch_from_proto,
    batch_to_proto,
    decode_batch,
    encode_batch,
    merge_batches,
    to_torch,
)
from meshrl.common.errors import InvalidArgument


def roundtrip(columns, **kw) -> Batch:
    header, views = encode_batch(columns, **kw)
    return decode_batch(pb.BatchHeader.FromString(header.SerializeToString()), b"".join(views))


@pytest.mark.parametrize("dtype", list(NUMPY_BY_DTYPE.values()), ids=str)
def test_every_dtype_round_trips_bit_exact(dtype):
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, size=3 * 5 * dtype.itemsize, dtype=np.uint8)
    if dtype == np.bool_:
        raw = raw % 2
    array = raw.view(dtype).reshape(3, 5)
    out = roundtrip({"x": array})["x"]
    assert out.dtype == dtype and out.shape == (3, 5)
    assert out.tobytes() == array.tobytes()


def test_ragged_zero_length_and_empty_rows():
    ragged = Ragged.from_rows([[1, 2, 3], [], [4]], dtype=np.int32)
    out = roundtrip({"ids": ragged, "empty": np.zeros((3, 0), np.float32)})
    assert [r.tolist() for r in out["ids"].rows()] == [[1, 2, 3], [], [4]]
    assert out["empty"].shape == (3, 0)
    assert roundtrip({"none": Ragged.from_rows([], dtype=np.int64)})["none"].rows() == []


def test_large_batch_over_4_mib_and_torch_bfloat16():
    big = torch.randn(3, 1 << 19)  # 6 MiB of float32
    bf16 = torch.randn(3, 7).to(torch.bfloat16)
    out = roundtrip({"big": big, "bf16": bf16})
    assert out["big"].tobytes() == big.numpy().tobytes()
    assert out["bf16"].dtype == ml_dtypes.bfloat16
    assert torch.equal(to_torch(out["bf16"]), bf16)


def test_samples_and_attrs_travel_with_the_batch():
    meta = [pb.SampleMeta(group_id="g0", weight_version=3, finish_reason=pb.FINISH_REASON_STOP)]
    out = roundtrip({"r": np.ones(1, np.float32)}, samples=meta, attrs={"a": "b"})
    assert out.samples[0].weight_version == 3 and out.attrs == {"a": "b"}


def test_inline_proto_round_trip():
    batch = Batch({"x": np.arange(4, dtype=np.int64), "r": Ragged.from_rows([[1.0], [2.0, 3.0], [], []])})
    back = batch_from_proto(pb.TensorBatch.FromString(batch_to_proto(batch).SerializeToString()))
    assert back["x"].tolist() == [0, 1, 2, 3]
    assert [r.tolist() for r in back["r"].rows()] == [[1.0], [2.0, 3.0], [], []]


def test_encoding_is_zero_copy():
    array = np.arange(1000, dtype=np.float32)
    _, views = encode_batch({"a": array})
    array[0] = 42.0
    assert np.frombuffer(views[0], dtype=np.float32)[0] == 42.0


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda s: setattr(s, "nbytes", s.nbytes + 1), "needs"),
        (lambda s: setattr(s, "dtype", 99), "not a supported dtype"),
        (lambda s: s.shape.append(-1), "negative"),
    ],
)
def test_bad_specs_are_refused_naming_the_tensor(mutate, message):
    header, views = encode_batch({"x": np.zeros(4, np.float32)})
    mutate(header.tensors[0])
    with pytest.raises(InvalidArgument, match=message) as info:
        decode_batch(header, b"".join(views))
    assert "tensors['x']" in str(info.value)


def test_bad_ragged_offsets_and_payload_length():
    header, views = encode_batch({"r": Ragged.from_rows([[1], [2, 3]], dtype=np.int32)})
    header.tensors[0].offsets[1] = 5
    with pytest.raises(InvalidArgument, match="offsets"):
        decode_batch(header, b"".join(views))
    header, views = encode_batch({"x": np.zeros(4, np.float32)})
    with pytest.raises(InvalidArgument, match="payload has"):
        decode_batch(header, b"".join(views) + b"\0")


def test_unsupported_dtype_names_the_choices():
    with pytest.raises(InvalidArgument, match="complex64 is not supported"):
        encode_batch({"c": np.zeros(2, np.complex64)})


def test_merge_refuses_duplicate_columns_and_row_mismatch():
    a = Batch({"x": np.zeros(2)})
    assert set(merge_batches([a, Batch({"y": np.ones(2)})]).columns) == {"x", "y"}
    with pytest.raises(InvalidArgument, match="written by two"):
        merge_batches([a, Batch({"x": np.ones(2)})])
    with pytest.raises(InvalidArgument, match="number of rows"):
        merge_batches([a, Batch({"z": np.ones(3)})])


def test_concat_shards_row_wise():
    from meshrl.common.codec import concat_batches

    a = Batch({"r": Ragged.from_rows([[1], [2, 3]], dtype=np.int32), "x": np.array([1.0, 2.0])})
    b = Batch({"r": Ragged.from_rows([[], [4, 5, 6]], dtype=np.int32), "x": np.array([3.0, 4.0])})
    out = concat_batches([a, b])
    assert [r.tolist() for r in out["r"].rows()] == [[1], [2, 3], [], [4, 5, 6]]
    assert out["x"].tolist() == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(InvalidArgument, match="disagree"):
        concat_batches([a, Batch({"x": np.zeros(1)})])
