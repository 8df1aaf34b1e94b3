"""The zero-RPC half of the direct data path (meshrl.common.direct_path): a whole-batch put of at most
`embed_max_bytes` is one Redis round trip (the payload staged by SET, then the service's PUT script by
EVALSHA, which checks and commits it as a relayed put would, renaming it to the batch's value key), and a
whole-batch get is one round trip (one MULTI: the manifest, that value, and the service's COUNT_READ script
that counts the get for GetStats; the value is read off the socket into the caller's numpy buffer:
meshrl.common.resp_read); no service RPC on either. Redis copies such a payload neither on the way
in nor out (a hash field or a Lua string would cost about a millisecond per MiB here). The service owns the scripts and the key layout (DescribeDirectPath's
`zero_rpc`, meshrl.databuffer.zero_rpc_scripts); this client checks the header with the service's own checks
(meshrl.common.put_checks) and, when Redis lost the scripts (NOSCRIPT), describes the path again, which makes
the service load them.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import redis
from redis.exceptions import NoScriptError

from meshrl.api.common.v1 import keys_pb2, tensor_pb2
from meshrl.api.databuffer.v1 import databuffer_pb2 as pb
from meshrl.common.batch_key import BatchRef
from meshrl.common.errors import Aborted, AlreadyExists, DataLoss, InvalidArgument
from meshrl.common.put_checks import budget_exceeded, check_put_header, row_count
from meshrl.common.resp_read import execute_raw

_FIELD = re.compile(r"\$(job|step|node|shard|gen|index)")
_MANIFEST_FIELDS = ("gen", "n", "cb", "bytes", "h", "v")


def fill(template: str, key: keys_pb2.BatchKey, gen: str = "", index: int = 0) -> str:
    """`template` with $job, $step, $node, $shard ('-': none), $gen and $index replaced (names hold no '$')."""
    values = {
        "job": key.job_id,
        "step": str(key.step),
        "node": key.node_id,
        "shard": str(key.shard) if key.has_shard else "-",
        "gen": gen,
        "index": str(index),
    }
    return _FIELD.sub(lambda m: values[m.group(1)], template)


class ZeroRpc:
    """Puts and gets whole batches on the service's scripts and keys (`layout`); `describe` fetches the layout
    again (the service reloads its scripts then)."""

    def __init__(self, client: redis.Redis, layout: pb.DescribeDirectPathResponse, describe: Callable[[], Any]) -> None:
        self.client = client
        self.layout = layout.zero_rpc
        self.chunk_bytes = int(layout.chunk_bytes)
        self.max_batch_bytes = int(layout.max_batch_bytes)
        self.staging_ms = int(layout.staging_ttl_ms)
        self.embed_max_bytes = int(layout.zero_rpc.embed_max_bytes)
        self._chunk_template = layout.chunk_key_template
        self._describe = describe

    def _reload(self) -> None:
        self.layout = self._describe().zero_rpc

    def put(
        self,
        key: keys_pb2.BatchKey,
        header: tensor_pb2.BatchHeader,
        views: Sequence[memoryview],
        *,
        ttl_seconds: int = 0,
        overwrite: bool = True,
    ) -> int:
        """Stores the batch (at most embed_max_bytes) atomically in one round trip; returns its bytes."""
        z = self.layout
        blob, ttl = check_put_header(
            header,
            ttl_seconds,
            max_header_bytes=z.max_header_bytes,
            max_batch_bytes=self.max_batch_bytes,
            max_ttl_seconds=z.max_ttl_seconds,
            default_ttl_seconds=z.default_ttl_seconds,
        )
        ref = BatchRef.from_proto(key)
        gen, total = secrets.token_hex(8), header.total_bytes
        staging = fill(z.staging_key_template, key, gen)
        payload = views[0] if len(views) == 1 else b"".join(views)  # one tensor: sent without a copy
        call = self._put_call(key, ref, gen, total, blob, ttl, overwrite, row_count(header))
        staged, reply = execute_raw(
            self.client, [("SET", staging, payload, "PX", self.staging_ms), ("EVALSHA", z.put_sha, *call)]
        )
        if isinstance(staged, Exception):
            raise staged
        if isinstance(reply, NoScriptError):  # Redis restarted or flushed its scripts: the service loads them
            self._reload()
            reply = self.client.evalsha(self.layout.put_sha, *call)
        elif isinstance(reply, Exception):
            raise reply
        self._check(ref, [bytes(x).decode() for x in reply], total + len(blob))
        return total

    def _put_call(
        self,
        key: keys_pb2.BatchKey,
        ref: BatchRef,
        gen: str,
        total: int,
        blob: bytes,
        ttl: int,
        overwrite: bool,
        rows: int,
    ) -> list[Any]:
        """numkeys, KEYS and ARGV of the PUT script (meshrl.databuffer.zero_rpc_scripts)."""
        z = self.layout
        keys = [*z.ledger_keys, fill(z.manifest_key_template, key), fill(z.staging_key_template, key, gen)]
        keys += [fill(z.job_batches_key_template, key), z.jobs_key, fill(z.value_key_template, key)]
        ttl_ms = ttl * 1000
        args = [_now_ms(), z.budget_max_bytes, z.budget_max_entries, fill(z.batch_tag_template, key), gen, total, blob]
        args += [ttl_ms, z.overwrite_grace_ms, z.ttl_margin_ms, int(overwrite), self.chunk_bytes, rows]
        args += [z.commit_channel, ref.index_member(), ref.step, ref.job_id]
        return [len(keys), *keys, *args]

    def _check(self, ref: BatchRef, reply: list[str], need: int) -> None:
        """Raises the error a refused PUT script means (it left nothing behind)."""
        status, a, b = reply
        if status == "ok":
            return
        if status == "exists":
            raise AlreadyExists(f"batch {ref} already exists; put with overwrite=True or delete it first")
        if status == "budget":
            z = self.layout
            raise budget_exceeded(f"batch {ref}", need, 1, int(a), int(b), z.budget_max_bytes, z.budget_max_entries)
        if status in ("samegen", "reused"):
            raise InvalidArgument(f"batch {ref}: generation {a} is already counted; use a fresh random generation")
        raise Aborted(f"batch {ref}: the staged payload was {status} ({a} {b}) at commit (evicted?); retry the put")

    def get(
        self, key: keys_pb2.BatchKey
    ) -> tuple[tensor_pb2.BatchHeader, bytearray | np.ndarray] | pb.LocateBatchResponse | None:
        """(header, payload) of the batch in one round trip; where its payload lies when it is in chunks (read
        them with DirectPath.read); None when it is not there (ask the service: it waits, or says NOT_FOUND).
        Counted in GetStats."""
        z = self.layout
        manifest = fill(z.manifest_key_template, key)
        commands = [("MULTI",), ("HMGET", manifest, *_MANIFEST_FIELDS), ("GET", fill(z.value_key_template, key))]
        commands += [("EVALSHA", z.count_read_sha, 2, manifest, z.read_stats_key), ("EXEC",)]
        replies = execute_raw(self.client, commands)  # the value lands in a numpy buffer, uncopied
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply  # MULTI or a command refused at queueing: nothing ran
        fields, value, counted = replies[-1]
        if isinstance(fields, Exception) or isinstance(value, Exception):
            raise fields if isinstance(fields, Exception) else value
        if isinstance(counted, NoScriptError):
            self._reload()
            self.client.evalsha(self.layout.count_read_sha, 2, manifest, self.layout.read_stats_key)
        elif isinstance(counted, Exception):
            raise counted
        gen, n, cb, total, blob, kept = fields
        if gen is None:
            return None
        header = tensor_pb2.BatchHeader.FromString(bytes(blob))
        gen = bytes(gen)
        if kept == b"1":  # a zero-RPC put's: the payload is `value`
            if value is None or len(value) != int(total):
                got = "no" if value is None else len(value)
                raise DataLoss(f"{manifest} announces {total} bytes, its value key holds {got}; was it evicted?")
            return header, value if isinstance(value, np.ndarray) else bytearray(value)  # writable, as elsewhere
        n, cb, total = int(n), int(cb), int(total)
        sizes = [cb] * (n - 1) + [total - cb * (n - 1)] if n else []
        located = pb.LocateBatchResponse(header=header, manifest_key=manifest, generation=gen.decode())
        for i, size in enumerate(sizes):
            located.ranges.add(key=fill(self._chunk_template, key, gen.decode(), i), first=0, last=size - 1, whole=True)
        return located


def _now_ms() -> int:
    return int(time.time() * 1000)
