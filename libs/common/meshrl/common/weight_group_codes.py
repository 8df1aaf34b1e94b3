"""The proto enums of a weight-update group (`CommBackend`, `GroupProtocol`) and their names ("gloo",
"engine"), in both directions. Torch-free: the scheduler, whose own environment has no torch, builds the
groups' messages with it; `meshrl.common.weights.GroupSpec` reads and writes them through it."""

from __future__ import annotations

from meshrl.api.common.v1 import weights_pb2

BACKENDS = {"gloo": weights_pb2.COMM_BACKEND_GLOO, "nccl": weights_pb2.COMM_BACKEND_NCCL}
PROTOCOLS = {"meshrl": weights_pb2.GROUP_PROTOCOL_MESHRL, "engine": weights_pb2.GROUP_PROTOCOL_ENGINE}


def backend_proto(name: str) -> int:
    """The CommBackend of "gloo" / "nccl"; UNSPECIFIED for "" (no group: a disk publication)."""
    return BACKENDS.get(name, weights_pb2.COMM_BACKEND_UNSPECIFIED)


def backend_name(code: int) -> str:
    """ "gloo" for UNSPECIFIED (a group's default); an unknown value stays visible for the caller's check."""
    return _name(BACKENDS, code, "gloo")


def protocol_name(code: int) -> str:
    return _name(PROTOCOLS, code, "meshrl")


def _name(codes: dict[str, int], code: int, unset: str) -> str:
    if code == 0:
        return unset
    return next((name for name, c in codes.items() if c == code), f"<unknown value {code}>")
