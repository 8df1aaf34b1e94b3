"""The loss settings of a train step: `LossConfig` is their one definition (each field, its default and every
rule between them), and `LossSection` is the job config's `algorithm.loss`, the same fields left unset by
default. Torch-free, so the scheduler checks a job's loss with the trainer's own rules when the job is
created (`LossSection`'s validator), and the trainer checks each TrainStep's with the same class.
The objectives themselves are meshrl.trainer.losses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import pydantic

from meshrl.common.config import Settings, StrictModel
from meshrl.common.errors import ConfigError

Field = pydantic.Field

# one_step_off and async train on samples of older weights: a job in those modes that sets neither cap (and
# takes pi_old from no rollout) gets these (bench/async: without a correction they fall behind sync).
ASYNC_TIS_CAP = 2.0
ASYNC_MIS_CAP = 4.0
# ... and, unless they set is_level, one weight per response (the product of its tokens' ratios), which measured
# better than a weight per token there (bench/async/README.md)
ASYNC_IS_LEVEL = "sequence"


class LossConfig(Settings):
    """The objective of one train step, and the one definition of every loss setting and its default
    (PPO/GRPO with symmetric clip 0.2, token-mean). The trainer's config (`defaults.loss`), the
    `meshrl.trainer.v1.LossConfig` message and the job config's `algorithm.loss` carry these fields.

    A job that leaves a field unset gets the default below, except two that depend on the job
    (meshrl.scheduler.step.scoring.old_logprobs, meshrl.scheduler.config.JobConfig):
    - old_logprobs: 'recompute' when the workflow has an actor old-log-prob node, else 'rollout' in sync mode
      without tis_cap / mis_cap, else 'in-train';
    - tis_cap / mis_cap in one_step_off and async modes (old_logprobs not 'rollout', neither cap set):
      ASYNC_TIS_CAP and ASYNC_MIS_CAP, and is_level (when unset) ASYNC_IS_LEVEL. lag_lr_scale stays off unless
      set (bench/async/README.md: it helped in one process and cost accuracy through the services).
    """

    section: ClassVar[str] = "loss"

    policy_loss: Literal["ppo", "gspo", "sft", "value"] = Field(
        "ppo", description="ppo, gspo, sft or value (the critic's loss)"
    )
    clip_low: float = Field(0.2, ge=0, lt=1, description="eps_low: ratio clipped below at 1 - clip_low")
    clip_high: float = Field(0.2, ge=0, description="eps_high: ratio clipped above at 1 + clip_high (unset: clip_low)")
    dual_clip: float = Field(
        0.0, ge=0, description="a number > 1 bounding negative-advantage tokens' loss at -c * A, or 0 (off)"
    )
    aggregation: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="weight of KL(actor || reference) in the loss (needs ref_logprobs); a job's gae and "
        "reinforce_pp advantages put it in the reward instead",
    )
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    entropy_coef: float = Field(0.0, ge=0, description="entropy bonus weight (loss -= coef * entropy)")
    tis_cap: float = Field(0.0, ge=0, description="truncated importance sampling cap vs. rollout log-probs; 0 = off")
    mis_cap: float = Field(
        0.0,
        ge=0,
        description="masked importance sampling: tokens whose pi_old / pi_rollout exceeds it leave the loss; "
        "0 = off (with tis_cap too: weights truncated at tis_cap, tokens above mis_cap masked)",
    )
    lag_lr_scale: float = Field(
        0.0,
        ge=0,
        description="step size scaled by staleness: each optimizer step's learning rate times 1 / (1 + c * lag), "
        "lag the mean version lag of its mini-batch's tokens (the trainer's weight version minus "
        "response_versions), c this value; 0 = off",
    )
    is_level: Literal["token", "sequence"] = Field(
        "token",
        description="what one tis_cap / mis_cap weight covers: 'token' weighs each token by its own pi_old / "
        "pi_rollout; 'sequence' weighs every token of a sequence by the product of its tokens' ratios (the "
        "weight of the whole response, which also counts how the tokens after it changed), truncated and masked "
        "as one",
    )
    value_clip: float = Field(0.2, ge=0, description="critic: clip of value updates around the old values; 0 = off")
    old_logprobs: Literal["recompute", "rollout", "in-train", "interpolated"] = Field(
        "recompute",
        description="pi_old of the ratio: 'recompute' reads old_logprobs (a trainer forward pass before the "
        "update, written by a workflow node); 'in-train' computes the same pass inside the train call, before "
        "its first update, so no column travels; 'rollout' reads the engine's own rollout_logprobs and needs no "
        "pass (exact when the engine's numerics are the trainer's; on stale samples the clip then bounds "
        "pi / pi_behaviour and no importance weight can correct them); 'interpolated' needs no pass either: "
        "log pi_old = log pi_rollout + a * (log pi - log pi_rollout) per token, a = lag / (lag + 1) with lag the "
        "trainer's weight version minus the token's (AReaL's proximal approximation; the rollout's own "
        "log-probs on fresh tokens)",
    )

    @pydantic.model_validator(mode="before")
    @classmethod
    def _symmetric_by_default(cls, data: Any) -> Any:
        """clip_high follows clip_low unless it is given."""
        if isinstance(data, dict) and data.get("clip_high") is None and data.get("clip_low") is not None:
            return {**data, "clip_high": data["clip_low"]}
        return data

    @pydantic.field_validator("dual_clip")
    @classmethod
    def _dual_clip_above_one(cls, value: float) -> float:
        if value and value <= 1.0:
            raise ValueError("dual_clip must exceed 1 (use e.g. 3.0, or 0 to disable)")
        return value

    @pydantic.model_validator(mode="after")
    def _corrections_need_two_policies(self) -> LossConfig:
        if self.old_logprobs == "rollout" and (self.tis_cap or self.mis_cap):
            raise ValueError(
                "tis_cap / mis_cap weigh pi_old against pi_rollout, and old_logprobs = 'rollout' makes them the "
                "same policy (every weight 1): set tis_cap and mis_cap to 0, or old_logprobs: recompute"
            )
        return self

    def over(self, fields: Mapping[str, Any]) -> LossConfig:
        """Like `Settings.over`; a new clip_low without a clip_high keeps the clip symmetric."""
        base = self.model_dump(exclude={"clip_high"} if "clip_low" in fields else set())
        return LossConfig(**{**base, **fields})


def check_loss(fields: Mapping[str, Any], section: str) -> LossConfig:
    """`fields` (the set ones) over the defaults, checked by every rule of `LossConfig`; a ConfigError names
    `<section>.<field>` (e.g. algorithm.loss.dual_clip)."""
    try:
        return LossConfig(**fields)
    except ConfigError as exc:  # named after LossConfig.section
        field = section + (exc.field or "").removeprefix(LossConfig.section)
        raise ConfigError(field, exc.value, exc.problem, exc.fix) from None


class _Unset(StrictModel):
    """Every field of `LossConfig`, None (unset: its default) unless given; checked by its rules as a whole."""

    @pydantic.model_validator(mode="after")
    def _checked_by_loss_config(self) -> _Unset:
        check_loss(self.set_fields(), "algorithm.loss")
        return self

    def set_fields(self) -> dict[str, Any]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


def _unset_by_default(name: str, doc: str) -> type[_Unset]:
    fields = {
        key: (info.annotation | None, Field(None, description=info.description))
        for key, info in LossConfig.model_fields.items()
    }
    return pydantic.create_model(name, __base__=_Unset, __doc__=doc, __module__=__name__, **fields)


LossSection = _unset_by_default(
    "LossSection",
    "The job's `algorithm.loss`, sent as `meshrl.trainer.v1.LossConfig`: a field left out is left unset in "
    "the request (the trainer's default, `LossConfig`'s unless its operator changed it); the values set are "
    "checked by `LossConfig`'s rules when the job is created.",
)
