"""Every loss rule has one definition (meshrl.common.loss_config.LossConfig) and a job meets it when it is
created: a bad algorithm.loss fails JobManager.create with the trainer's own message, naming the field, before
any service starts (it used to reach the first TrainStep, after the warm-up, for dual_clip)."""

from __future__ import annotations

import pytest

from meshrl.common.errors import ConfigError
from meshrl.common.loss_config import LossConfig, LossSection
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.workflow import builtin_workflow_text

# One bad value per rule: each field's own bounds and choices, then the rules between fields.
BAD = [
    ({"clip_low": 1.0}, "clip_low"),
    ({"clip_high": -0.1}, "clip_high"),
    ({"dual_clip": 1.0}, "dual_clip"),
    ({"dual_clip": -1.0}, "dual_clip"),
    ({"kl_coef": -0.1}, "kl_coef"),
    ({"entropy_coef": -0.1}, "entropy_coef"),
    ({"tis_cap": -1.0}, "tis_cap"),
    ({"mis_cap": -1.0}, "mis_cap"),
    ({"value_clip": -1.0}, "value_clip"),
    ({"aggregation": "mean"}, "aggregation"),
    ({"kl_estimator": "k4"}, "kl_estimator"),
    ({"old_logprobs": "cached"}, "old_logprobs"),
    ({"policy_loss": "dpo"}, "policy_loss"),
    ({"old_logprobs": "rollout", "tis_cap": 2.0}, ""),
    ({"old_logprobs": "rollout", "mis_cap": 4.0}, ""),
]


def _job(loss: dict) -> str:
    lines = "".join(f"    {k}: {v}\n" for k, v in loss.items())
    return f"model: {{path: no-model}}\ndata: {{train: no-data.jsonl}}\nalgorithm:\n  loss:\n{lines}"


@pytest.mark.parametrize(("loss", "field"), BAD, ids=[f"{'+'.join(b)}={list(b.values())[-1]}" for b, _ in BAD])
def test_a_bad_loss_setting_fails_when_the_job_is_created_with_the_trainers_message(tmp_path, loss, field):
    with pytest.raises(ConfigError) as trainer:  # the trainer's check of a TrainStep: the same definition
        LossConfig(**loss)
    with pytest.raises(ConfigError) as created:
        JobManager().create(builtin_workflow_text("grpo"), _job(loss), [f"job.run_root={tmp_path}"])
    assert created.value.field == "algorithm.loss" + (f".{field}" if field else "")
    assert created.value.problem == trainer.value.problem
    assert not list(tmp_path.iterdir())  # refused before a run folder (or a service) existed


def test_the_job_config_declares_no_loss_rule_of_its_own():
    """algorithm.loss is LossConfig's fields left unset; its only validator hands the set ones to LossConfig."""
    assert set(LossSection.model_fields) == set(LossConfig.model_fields)
    decorators = LossSection.__pydantic_decorators__
    assert not decorators.field_validators
    assert list(decorators.model_validators) == ["_checked_by_loss_config"]
    assert all(f.default is None and not f.metadata for f in LossSection.model_fields.values())
    assert LossSection(dual_clip=3.0, clip_low=0.1).set_fields() == {"dual_clip": 3.0, "clip_low": 0.1}
