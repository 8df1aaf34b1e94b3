"""Which bytes of a stored batch a GetBatch asks for: some columns, some rows.

`select(header, columns, rows, missing_ok)` checks the request against the stored header and returns the
header to send (the chosen tensors cut to the rows, ragged offsets rebased to 0, the rows' samples) and
the byte spans of the stored payload that hold them, in send order. Pure: called by `BatchStore.open`
(meshrl.databuffer.batches), tested on its own.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from meshrl.api.common.v1 import tensor_pb2
from meshrl.common.codec import NUMPY_BY_DTYPE
from meshrl.common.errors import InvalidArgument, NotFound
from meshrl.common.put_checks import row_count


@dataclass(frozen=True)
class Selection:
    header: tensor_pb2.BatchHeader  # what the reader gets
    spans: list[tuple[int, int]]  # (offset, length) into the stored payload, in send order
    rows: int  # rows sent
    whole: bool  # the selection is the whole stored batch (read it chunk by chunk)


def select(
    header: tensor_pb2.BatchHeader,
    columns: Sequence[str] = (),
    rows: tuple[int, int] | None = None,
    *,
    missing_ok: bool = False,
    what: str = "the batch",
) -> Selection:
    """The reply header and payload spans for `columns` (empty: all) of rows [begin, end) (None: all)."""
    total_rows = row_count(header)
    begin, end = (0, total_rows) if rows is None else rows
    if not 0 <= begin <= end <= total_rows:
        raise InvalidArgument(
            f"rows = [{begin}, {end}) is outside {what}, which has {total_rows} rows; give 0 <= begin <= end <= "
            f"{total_rows}",
            field="rows",
        )
    by_name: dict[str, tuple[int, tensor_pb2.TensorSpec]] = {}
    pos = 0
    for spec in header.tensors:
        by_name[spec.name] = (pos, spec)
        pos += spec.nbytes
    if len(set(columns)) != len(columns):
        raise InvalidArgument(f"columns = {list(columns)} names a column twice; name each once", field="columns")
    missing = [c for c in columns if c not in by_name]
    if missing and not missing_ok:
        raise NotFound(f"{what} has no column {missing} (it holds {sorted(by_name)}); read one of those")
    names = [c for c in columns if c in by_name] if columns else list(by_name)
    whole = names == list(by_name) and (begin, end) == (0, total_rows)
    if whole:
        return Selection(header, [(0, header.total_bytes)], total_rows, True)
    out = tensor_pb2.BatchHeader(attrs=dict(header.attrs))
    if header.samples:
        out.samples.extend(header.samples[begin:end])
    spans: list[tuple[int, int]] = []
    for name in names:
        start, spec = by_name[name]
        cut = out.tensors.add(name=spec.name, dtype=spec.dtype, ragged=spec.ragged)
        inner = math.prod(spec.shape[1:]) * NUMPY_BY_DTYPE[spec.dtype].itemsize if spec.shape else 0
        if spec.ragged:
            first, last = spec.offsets[begin], spec.offsets[end]
            cut.offsets.extend(o - first for o in spec.offsets[begin : end + 1])
        elif spec.shape:
            first, last = begin, end
        else:  # a scalar tensor: one row, whole or nothing
            first, last, inner = 0, 0, spec.nbytes
            if end > begin:
                last = 1
        if spec.shape:
            cut.shape.extend([last - first, *spec.shape[1:]])
        cut.nbytes = (last - first) * inner
        if cut.nbytes:
            spans.append((start + first * inner, cut.nbytes))
    out.total_bytes = sum(length for _, length in spans)
    return Selection(out, spans, end - begin, False)


def chunk_pieces(spans: Sequence[tuple[int, int]], chunk_bytes: int) -> list[tuple[int, int, int]]:
    """The spans as (chunk index, first byte, last byte inclusive) pieces of chunks of `chunk_bytes`."""
    pieces = []
    for offset, length in spans:
        pos, stop = offset, offset + length
        while pos < stop:
            index, inside = divmod(pos, chunk_bytes)
            take = min(stop - pos, chunk_bytes - inside)
            pieces.append((index, inside, inside + take - 1))
            pos += take
    return pieces


class ReadCounter:
    """Reads served since the process started (GetStats reports them): calls, payload bytes and rows sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.calls = self.bytes = self.rows = 0

    def count(self, nbytes: int, rows: int) -> None:
        with self._lock:
            self.calls += 1
            self.bytes += nbytes
            self.rows += rows
