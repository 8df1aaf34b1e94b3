"""The checks of a batch put that both sides run: the data buffer service on every relayed put and commit
(meshrl.databuffer.batches), and a client on its zero-RPC direct put (meshrl.common.zero_rpc), so the two paths
refuse the same headers with the same messages. Also the budget refusal's message, and a batch's row count.
"""

from __future__ import annotations

from meshrl.api.common.v1 import tensor_pb2
from meshrl.common.codec import validate_header
from meshrl.common.errors import InvalidArgument, ResourceExhausted


def check_put_header(
    header: tensor_pb2.BatchHeader,
    ttl_seconds: int,
    *,
    max_header_bytes: int,
    max_batch_bytes: int,
    max_ttl_seconds: int,
    default_ttl_seconds: int,
) -> tuple[bytes, int]:
    """Validates what a put announces; returns the serialized header and the TTL in seconds."""
    size = header.ByteSize()
    if size > max_header_bytes:
        raise InvalidArgument(
            f"start.header is {size} bytes, over limits.max_header_bytes = {max_header_bytes}; "
            "move per-sample data out of samples/attrs into tensors",
            field="start.header",
        )
    try:
        validate_header(header)
    except InvalidArgument as exc:
        raise InvalidArgument(f"start.header.{exc.message}", field="start.header") from None
    if header.total_bytes > max_batch_bytes:
        raise InvalidArgument(
            f"start.header.total_bytes = {header.total_bytes} exceeds limits.max_batch_bytes = "
            f"{max_batch_bytes}; split the batch into shards",
            field="start.header.total_bytes",
        )
    if ttl_seconds < 0 or ttl_seconds > max_ttl_seconds:
        raise InvalidArgument(
            f"start.ttl_seconds = {ttl_seconds} must be in [0, {max_ttl_seconds}] (0: the default "
            f"{default_ttl_seconds}s)",
            field="start.ttl_seconds",
        )
    return header.SerializeToString(), ttl_seconds or default_ttl_seconds


def row_count(header: tensor_pb2.BatchHeader) -> int:
    """Rows of a stored batch: its first tensor's (every tensor has the same), else its samples."""
    if not header.tensors:
        return len(header.samples)
    spec = header.tensors[0]
    return len(spec.offsets) - 1 if spec.ragged else (spec.shape[0] if spec.shape else 1)


def budget_exceeded(
    what: str, need: int, count: int, used: int, entries: int, max_bytes: int, max_entries: int
) -> ResourceExhausted:
    """The refusal of a reservation of `need` bytes in `count` entries while `used` bytes in `entries` are held."""
    return ResourceExhausted(
        f"data buffer budget exceeded: {what} needs {need} bytes in {count} entries, while "
        f"{used} of budget.max_bytes = {max_bytes} bytes and {entries} of budget.max_entries = "
        f"{max_entries} entries are held; consume and ack stream groups, delete finished batches "
        "(delete_job), or raise the budget"
    )
