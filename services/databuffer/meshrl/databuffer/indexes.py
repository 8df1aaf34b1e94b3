"""Per-job indexes: which batches and streams a job has, and which jobs exist, so that
list / delete_job / stats need no SCAN over the keyspace (which a Redis Cluster splits).

Entries are added before the data is committed (a committed batch is always listed) and
read lazily: a listed batch whose manifest expired is filtered out by the reader. Index
keys carry a TTL that only grows, so an abandoned job's indexes expire with its data.
Used by the batch store, the stream store and `DataBuffer.stats`.
"""

from __future__ import annotations

from typing import Any

from meshrl.databuffer.keys import BatchRef, KeySpace

# KEYS: an index (zset or set). ARGV: kind ('z' | 's'), member, score, ttl_ms. Adds; never shortens the TTL.
_ADD = """
if ARGV[1] == 'z' then redis.call('ZADD', KEYS[1], ARGV[3], ARGV[2]) else redis.call('SADD', KEYS[1], ARGV[2]) end
local left = redis.call('PTTL', KEYS[1])
if left == -1 or (left >= 0 and left < tonumber(ARGV[4])) then redis.call('PEXPIRE', KEYS[1], ARGV[4]) end
return 1
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Indexes:
    def __init__(self, client: Any, keys: KeySpace) -> None:
        self.client = client
        self.keys = keys
        self._add = client.register_script(_ADD)

    def _add_job(self, job_id: str, ttl_ms: int) -> None:
        self._add(keys=[self.keys.jobs()], args=["s", job_id, 0, ttl_ms])

    def add_batch(self, ref: BatchRef, ttl_ms: int) -> None:
        self._add(keys=[self.keys.job_batches(ref.job_id)], args=["z", ref.index_member(), ref.step, ttl_ms])
        self._add_job(ref.job_id, ttl_ms)

    def queue_add_batch(self, pipe: Any, ref: BatchRef, ttl_ms: int) -> None:
        """`add_batch` queued on a pipeline by sha (its execute raises NoScriptError after a Redis restart:
        then call add_batch, which loads the script)."""
        sha = self._add.sha
        pipe.evalsha(sha, 1, self.keys.job_batches(ref.job_id), "z", ref.index_member(), ref.step, ttl_ms)
        pipe.evalsha(sha, 1, self.keys.jobs(), "s", ref.job_id, 0, ttl_ms)

    def remove_batch(self, ref: BatchRef) -> None:
        self.client.zrem(self.keys.job_batches(ref.job_id), ref.index_member())

    def remove_batches(self, refs: list[BatchRef]) -> None:
        """`remove_batch` of each, one round trip per job."""
        by_job: dict[str, list[str]] = {}
        for ref in refs:
            by_job.setdefault(ref.job_id, []).append(ref.index_member())
        for job_id, members in by_job.items():
            self.client.zrem(self.keys.job_batches(job_id), *members)

    def batches(self, job_id: str, step: int = -1) -> list[BatchRef]:
        index = self.keys.job_batches(job_id)
        members = self.client.zrangebyscore(index, step, step) if step >= 0 else self.client.zrange(index, 0, -1)
        return [BatchRef.from_index_member(job_id, m) for m in members]

    def add_stream(self, job_id: str, stream: str, ttl_ms: int) -> None:
        self._add(keys=[self.keys.job_streams(job_id)], args=["s", stream, 0, ttl_ms])
        self._add_job(job_id, ttl_ms)

    def streams(self, job_id: str) -> list[str]:
        return sorted(_text(s) for s in self.client.smembers(self.keys.job_streams(job_id)))

    def jobs(self) -> list[str]:
        return sorted(_text(j) for j in self.client.smembers(self.keys.jobs()))

    def remove_job(self, job_id: str) -> None:
        self.client.delete(self.keys.job_batches(job_id))
        self.client.delete(self.keys.job_streams(job_id))
        self.client.srem(self.keys.jobs(), job_id)
