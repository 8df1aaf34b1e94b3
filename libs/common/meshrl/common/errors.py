"""Typed errors shared by every meshrl service and client.

Core modules raise these; the one server interceptor (`meshrl.common.grpc_server`) maps
them to gRPC status codes, and `from_rpc_error` turns a status back into the same type on
the client side. Messages say what was wrong and how to fix it.
"""

from __future__ import annotations

import reprlib

import grpc

# gRPC sends a status message percent-encoded in a trailer, and a client refuses trailers past its metadata
# limit (8 KiB by default), hiding the real error: messages are capped well below that (UTF-8 bytes; each
# non-ASCII byte becomes three characters on the wire).
MAX_MESSAGE_BYTES = 2000
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 2, 120, 120, 60
_REPR.maxdict = _REPR.maxlist = _REPR.maxtuple = _REPR.maxset = 6


def short_repr(value: object) -> str:
    """repr() bounded in size and depth, whatever the value (a huge or alias-shared structure included)."""
    text = _REPR.repr(value)
    return text if len(text) <= 300 else text[:297] + "..."


def cap_message(text: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """`text` cut to at most `limit` UTF-8 bytes, keeping its start (the error) and its end (the last frame)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    cut = f" [... {len(data) - limit} bytes cut ...] "
    head = (limit - len(cut)) * 3 // 4
    tail = limit - len(cut) - head
    return data[:head].decode("utf-8", "ignore") + cut + data[-tail:].decode("utf-8", "ignore")


# A machine-readable reason travels beside the status (trailing metadata under this key), so a caller can act
# on one kind of error without matching its message. The reasons services set:
REASON_KEY = "meshrl-reason"
MODEL_NOT_LOADED = "model-not-loaded"  # the trainer holds no model for the role (restarted: it lost its state)


class MeshrlError(Exception):
    """Base class: an error with a gRPC status code. Unknown failures map to INTERNAL. `reason` (optional,
    one of the reasons above) tells callers what kind of error it is without matching the message."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, *, field: str | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.reason = reason

    def __str__(self) -> str:
        return self.message


class InvalidArgument(MeshrlError):
    """Bad input: a wrong dtype, shape, key, config value, workflow... (INVALID_ARGUMENT)."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(MeshrlError):
    """Something named by the caller is not there (NOT_FOUND)."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(MeshrlError):
    code = grpc.StatusCode.ALREADY_EXISTS


class ResourceExhausted(MeshrlError):
    """A budget (memory, entries, message size) would be exceeded (RESOURCE_EXHAUSTED)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(MeshrlError):
    """The system is not in a state that allows the call, e.g. no model loaded (FAILED_PRECONDITION)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(MeshrlError):
    """A peer is down or unreachable; callers retry within their deadline (UNAVAILABLE)."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(MeshrlError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Aborted(MeshrlError):
    """The operation was aborted, e.g. a request cancelled by a pause in abort mode (ABORTED)."""

    code = grpc.StatusCode.ABORTED


class Cancelled(MeshrlError):
    code = grpc.StatusCode.CANCELLED


class Unauthenticated(MeshrlError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(MeshrlError):
    code = grpc.StatusCode.PERMISSION_DENIED


class DataLoss(MeshrlError):
    """Stored data is corrupt (checksum mismatch, truncated file) (DATA_LOSS)."""

    code = grpc.StatusCode.DATA_LOSS


class Internal(MeshrlError):
    code = grpc.StatusCode.INTERNAL


class ConfigError(InvalidArgument):
    """A configuration value is wrong. The message names the field, the bad value and the fix."""

    def __init__(self, field: str, value: object, problem: str, fix: str) -> None:
        super().__init__(f"config field '{field}' = {short_repr(value)}: {problem}. Fix: {fix}", field=field)
        self.value = value
        self.problem = problem
        self.fix = fix


_BY_CODE: dict[grpc.StatusCode, type[MeshrlError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        ResourceExhausted,
        FailedPrecondition,
        Unavailable,
        DeadlineExceeded,
        Aborted,
        Cancelled,
        Unauthenticated,
        PermissionDenied,
        DataLoss,
        Internal,
    )
}


# What grpc gives a call that was in flight when its own client closed the channel (grpc/_channel.py): no
# server cancelled it; the peer is gone as far as the caller is concerned (see `from_rpc_error`).
CHANNEL_CLOSED = "Channel closed!"


def from_rpc_error(error: grpc.RpcError) -> MeshrlError:
    """Turns a failed call's status back into the typed error the server raised. A call cut off because its
    client closed the channel (a launched service died and the scheduler dropped its calls, or the client is
    shutting down) is `Unavailable`: the peer went away, which the job's recovery restarts."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else str(error)
    if code == grpc.StatusCode.CANCELLED and details == CHANNEL_CLOSED:
        return Unavailable(
            "the call was cut off: its client closed the channel (the peer's process exited, "
            "or the client is shutting down)"
        )
    cls = _BY_CODE.get(code, Internal)
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    reason = next((str(v) for k, v in trailers or () if k == REASON_KEY), "")
    return cls(details or code.name, reason=reason)
