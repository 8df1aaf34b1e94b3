"""A MODEL_INFERENCE node of role REWARD: the trainer's reward model scores each sample, and the node writes
the reward column, optionally mixed with a rule reward.

Node config: `model_path` (a Hugging Face sequence-classifier folder with one label, loaded by the trainer
as its `reward` role when the job starts), `score_weight` (default 1) and `rule_weight` (default 0; the rule is
the job's `algorithm.reward`, run as a REWARD node runs it): rewards = score_weight * score + rule_weight * rule.
Checked when the job is created (`reward_model_problems`, called by `step/dag/dispatch.py`); loaded by the runner
(`load_reward_model`); run by `NodeHandlers.reward_model`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pydantic

from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.config import StrictModel
from meshrl.scheduler.workflow import NodeRole, NodeType, Problem
from meshrl.scheduler.workflow.model import Node

REWARD_MODEL_KEYS = frozenset({"model_path", "score_weight", "rule_weight"})


class RewardModelConfig(StrictModel):
    model_path: str = pydantic.Field(min_length=1, description="HF sequence-classifier folder (one label)")
    score_weight: float = 1.0
    rule_weight: float = 0.0

    @pydantic.field_validator("score_weight", "rule_weight")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @property
    def path(self) -> str:
        return str(Path(self.model_path).expanduser().resolve())


def is_reward_model(node: Node) -> bool:
    return node.node_type == NodeType.MODEL_INFERENCE and node.node_role == NodeRole.REWARD


def node_settings(node: Node) -> RewardModelConfig:
    """The node's reward-model settings (its config without the declarations every node may carry)."""
    return RewardModelConfig(**{k: v for k, v in node.config.items() if k in REWARD_MODEL_KEYS})


def reward_model_problems(nodes: list[Any]) -> list[Problem]:
    """What would stop the reward-model nodes of a workflow from running: a missing or unreadable model_path,
    a bad weight, or two nodes naming different models (the trainer holds one reward model)."""
    problems: list[Problem] = []
    paths: dict[str, str] = {}
    for node in filter(is_reward_model, nodes):
        try:
            cfg = node_settings(node)
        except pydantic.ValidationError as err:
            for e in err.errors():
                field = ".".join(str(p) for p in e["loc"])
                problems.append(
                    Problem(
                        f"config.{field}: {e['msg']}",
                        "set config.model_path to a Hugging Face "
                        "sequence-classifier folder; score_weight and rule_weight are numbers",
                        node.node_id,
                        f"config.{field}",
                    )
                )
            continue
        if not (Path(cfg.path) / "config.json").is_file():
            problems.append(
                Problem(
                    f"config.model_path {cfg.model_path!r} has no config.json",
                    "point it at a Hugging Face sequence-classifier folder (config.json + safetensors, num_labels 1)",
                    node.node_id,
                    "config.model_path",
                )
            )
        paths[node.node_id] = cfg.path
    if len(set(paths.values())) > 1:
        first, *_ = paths
        problems.append(
            Problem(
                f"reward-model nodes name different models {sorted(set(paths.values()))}",
                "the trainer holds one reward model: give every MODEL_INFERENCE/REWARD node the same config.model_path",
                first,
                "config.model_path",
            )
        )
    return problems


def reward_model_path(nodes: list[Any]) -> str | None:
    """The reward model the job's trainer loads (None: the workflow has no reward-model node)."""
    found = [node_settings(n).path for n in nodes if is_reward_model(n)]
    return found[0] if found else None


def load_reward_model(trainer, nodes: list[Any], dtype: str, seed: int) -> None:
    """Loads the workflow's reward model into the trainer's `reward` role (frozen; nothing to checkpoint)."""
    path = reward_model_path(nodes)
    if path is not None:
        trainer.load_model("reward", path, dtype, None, seed)


def combine(scores: np.ndarray, rule: np.ndarray | None, cfg: RewardModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """(rewards, accuracy) float32 [N]: the weighted sum; accuracy from the rule when one is mixed in, else
    rewards >= 1 as for any reward node."""
    rewards = cfg.score_weight * scores.astype(np.float64)
    if rule is not None:
        rewards = rewards + cfg.rule_weight * rule
    correct = (rule if rule is not None else rewards) >= 1.0
    return rewards.astype(np.float32), correct.astype(np.float32)


def score_node(handlers, node: Node, ctx) -> tuple[list, dict[str, float]]:
    """Runs one reward-model node: the trainer scores the rows into a scratch batch of the step, the node reads
    the scores back, mixes in the rule and writes (rewards, accuracy, rm_scores) under its own key."""
    cfg = node_settings(node)
    reads = handlers._reads(node, ctx)
    scratch = batch_key(ctx.job_id, ctx.step, f"{node.node_id}.scores")  # deleted with the step
    reply = handlers.trainer.compute_scores(reads.keys, scratch, S.RM_SCORES, columns=reads.columns)
    scores = np.asarray(handlers.buffer.get_many([scratch], columns=[S.RM_SCORES])[S.RM_SCORES], dtype=np.float32)
    rule, failed = (None, 0)
    if cfg.rule_weight:
        _, rule, failed = handlers.rule_rewards(node, ctx, also=[S.ANSWER])
    rewards, correct = combine(scores, rule, cfg)
    key = handlers._key(ctx, node)
    handlers.buffer.put(key, {S.REWARDS: rewards, S.ACCURACY: correct, S.RM_SCORES: scores})
    metrics = {f"{node.node_id}/{k}": v for k, v in reply.metrics.items()}
    rows = len(scores)
    metrics.update(
        {
            "reward/mean": float(rewards.mean()) if rows else 0.0,
            "reward/std": float(rewards.std()) if rows else 0.0,
            "reward/accuracy": float(correct.mean()) if rows else 0.0,
            "reward/model_score_mean": float(scores.mean()) if rows else 0.0,
            "reward/failed_groups": float(failed),
        }
    )
    if rule is not None:
        metrics["reward/rule_mean"] = float(rule.mean()) if rows else 0.0
    return [key], metrics
