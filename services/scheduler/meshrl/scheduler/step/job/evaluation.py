"""Held-out evaluation: greedy generation on the eval prompts through the rollout fleet,
scored by the job's reward; run before RL (step 0), every K steps and at the end.
"""

from __future__ import annotations

import numpy as np

from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Ragged
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.scheduler.fleet.rollout_fleet import RolloutFleet
from meshrl.scheduler.step.prompts.data import PromptEncoder, Record
from meshrl.scheduler.step.scoring.rewards import RewardFn, score


def evaluate(
    job_id: str,
    step: int,
    records: list[Record],
    encoder: PromptEncoder,
    buffer: DataBufferClient,
    fleet: RolloutFleet,
    reward_fn: RewardFn,
    max_tokens: int,
) -> dict[str, float]:
    key = batch_key(job_id, step, "eval_prompts")
    prompt_ids = [encoder.encode_prompt(r.prompt) for r in records]
    buffer.put(key, {S.PROMPT_IDS: Ragged.from_rows(prompt_ids, dtype=np.int32)})
    keys, metrics = fleet.generate(
        key,
        job_id=job_id,
        step=step,
        node_id="eval",
        n=1,
        temperature=0.0,
        top_p=1.0,
        max_tokens=max_tokens,
        num_prompts=len(records),  # known here: the router need not read the batch to count it
    )
    batch = buffer.get_many(keys, columns=[S.RESPONSE_IDS])  # all this reads
    responses = [encoder.decode(batch[S.RESPONSE_IDS].row(i)) for i in range(batch.num_rows())]
    rewards = np.asarray(
        score(reward_fn, [r.prompt for r in records], responses, [r.answer for r in records]), dtype=np.float64
    )
    for k in [key, *keys]:
        buffer.delete(k)
    return {
        "eval/accuracy": float((rewards >= 1.0).mean()),
        "eval/reward_mean": float(rewards.mean()),
        "eval/response_length": float(batch[S.RESPONSE_IDS].lengths().mean()),
        "eval/prompts": float(len(records)),
        "eval/seconds": metrics.get("rollout/seconds", 0.0),
    }
