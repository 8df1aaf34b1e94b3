"""Reads back a W&B offline run (`run-<id>.wandb`, the transaction log `wandb sync` uploads): the
file is LevelDB's log format (32 KiB blocks of framed chunks) after a 7-byte W&B header, each record
a `wandb_internal_pb2.Record`. wandb 0.31 ships no Python reader (its core is in Go), so the
tracker test reads the framing here, and the records with wandb's own protobuf classes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768
CHUNK_HEADER = 7  # crc32c (4), length (2, little endian), type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> list[bytes]:
    assert data[:4] == b":W&B", "not a W&B transaction log"
    pos, pending, out = 7, b"", []
    while pos + CHUNK_HEADER <= len(data):
        if BLOCK - pos % BLOCK < CHUNK_HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        length, kind = struct.unpack_from("<HB", data, pos + 4)
        body = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == FULL:
            out.append(body)
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        elif kind == LAST:
            out.append(pending + body)
            pending = b""
        else:
            break  # zero padding at the end of the file
    return out


def read_run(folder: Path) -> dict:
    """{"history": [{key: value, "_step": n}, ...], "config": {key: value}} of one offline run folder."""
    from wandb.proto import wandb_internal_pb2 as pb

    (log_file,) = folder.glob("run-*.wandb")
    history, config = [], {}
    for payload in _payloads(log_file.read_bytes()):
        record = pb.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            history.append(items)
        elif kind in ("run", "config"):
            update = record.run.config.update if kind == "run" else record.config.update
            config.update({i.key: json.loads(i.value_json) for i in update})
    return {"history": history, "config": config}
