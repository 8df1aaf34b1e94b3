"""One owner per setting: the trainer defines each loss and optimizer setting and its default; the proto and
the job config carry the same fields; a non-default value set in a job config reaches the trainer's settings
as sent (a set zero stays zero), and an unset one takes the trainer's default."""

from __future__ import annotations

import typing

import pytest

from meshrl.api.trainer.v1 import trainer_pb2 as tpb
from meshrl.common.errors import InvalidArgument
from meshrl.common.proto_settings import enum_names, settings_from_proto
from meshrl.scheduler.clients import loss_proto, optimizer_proto
from meshrl.scheduler.config import LossSection, OptimSection
from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.losses import LossConfig
from meshrl.trainer.optim import OptimizerConfig
from meshrl.trainer.server import loss_settings, optimizer_settings

PAIRS = [(tpb.LossConfig, LossSection, LossConfig), (tpb.OptimizerConfig, OptimSection, OptimizerConfig)]

# A value unlike the default for every setting; zeros where zero means "off" (the old proto read them as unset).
LOSS_VALUES = {
    "policy_loss": "gspo",
    "clip_low": 0.1,
    "clip_high": 0.28,
    "dual_clip": 3.0,
    "aggregation": "seq-mean-token-sum",
    "kl_coef": 0.05,
    "kl_estimator": "k1",
    "entropy_coef": 0.01,
    "tis_cap": 2.0,
    "value_clip": 0.0,
    "mis_cap": 5.0,
    "old_logprobs": "rollout",
}
OPTIM_VALUES = {
    "lr": 3e-4,
    "min_lr": 1e-5,
    "weight_decay": 0.1,
    "adam_beta1": 0.8,
    "adam_beta2": 0.95,
    "adam_eps": 1e-6,
    "clip_grad": 0.0,
    "warmup_steps": 7,
    "decay_steps": 40,
    "decay_style": "cosine",
}


@pytest.mark.parametrize(("proto", "job", "trainer"), PAIRS, ids=["loss", "optimizer"])
def test_proto_job_config_and_trainer_have_the_same_fields(proto, job, trainer):
    assert set(proto.DESCRIPTOR.fields_by_name) == set(job.model_fields) == set(trainer.model_fields)


@pytest.mark.parametrize(("proto", "job", "trainer"), PAIRS, ids=["loss", "optimizer"])
def test_every_choice_is_an_enum_value_of_the_proto(proto, job, trainer):
    for field in proto.DESCRIPTOR.fields:
        if field.enum_type is None:
            assert proto.DESCRIPTOR.fields_by_name[field.name].has_presence, f"{field.name} carries no presence"
            continue
        names = set(enum_names(field.enum_type))
        assert set(typing.get_args(trainer.model_fields[field.name].annotation)) == names
        job_choices = {a for a in typing.get_args(job.model_fields[field.name].annotation) if a is not type(None)}
        (literal,) = job_choices
        assert set(typing.get_args(literal)) <= names


def test_the_job_config_holds_no_default_of_its_own():
    assert all(v is None for v in LossSection().model_dump().values())
    assert all(v is None for v in OptimSection().model_dump().values())
    assert settings_from_proto(loss_proto(LossSection().model_dump())) == {}
    assert settings_from_proto(optimizer_proto(OptimSection())) == {}


def test_the_trainer_service_defaults_are_the_settings_defaults():
    defaults = TrainerConfig().defaults
    assert defaults.loss == LossConfig() and defaults.optimizer == OptimizerConfig()


@pytest.mark.parametrize(("name", "value"), LOSS_VALUES.items())
def test_each_loss_setting_reaches_the_trainer(name, value):
    section = LossSection(**{name: value})
    default = LossConfig()
    assert getattr(default, name) != value, "pick a value unlike the default"
    got = loss_settings(loss_proto(section.model_dump()), "actor", default)
    assert got[name] == value
    untouched = {k: v for k, v in got.items() if k != name and not (name == "clip_low" and k == "clip_high")}
    assert untouched == {k: v for k, v in default.model_dump().items() if k in untouched}


@pytest.mark.parametrize(("name", "value"), OPTIM_VALUES.items())
def test_each_optimizer_setting_reaches_the_trainer(name, value):
    section = OptimSection(**{name: value})
    default = OptimizerConfig()
    assert getattr(default, name) != value, "pick a value unlike the default"
    assert optimizer_settings(optimizer_proto(section), default)[name] == value


def test_a_new_clip_low_keeps_the_clip_symmetric_unless_clip_high_is_set():
    got = loss_settings(loss_proto({"clip_low": 0.1}), "actor", LossConfig())
    assert got["clip_high"] == 0.1
    got = loss_settings(loss_proto({"clip_low": 0.1, "clip_high": 0.3}), "actor", LossConfig())
    assert got["clip_high"] == 0.3


def test_the_critic_defaults_to_the_value_loss():
    assert loss_settings(loss_proto({"value_clip": 0.5}), "critic", LossConfig())["policy_loss"] == "value"


def test_an_unknown_choice_is_refused_with_the_known_ones():
    with pytest.raises(InvalidArgument, match="did you mean 'token-mean'"):
        loss_proto({"aggregation": "tokenmean"})
