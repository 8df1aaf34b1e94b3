"""Names: the checked domain key of a batch (`BatchRef`) and the Redis key layout (`KeySpace`).

Every Redis key carries a hash tag (`{...}`) so that what one script touches lives on one
Redis Cluster shard: a batch's manifest and chunks share `{prefix:b:job:step:node:shard}`,
a stream and its metadata share `{prefix:s:job:stream}`, the budget ledger has its own tag.
Used by the batch store, the stream store and the servicer (proto <-> BatchRef).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshrl.common.batch_key import BatchRef, check_name

__all__ = ["BatchRef", "KeySpace", "check_name"]


@dataclass(frozen=True)
class KeySpace:
    """The Redis key layout under one prefix."""

    prefix: str

    # --- batches -------------------------------------------------------------------
    def batch_tag(self, ref: BatchRef) -> str:
        shard = "-" if ref.shard is None else str(ref.shard)
        return f"{self.prefix}:b:{ref.job_id}:{ref.step}:{ref.node_id}:{shard}"

    def manifest(self, ref: BatchRef) -> str:
        return "{" + self.batch_tag(ref) + "}:m"

    def chunk(self, ref: BatchRef, gen: str, index: int) -> str:
        return "{" + self.batch_tag(ref) + f"}}:c:{gen}:{index}"

    def chunk_template(self) -> str:
        """`chunk` with $job, $step, $node, $shard ('-': none), $gen and $index left to fill (the direct data
        path's clients fill it; names hold no '$')."""
        return "{" + f"{self.prefix}:b:$job:$step:$node:$shard" + "}:c:$gen:$index"

    def templates(self) -> dict[str, str]:
        """The batch tag, manifest, staged value, value and job index keys with $job, $step, $node, $shard and $gen left
        to fill, as `chunk_template` (the zero-RPC path's clients fill them)."""
        tag = f"{self.prefix}:b:$job:$step:$node:$shard"
        return {
            "batch_tag": tag,
            "manifest": "{" + tag + "}:m",
            "staging": "{" + tag + "}:s:$gen",
            "value": "{" + tag + "}:v",
            "job_batches": "{" + f"{self.prefix}:j:$job" + "}:batches",
        }

    def read_stats(self) -> str:
        """The hash counting zero-RPC gets (calls, bytes, rows): GetStats adds it to its own counts."""
        return "{" + f"{self.prefix}:stats" + "}:reads"

    def chunks(self, ref: BatchRef, gen: str, count: int) -> list[str]:
        return [self.chunk(ref, gen, i) for i in range(count)]

    def batch_member(self, ref: BatchRef, gen: str) -> str:
        """The budget-ledger entry of one stored generation of a batch."""
        return f"b:{self.batch_tag(ref)}:{gen}"

    # --- per-job indexes -------------------------------------------------------------
    def job_batches(self, job_id: str) -> str:
        return "{" + f"{self.prefix}:j:{job_id}" + "}:batches"

    def job_streams(self, job_id: str) -> str:
        return "{" + f"{self.prefix}:j:{job_id}" + "}:streams"

    def jobs(self) -> str:
        return "{" + f"{self.prefix}:jobs" + "}"

    # --- streams ---------------------------------------------------------------------
    def stream(self, job_id: str, stream: str) -> str:
        return "{" + f"{self.prefix}:s:{job_id}:{stream}" + "}:x"

    def stream_meta(self, job_id: str, stream: str) -> str:
        return "{" + f"{self.prefix}:s:{job_id}:{stream}" + "}:m"

    # --- budget ledger and notifications ------------------------------------------------
    def ledger(self) -> list[str]:
        tag = "{" + f"{self.prefix}:ledger" + "}"
        return [f"{tag}:exp", f"{tag}:size", f"{tag}:tot"]

    def commit_channel(self) -> str:
        return f"{self.prefix}:commits"
