"""A prompt batch in domain terms (GenerateBatch): which rows to generate, the requests built from them, and the
sample rows and metadata written back to the data buffer (see batch_schema). Used by replica.RolloutReplica."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from meshrl.api.common.v1 import keys_pb2, tensor_pb2
from meshrl.common import batch_schema as S
from meshrl.common.codec import Batch, Ragged
from meshrl.rollout.types import GenerationRequest, GenerationResult, SamplingParams


@dataclass
class BatchJob:
    """GenerateBatch in domain terms: prompts [row_begin, row_end) of `input`, n samples each."""

    input: keys_pb2.BatchKey
    output: keys_pb2.BatchKey
    sampling: SamplingParams
    n: int = 1
    job_id: str = ""
    step: int = 0
    row_begin: int = 0
    row_end: int = 0  # both 0 = every prompt
    columns: tuple[str, ...] = ()  # input columns copied into each sample row (prompt_ids always read); () = all
    alive: Callable[[], bool] | None = None  # False once the caller cancelled or its deadline passed


@dataclass
class BatchStats:
    samples: int
    prompt_tokens: int
    generated_tokens: int
    seconds: float
    min_weight_version: int
    max_weight_version: int


def sample_seed(seed: int | None, row: int, index: int) -> int | None:
    """A distinct, reproducible seed per (prompt row, sample index), independent of how rows are split."""
    if seed is None:
        return None
    return (int(seed) * 1_000_003 + row * 7919 + index) & 0x7FFF_FFFF_FFFF_FFFF


def batch_requests(job: BatchJob, prompts: Ragged, rows: list[int]) -> list[GenerationRequest]:
    """`job.n` requests per prompt row, each with its own seed; `prompts` holds only rows [row_begin, row_end)."""
    return [
        GenerationRequest(
            prompt_ids=prompts.row(row - job.row_begin).tolist(),
            sampling=job.sampling.with_seed(sample_seed(job.sampling.seed, row, k)),
            request_id=f"{job.job_id}/{job.step}/{row}/{k}",
        )
        for row in rows
        for k in range(job.n)
    ]


def batch_output(
    batch: Batch, job: BatchJob, rows: list[int], results: list[GenerationResult]
) -> tuple[dict[str, object], list[tensor_pb2.SampleMeta]]:
    """One row per sample: the prompt row's columns, the response, its log-probs and weight versions; and the
    samples' metadata (group = prompt row)."""
    source_rows = [row for row in rows for _ in range(job.n)]
    local = [row - job.row_begin for row in source_rows]  # `batch` holds only rows [row_begin, row_end)
    out: dict[str, object] = dict(batch.take(local).columns)  # prompt_ids, answer, ... per sample
    out[S.RESPONSE_IDS] = Ragged.from_rows([r.token_ids for r in results], dtype=np.int32)
    out[S.ROLLOUT_LOGPROBS] = Ragged.from_rows([r.logprobs for r in results], dtype=np.float32)
    out[S.RESPONSE_VERSIONS] = Ragged.from_rows([r.weight_versions for r in results], dtype=np.int32)
    out[S.GROUP_INDEX] = np.asarray(source_rows, dtype=np.int64)
    samples = []
    for i, (row, result) in enumerate(zip(source_rows, results)):
        group_id = f"{job.job_id}/{job.step}/{row}"
        samples.append(
            tensor_pb2.SampleMeta(
                job_id=job.job_id,
                step=job.step,
                group_id=group_id,
                index_in_group=i % job.n,
                weight_version=result.min_version,
                max_weight_version=result.max_version,
                finish_reason=int(result.finish_reason),
                sample_id=f"{group_id}/{i % job.n}",
            )
        )
    return out, samples


def batch_stats(results: list[GenerationResult], seconds: float) -> BatchStats:
    return BatchStats(
        samples=len(results),
        prompt_tokens=sum(len(r.prompt_ids) for r in results),
        generated_tokens=sum(len(r.token_ids) for r in results),
        seconds=seconds,
        min_weight_version=min((r.min_version for r in results), default=0),
        max_weight_version=max((r.max_version for r in results), default=0),
    )
