"""Tensor dtypes and specs of the weight plane: torch dtype <-> proto DType <-> safetensors code.

Used by the disk transport (manifest and safetensors headers), the collective transport
(WeightBucketMeta) and the checksums. Only dtypes every engine loads are supported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from meshrl.api.common.v1 import tensor_pb2
from meshrl.common.errors import InvalidArgument

# torch dtype -> (proto DType, safetensors code, manifest name)
_TABLE: dict[torch.dtype, tuple[int, str, str]] = {
    torch.float32: (tensor_pb2.DTYPE_FLOAT32, "F32", "float32"),
    torch.float16: (tensor_pb2.DTYPE_FLOAT16, "F16", "float16"),
    torch.bfloat16: (tensor_pb2.DTYPE_BFLOAT16, "BF16", "bfloat16"),
    torch.float64: (tensor_pb2.DTYPE_FLOAT64, "F64", "float64"),
    torch.int8: (tensor_pb2.DTYPE_INT8, "I8", "int8"),
    torch.uint8: (tensor_pb2.DTYPE_UINT8, "U8", "uint8"),
    torch.int16: (tensor_pb2.DTYPE_INT16, "I16", "int16"),
    torch.int32: (tensor_pb2.DTYPE_INT32, "I32", "int32"),
    torch.int64: (tensor_pb2.DTYPE_INT64, "I64", "int64"),
    torch.bool: (tensor_pb2.DTYPE_BOOL, "BOOL", "bool"),
}
_BY_PROTO = {v[0]: k for k, v in _TABLE.items()}
_BY_NAME = {v[2]: k for k, v in _TABLE.items()}
SUPPORTED = ", ".join(v[2] for v in _TABLE.values())


def _check(dtype: torch.dtype, what: str) -> tuple[int, str, str]:
    entry = _TABLE.get(dtype)
    if entry is None:
        raise InvalidArgument(
            f"{what} has dtype {dtype}, which the weight plane does not carry; use one of {SUPPORTED}"
        )
    return entry


def proto_dtype(dtype: torch.dtype, what: str = "tensor") -> int:
    return _check(dtype, what)[0]


def safetensors_code(dtype: torch.dtype, what: str = "tensor") -> str:
    return _check(dtype, what)[1]


def dtype_name(dtype: torch.dtype, what: str = "tensor") -> str:
    """The manifest's name of a dtype ("bfloat16"), as SGLang and vLLM spell it too."""
    return _check(dtype, what)[2]


def from_proto(code: int, what: str = "tensor") -> torch.dtype:
    if code not in _BY_PROTO:
        raise InvalidArgument(f"{what} has unknown DType {code}; the sender must send one of {SUPPORTED}")
    return _BY_PROTO[code]


def from_name(name: str, what: str = "tensor") -> torch.dtype:
    if name not in _BY_NAME:
        raise InvalidArgument(f"{what} has dtype {name!r}; expected one of {SUPPORTED}")
    return _BY_NAME[name]


def nbytes_of(shape: Sequence[int], dtype: torch.dtype) -> int:
    """Byte length of a C-contiguous tensor: prod(shape) * itemsize."""
    return math.prod(shape) * dtype.itemsize


def tensor_spec(name: str, tensor: torch.Tensor) -> tensor_pb2.TensorSpec:
    """The TensorSpec (name, dtype, shape, nbytes) of one weight tensor."""
    shape = list(tensor.shape)
    return tensor_pb2.TensorSpec(
        name=name,
        dtype=proto_dtype(tensor.dtype, f"tensor {name!r}"),
        shape=shape,
        nbytes=nbytes_of(shape, tensor.dtype),
    )


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A uint8 [nbytes] view of a CPU tensor's data (copied first if it is not contiguous)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
