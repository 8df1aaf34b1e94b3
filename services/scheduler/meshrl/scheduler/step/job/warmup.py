"""The supervised warm-up: a job phase that trains the actor on (prompt, response) pairs before RL.

A real supervised trainer over the trainer service: batches of `warmup.batch_size` pairs drawn in seeded
epochs (`steps`, or `epochs` over the training set), a learning rate per step from `LrSchedule` (linear ramp
over `ramp_ratio` of the steps, then constant / linear / cosine decay) sent as the step's `lr_override`,
loss on response tokens only (the trainer scores only response tokens, so prompt tokens are masked), the
held-out loss (mean negative log-likelihood per response token of the eval pairs) every `eval_every` steps and
at the end, held-out accuracy every `eval_accuracy_every` steps (the job's greedy evaluation on weights the
runner publishes first, passed in as `evaluate`), and a hand-over to RL: `fresh` reloads the actor from its
own warmed weights with a new optimizer (Adam moments and step count zeroed, so RL's own lr schedule starts at
its first step), `keep` carries the optimizer state over. `steps_per_call` consecutive steps go to the trainer
as one call (their batches stored as one, each step with its own rate: TrainStep's `step_lrs`), cut where an
evaluation is due, so a small step does not pay a call's fixed cost. The next call's batches are encoded and
stored while the trainer runs the current call (in the order the sampler draws them), and used ones are
deleted off the critical path.
Called by `meshrl.scheduler.step.job.runner.JobRunner`; writes `warmup.jsonl` in the run folder.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Ragged
from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.step.job.lr_schedule import LrSchedule
from meshrl.scheduler.step.prompts.data import PromptEncoder, PromptSampler, Record, load_records


@dataclass
class WarmupResult:
    steps: int
    train_loss: float = float("nan")
    heldout_loss: float | None = None
    curve: list[dict[str, float]] = field(default_factory=list)


def warmup_steps(cfg: Any, n_records: int) -> int:
    """`warmup.steps`, or `warmup.epochs` passes over the training set in batches of `warmup.batch_size`."""
    if cfg.steps and cfg.epochs:
        raise InvalidArgument(
            f"warmup.steps = {cfg.steps} and warmup.epochs = {cfg.epochs} are both set; set one of them"
        )
    if cfg.epochs:
        return max(1, math.ceil(cfg.epochs * n_records / cfg.batch_size))
    return cfg.steps


def call_plan(cfg: Any, steps: int) -> list[range]:
    """The steps of each trainer call: at most `steps_per_call`, and a call ends after a step that is followed
    by a held-out evaluation (every `eval_every` / `eval_accuracy_every` steps)."""
    plan, first = [], 0
    for i in range(steps):
        due = any(every and (i + 1) % every == 0 for every in (cfg.eval_every, cfg.eval_accuracy_every))
        if due or i + 1 - first == cfg.steps_per_call or i == steps - 1:
            plan.append(range(first, i + 1))
            first = i + 1
    return plan


def schedule_for(cfg: Any, steps: int) -> LrSchedule:
    return LrSchedule(
        peak=cfg.lr,
        total_steps=max(steps, 1),
        warmup_steps=round(cfg.ramp_ratio * steps),
        decay=cfg.schedule,
        min_lr=cfg.min_lr,
    )


class SupervisedWarmup:
    """Runs the phase; `trainer` is a TrainerClient, `buffer` a DataBufferClient (the same calls)."""

    def __init__(
        self,
        job_id: str,
        cfg: Any,
        trainer: Any,
        buffer: Any,
        encoder: PromptEncoder,
        *,
        micro_batch_tokens: int,
        shuffle_seed: int,
        log: Callable[[str], None] = print,
        evaluate: Callable[[], dict[str, float]] | None = None,
    ) -> None:
        self.job_id, self.cfg, self.trainer, self.buffer, self.encoder = job_id, cfg, trainer, buffer, encoder
        self.evaluate = evaluate  # held-out accuracy of the actor as it is now (eval_accuracy_every)
        self.micro_batch_tokens = micro_batch_tokens
        self.shuffle_seed = shuffle_seed
        self.log = log

    def _put_pairs(self, key, records: list[Record]) -> None:
        targets = [r.response if r.response is not None else r.answer for r in records]
        self.buffer.put(
            key,
            {
                S.PROMPT_IDS: Ragged.from_rows([self.encoder.encode_prompt(r.prompt) for r in records], dtype=np.int32),
                S.RESPONSE_IDS: Ragged.from_rows([self.encoder.encode_response(t) for t in targets], dtype=np.int32),
            },
        )

    def heldout_loss(self, records: list[Record], step: int) -> float:
        """Mean negative log-likelihood per response token of the held-out pairs under the actor."""
        key, out = batch_key(self.job_id, step, "warmup_eval"), batch_key(self.job_id, step, "warmup_eval_logp")
        self._put_pairs(key, records)
        try:
            self.trainer.compute_logprobs("actor", [key], out, S.OLD_LOGPROBS, False)
            logp = self.buffer.get(out)[S.OLD_LOGPROBS].values
            return float(-np.asarray(logp, dtype=np.float64).mean())
        finally:
            self.buffer.delete(key)
            self.buffer.delete(out)

    def run(self, records: list[Record], heldout: list[Record], curve_file: Path | None = None) -> WarmupResult:
        cfg = self.cfg
        steps = warmup_steps(cfg, len(records))
        result = WarmupResult(steps)
        if not steps:
            return result
        schedule, sampler = schedule_for(cfg, steps), PromptSampler(records, self.shuffle_seed + 1)
        calls = call_plan(cfg, steps)
        seconds = 0.0  # training time, held-out loss excluded
        key_of = partial(batch_key, self.job_id, node_id="warmup")  # a call's batches: the key of its first step

        def store(call: range) -> None:
            self._put_pairs(key_of(call[0]), sampler.next_batch(cfg.batch_size * len(call)))

        with ThreadPoolExecutor(1, thread_name_prefix="warmup-batches") as ahead:  # in order: put c+1, delete c
            stored = ahead.submit(store, calls[0])
            pending: int | None = calls[0][0]  # the call whose batches are stored ahead and not yet trained on
            deletes = []
            try:
                for c, call in enumerate(calls):
                    started = time.perf_counter()
                    stored.result()  # call c's batches are in the buffer
                    pending = None
                    if c + 1 < len(calls):
                        stored, pending = ahead.submit(store, calls[c + 1]), calls[c + 1][0]
                    lrs = [schedule.at(i) for i in call]
                    try:
                        losses = self._train(key_of(call[0]), call, lrs)
                    finally:
                        deletes.append(ahead.submit(self.buffer.delete, key_of(call[0])))
                    elapsed = time.perf_counter() - started
                    for j, i in enumerate(call):  # the call's time spread evenly over its steps
                        point_seconds = seconds + elapsed * (j + 1) / len(call)
                        self._record(result, i, steps, lrs[j], point_seconds, losses[j], heldout, curve_file)
                    seconds += elapsed
            finally:
                if pending is not None:  # a failed call: the batches stored ahead of it leave the buffer too
                    ahead.submit(self.buffer.delete, key_of(pending))
        for done in deletes:
            done.result()  # a delete that failed fails the phase, as when it ran in line
        return result

    def _train(self, key: Any, call: range, lrs: list[float]) -> list[float]:
        """One trainer call making the steps of `call` (one per batch_size rows of `key`); each step's loss."""
        sft = {"policy_loss": "sft"}  # the warm-up's objective: NLL of the response tokens
        reply = self.trainer.train_step("actor", [key], sft, self.micro_batch_tokens, len(call), call[0], step_lrs=lrs)
        return list(reply.step_losses)

    def _record(
        self,
        result: WarmupResult,
        i: int,
        steps: int,
        lr: float,
        seconds: float,
        loss: float,
        heldout: list[Record],
        curve_file: Path | None,
    ) -> None:
        """Step i's point on the curve (with the held-out loss every eval_every steps and at the end) and its log."""
        cfg = self.cfg
        result.train_loss = loss
        point = {
            "step": i + 1,
            "samples": (i + 1) * cfg.batch_size,
            "seconds": seconds,
            "lr": lr,
            "loss": result.train_loss,
        }
        last = i == steps - 1
        if heldout and ((cfg.eval_every and (i + 1) % cfg.eval_every == 0) or last):
            point["heldout_loss"] = result.heldout_loss = self.heldout_loss(heldout, i + 1)
        if self.evaluate and cfg.eval_accuracy_every and (i + 1) % cfg.eval_accuracy_every == 0 and not last:
            metrics = self.evaluate()  # the last step's is RL's step-0 evaluation
            point["heldout_accuracy"], point["heldout_reward"] = metrics["eval/accuracy"], metrics["eval/reward_mean"]
        result.curve.append(point)
        if curve_file is not None:
            with curve_file.open("a") as f:
                f.write(json.dumps(point) + "\n")
        if i % 10 == 0 or last or "heldout_loss" in point or "heldout_accuracy" in point:
            held = f", held-out {point['heldout_loss']:.4f}" if "heldout_loss" in point else ""
            held += f", held-out accuracy {point['heldout_accuracy']:.3f}" if "heldout_accuracy" in point else ""
            self.log(f"warm-up {i + 1}/{steps}: lr {lr:.2e}, loss {result.train_loss:.4f}{held}")

    def hand_over(self, model_path: str, dtype: str, optimizer: Any, seed: int) -> None:
        """`fresh`: the actor keeps its warmed weights and gets a new optimizer (RL's schedule at step 0)."""
        if self.cfg.handover == "fresh":
            self.trainer.load_model("actor", model_path, dtype, optimizer, seed, copy_from="actor")


def heldout_pairs(data: Any, limit: int = 256) -> list[Record]:
    """The eval set's (prompt, response) pairs for the held-out loss: [] when it has no `data.response_key`."""
    if not data.eval or not data.response_key:
        return []
    try:
        return load_records(data.eval, data.prompt_key, data.answer_key, data.response_key)[:limit]
    except KeyError:  # eval rows without responses: the accuracy evaluation still runs, the loss is skipped
        return []
