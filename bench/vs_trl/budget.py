"""What both trainers of the side-by-side harness share: the budget (steps, batch, peak learning rates,
samples per prompt, lengths, evaluation cadence) and the curve type every phase returns. Used by
bench/vs_trl/run.py, meshrl_side.py and trl_side.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path


@dataclass
class Budget:
    sft_steps: int | None = None  # None: the task's own (Task.sft_steps), stopped early so RL starts mid-range
    sft_batch: int = 32
    sft_lr: float = 3e-3
    rl_steps: int = 300
    prompts_per_step: int = 8  # x n samples = 64 samples per RL step (one optimizer step)
    n: int = 8
    rl_lr: float | None = None  # None: the task's own (Task.rl_lr), where TRL's GRPO gains held out
    temperature: float = 1.0  # rollout sampling temperature of both sides (held-out evaluation is greedy)
    max_tokens: int = 10
    sft_eval_every: int = 30
    rl_eval_every: int = 25
    n_train: int = 4000
    n_eval: int = 128
    seed: int = 0
    trl_threads: int = 1  # torch threads of the TRL process (2 stalled 10x on this loaded 2-core machine)
    # the model both sides start from (meshrl.trainer.model_builder)
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2

    @classmethod
    def full(cls) -> Budget:
        """The issue's budget: 2,000 RL steps of 64 samples after the same short warm-up."""
        return cls(rl_steps=2000, rl_eval_every=100, n_eval=256)

    def for_task(self, task_sft_steps: int, task_rl_lr: float = 1e-4) -> Budget:
        """This budget with the task's warm-up length and RL learning rate where none was asked for."""
        return replace(self, sft_steps=self.sft_steps or task_sft_steps, rl_lr=self.rl_lr or task_rl_lr)

    @property
    def rl_samples_per_step(self) -> int:
        return self.prompts_per_step * self.n

    def to_dict(self) -> dict:
        return asdict(self)

    def build_model(self, folder: Path) -> Path:
        """The model both sides start from, built into `folder` unless it is there already."""
        if not (folder / "config.json").exists():
            from meshrl.trainer.model_builder import build_small_model

            build_small_model(
                folder,
                arch="qwen2",
                hidden_size=self.hidden_size,
                num_layers=self.num_layers,
                num_heads=self.num_heads,
                num_kv_heads=self.num_kv_heads,
                seed=self.seed,
            )
        return folder


@dataclass
class Curve:
    """Held-out greedy accuracy (and mean partial-credit reward) against training samples and training
    seconds (evaluation time excluded)."""

    side: str  # "meshrl" | "trl"
    phase: str  # "sft" | "rl-own" | "rl-common"
    samples: list[int] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)  # held-out mean reward of the greedy answers
    extra: dict = field(default_factory=dict)  # held-out loss curve, process wall time, ...

    def add(self, samples: int, seconds: float, accuracy: float, reward: float | None = None) -> None:
        self.samples.append(int(samples))
        self.seconds.append(float(seconds))
        self.accuracy.append(float(accuracy))
        if reward is not None:
            self.reward.append(float(reward))

    @property
    def gain(self) -> float:
        return self.accuracy[-1] - self.accuracy[0] if self.accuracy else float("nan")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Curve:
        return cls(**d)
