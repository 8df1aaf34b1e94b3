"""The GRPO step of the built-in workflow computed in one process with no services: the reference side of
bench/e2e/run.py (which imports `InProcessLoop` and `LoopSettings` from here).

Same pieces as the service path, called directly: `TrainerCore` (actor + frozen reference, megatron-core),
the transformers rollout engine (`create_engine`), the scheduler's prompt encoder / sampler and reward
function, `meshrl.scheduler.step.scoring.advantages`, and weight publication by disk (`write_version` → the engine's
`update_weights_from_disk` → checksums compared, as `WeightPublisher` does) or, with `weights="memory"`,
by copying the trainer's HF-named tensors straight into the engine's parameters.

Each phase is timed like the scheduler's executor times a node (wall seconds around the call). The
phases run one after another; in the service path old_logprob and ref_logprob are started concurrently
with reward/advantage (the trainer serialises its two forward passes behind one lock).
Threads mirror the services: the engine's batcher thread decodes with `rollout_threads` torch threads
(1, the replica default), the trainer phases run with `trainer_threads` (the trainer process gets one
per core), since torch fixes a thread's intra-op thread count at its first parallel op.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from meshrl.common import batch_schema as S
from meshrl.common.codec import Ragged
from meshrl.common.errors import DataLoss, InvalidArgument
from meshrl.common.weights import write_version
from meshrl.rollout.config import EngineConfig, TransformersEngineConfig
from meshrl.rollout.engine_factory import create_engine
from meshrl.rollout.types import DiskUpdate, GenerationRequest, PauseMode, SamplingParams
from meshrl.scheduler.step.prompts.data import PromptEncoder, PromptSampler, load_records
from meshrl.scheduler.step.scoring import advantages as adv
from meshrl.scheduler.step.scoring.rewards import resolve_reward, score
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.losses import LossConfig
from meshrl.trainer.optim import OptimizerConfig
from meshrl.trainer.publication import MODEL_FILES  # what the trainer service copies beside each version

PHASES = ("data_load", "rollout", "reward", "advantage", "old_logprob", "ref_logprob", "actor_train", "weights")


@dataclass
class LoopSettings:
    """What both sides share; defaults equal the job config's (meshrl.scheduler.config) where one exists."""

    model: str
    train: str
    weights_root: str
    prompts_per_step: int = 8
    n: int = 4
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    lr: float = 1e-3
    clip_grad: float = 1.0
    clip: float = 0.2
    micro_batch_tokens: int = 4096
    max_batch_size: int = 64
    bucket_bytes: int = 512 << 20
    keep_last: int = 2
    shuffle_seed: int = 0
    seed: int = 0
    reward: str = "exact_match"
    weights: str = "disk"  # "disk" | "memory"
    verify_checksums: bool = True
    trainer_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    rollout_threads: int = 1

    def __post_init__(self) -> None:
        if self.weights not in ("disk", "memory"):
            raise InvalidArgument(f"weights = {self.weights!r}: use 'disk' or 'memory'")


class InProcessLoop:
    """One GRPO step per `step()` call; returns {phase: seconds} plus a few counters."""

    def __init__(self, s: LoopSettings) -> None:
        self.s = s
        start = time.perf_counter()
        self.encoder = PromptEncoder(s.model)
        self.sampler = PromptSampler(load_records(s.train, "prompt", "answer"), s.shuffle_seed)
        self.reward_fn = resolve_reward(s.reward)
        self.core = TrainerCore(micro_batch_tokens=s.micro_batch_tokens, temperature=1.0)
        optimizer = OptimizerConfig(lr=s.lr, clip_grad=s.clip_grad)  # the job's optimizer section, as the RPC sends it
        self.core.load_model("actor", s.model, optimizer=optimizer, seed=s.seed)
        self.core.load_model("reference", s.model, seed=s.seed)
        self.loss = LossConfig(policy_loss="ppo", clip_low=s.clip, clip_high=s.clip, aggregation="token-mean")
        cfg = EngineConfig(
            kind="transformers",
            model_path=s.model,
            max_batch_size=s.max_batch_size,
            transformers=TransformersEngineConfig(num_threads=s.rollout_threads),
        )
        self.engine = create_engine(cfg)
        # Fix the batcher thread's torch threads now (set by the engine), then give this thread the trainer's.
        self.engine_threads = self.engine.batcher.run_exclusive(torch.get_num_threads)
        torch.set_num_threads(s.trainer_threads)
        self.extra_files = {n: (Path(s.model) / n).read_bytes() for n in MODEL_FILES if (Path(s.model) / n).is_file()}
        self.version = 0
        self.publish()  # like the job: replicas serve exactly the trainer's weights before step 1
        self.setup_seconds = time.perf_counter() - start

    # -- weights ------------------------------------------------------------------------------------
    def publish(self) -> dict[str, float]:
        """Version + 1 to the engine, then proves it arrived (version and checksums), like WeightPublisher."""
        s, version = self.s, self.version + 1
        t0 = time.perf_counter()
        if s.weights == "disk":
            disk = write_version(
                s.weights_root,
                version,
                self.core.iter_hf_buckets("actor", s.bucket_bytes),
                s.keep_last,
                bucket_bytes=s.bucket_bytes,
                extra_files=self.extra_files,
                overwrite=True,
            )
            t1 = time.perf_counter()
            self.engine.update_weights_from_disk(DiskUpdate(disk.path, version, manifest_sha256=disk.manifest_sha256))
        else:
            tensors = [
                (name, t.detach().clone()) for b in self.core.iter_hf_buckets("actor", s.bucket_bytes) for name, t in b
            ]
            t1 = time.perf_counter()
            self._copy_into_engine(tensors, version)
        t2 = time.perf_counter()
        if s.verify_checksums:
            expected = self.core.checksums("actor")
            served, got = self.engine.weight_checksums(list(expected))
            diff = sorted(k for k in expected if got.get(k) != expected[k])
            if served != version or diff:
                raise DataLoss(f"in-process engine serves v{served} (expected v{version}); differing: {diff[:5]}")
        self.version = version
        t3 = time.perf_counter()
        return {"weights/export": t1 - t0, "weights/load": t2 - t1, "weights/verify": t3 - t2}

    def _copy_into_engine(self, tensors: list[tuple[str, torch.Tensor]], version: int) -> None:
        """The in-memory transport: pause, copy into the live parameters between two decode steps, resume."""
        batcher = self.engine.batcher
        batcher.pause(PauseMode.IN_PLACE, reason="weights")
        try:

            def install() -> None:
                self.engine.receiver.apply(tensors, batcher.version, version)
                batcher.version = version
                batcher.drop_cache()

            batcher.run_exclusive(install)
        finally:
            batcher.resume(reason="weights")

    # -- one step -----------------------------------------------------------------------------------
    def step(self) -> dict[str, float]:
        """One GRPO step; per phase: wall seconds (`<phase>`) and this process's CPU seconds (`cpu/<phase>`)."""
        s, t = self.s, {}
        step_start = time.perf_counter()

        @contextlib.contextmanager
        def phase(name: str):
            wall, cpu = time.perf_counter(), time.process_time()
            yield
            t[name], t[f"cpu/{name}"] = time.perf_counter() - wall, time.process_time() - cpu

        with phase("data_load"):
            records = self.sampler.next_batch(s.prompts_per_step)
            prompts = [self.encoder.encode_prompt(r.prompt) for r in records]
            answers = [r.answer for r in records]

        with phase("rollout"):
            sampling = SamplingParams(temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens)
            requests = [GenerationRequest(prompt_ids=p, sampling=sampling) for p in prompts for _ in range(s.n)]
            results = self.engine.generate(requests)
            groups = np.repeat(np.arange(len(prompts), dtype=np.int64), s.n)
            cols: dict[str, object] = {
                S.PROMPT_IDS: Ragged.from_rows([prompts[g] for g in groups], dtype=np.int32),
                S.RESPONSE_IDS: Ragged.from_rows([r.token_ids for r in results], dtype=np.int32),
                S.ROLLOUT_LOGPROBS: Ragged.from_rows([r.logprobs for r in results], dtype=np.float32),
                S.GROUP_INDEX: groups,
            }

        with phase("reward"):
            rows = len(results)
            texts = [self.encoder.decode(cols[S.PROMPT_IDS].row(i)) for i in range(rows)]
            responses = [self.encoder.decode(cols[S.RESPONSE_IDS].row(i)) for i in range(rows)]
            scores = score(self.reward_fn, texts, responses, [answers[g] for g in groups])
            cols[S.REWARDS] = rewards = np.asarray(scores, np.float32)

        with phase("advantage"):
            offsets = cols[S.RESPONSE_IDS].offsets
            scalar = adv.grpo_advantages(rewards, groups, normalize_std=True)
            cols[S.ADVANTAGES] = Ragged(adv.broadcast_to_tokens(scalar, offsets), offsets)

        with phase("old_logprob"):
            old = self.core.compute_logprobs("actor", cols, with_entropy=True, temperature=1.0)
            cols[S.OLD_LOGPROBS], cols[S.ENTROPY] = old.values, old.entropy

        with phase("ref_logprob"):
            cols[S.REF_LOGPROBS] = self.core.compute_logprobs("reference", cols, temperature=1.0).values

        with phase("actor_train"):
            trained = self.core.train_step("actor", cols, self.loss, micro_batch_tokens=s.micro_batch_tokens)

        with phase("weights"):
            t.update(self.publish())

        t["step"] = time.perf_counter() - step_start
        t["tokens"] = float(cols[S.RESPONSE_IDS].values.size)
        t["reward_mean"] = float(rewards.mean()) if rows else 0.0
        t["loss"] = float(trained.metrics.get("loss", float("nan")))
        return t

    def close(self) -> None:
        self.engine.shutdown()
