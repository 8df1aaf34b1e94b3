"""Hostile job configs submitted to an operator's scheduler: every infrastructure field (Ray cluster, peer
addresses, channel secrets, engine flags, data generator, paths outside the run root) is refused with
PERMISSION_DENIED naming the field and the operator setting that would allow it, leaving nothing behind; the
operator's `job_permissions` allow exactly what they list; the job runs with the operator's channels."""

from __future__ import annotations

import pytest
import yaml

from meshrl.common.errors import PermissionDenied
from meshrl.scheduler.config import PeerChannels
from meshrl.scheduler.job_permissions import JobPermissions
from meshrl.scheduler.job_policy import JobPolicy
from meshrl.scheduler.jobs import JobManager
from meshrl.scheduler.workflow import builtin_workflow_text

GRPO = builtin_workflow_text("grpo")


def _config(root, **sections) -> str:
    """A job whose model and data lie under `root`/data (a folder the tests' operator lets jobs read)."""
    cfg: dict = {
        "job": {"name": "p"},
        "model": {"path": str(root / "data" / "model")},
        "data": {"train": str(root / "data" / "train.jsonl")},
    }
    for dotted, value in sections.items():
        section, _, key = dotted.partition("__")
        cfg.setdefault(section, {})
        node = cfg[section]
        *parents, leaf = key.split("__")
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return yaml.safe_dump(cfg)


def _manager(root, modules=("meshrl",), **permissions) -> JobManager:
    allowed = JobPermissions(read_roots=[str(root / "data")], **permissions)
    channels = PeerChannels.model_validate({"trainer": {"auth": {"token_file": str(root / "operator.token")}}})
    return JobManager(policy=JobPolicy.operator(list(modules), root / "runs", allowed, channels))


def _refused(jobs: JobManager, root, config: str, field: str, setting: str) -> str:
    with pytest.raises(PermissionDenied) as info:
        jobs.create(GRPO, config, [])
    message = str(info.value)
    assert info.value.field == field and f"'{field}'" in message and setting in message and "Fix:" in message
    assert jobs.jobs == {} and not (root / "runs").exists(), "a refused job left a record or a run folder"
    return message


HOSTILE = [
    ({"services__ray_address": "ray://127.0.0.9:10001"}, "services.ray_address", "job_permissions.ray_addresses"),
    ({"trainer__address": "127.0.0.9:50051"}, "trainer.address", "job_permissions.peer_addresses"),
    ({"rollout__addresses": ["127.0.0.1:50053", "127.0.0.9:1"]}, "rollout.addresses[0]", "peer_addresses"),
    ({"services__databuffer": "127.0.0.9:50052"}, "services.databuffer", "peer_addresses"),
    ({"services__redis_url": "redis://127.0.0.9:6379"}, "services.redis_url", "peer_addresses"),
    ({"rollout__registry__redis_url": "redis://127.0.0.9:6379/1"}, "rollout.registry.redis_url", "peer_addresses"),
    ({"weights__group_address": "0.0.0.0"}, "weights.group_address", "peer_addresses"),
    ({"services__channels__trainer__address": "127.0.0.9:1"}, "services.channels.trainer.address", "peer_addresses"),
    (
        {"services__channels__trainer__auth": {"token_file": "/etc/hostname"}},
        "services.channels.trainer.auth",
        "`channels`",
    ),
    (
        {"services__channels__databuffer__auth": {"token_env": "HOME"}},
        "services.channels.databuffer.auth",
        "`channels`",
    ),
    (
        {"services__channels__rollout__tls": {"ca_file": "/etc/ssl/x.pem"}},
        "services.channels.rollout.tls",
        "`channels`",
    ),
    ({"data__generator": "meshrl.scheduler.rundir:RunDir"}, "data.generator", "job_permissions.data_generators"),
    ({"logging__mlflow_tracking_uri": "http://127.0.0.9:5000"}, "logging.mlflow_tracking_uri", "tracking_uris"),
    ({"logging__tensorboard_dir": "/tmp/elsewhere"}, "logging.tensorboard_dir", "run root"),
    ({"model__path": "/etc"}, "model.path", "job_permissions.read_roots"),
    ({"data__eval": "/etc/passwd"}, "data.eval", "job_permissions.read_roots"),
]


@pytest.mark.parametrize("sections, field, setting", HOSTILE, ids=[h[1] for h in HOSTILE])
def test_an_infrastructure_field_of_a_submitted_job_is_refused(tmp_path, sections, field, setting):
    _refused(_manager(tmp_path), tmp_path, _config(tmp_path, **sections), field, setting)


def test_a_job_building_its_model_or_generating_data_writes_only_inside_the_run_root(tmp_path):
    generator = "examples.countdown.make_data:write_dataset"
    jobs = _manager(tmp_path, ("meshrl", "examples"), data_generators=[generator])
    build = _config(tmp_path, model__build={"layers": 1})  # readable, but the builder would write there
    assert "outside the scheduler's run root" in _refused(jobs, tmp_path, build, "model.path", "run root")
    generated = _config(tmp_path, data__generator=generator)
    _refused(jobs, tmp_path, generated, "data.train", "run root")


@pytest.mark.parametrize(
    "override",
    [
        "engine.vllm.extra_args.host=0.0.0.0",
        "engine.vllm.extra_args.worker_cls=os.system",
        "engine.sglang.extra_args.trust_remote_code=true",
        "engine.sglang.extra_args.enable-custom-logit-processor=1",
        "engine.transformers.attn_implementation=kernels-community/flash-attn",
        "engine.vllm.extra_args=x",
    ],
)
def test_engine_flags_that_bind_load_code_or_trust_remote_code_are_refused(tmp_path, override):
    config = _config(tmp_path, rollout__service_overrides=[override])
    with pytest.raises(PermissionDenied, match="job_permissions.service_overrides") as info:
        _manager(tmp_path).create(GRPO, config, [])
    assert info.value.field == "rollout.service_overrides"


def test_what_the_operator_lists_is_allowed_and_channels_are_the_operators(tmp_path):
    jobs = _manager(
        tmp_path,
        ("meshrl", "examples"),
        ray_addresses=["127.0.0.2:6379"],
        peer_addresses=["127.0.0.2:50051", "redis://127.0.0.2:6379/1"],
        data_generators=["examples.countdown"],
        service_overrides=["engine.vllm.extra_args.enable_lora"],
    )
    config = _config(
        tmp_path,
        services__ray_address="127.0.0.2:6379",
        trainer__address="127.0.0.2:50051",
        rollout__registry__redis_url="redis://127.0.0.2:6379/1",
        rollout__service_overrides=["engine.vllm.extra_args.enable_lora=true", "engine.vllm.extra_args.max_num_seqs=8"],
        data__generator="examples.countdown.make_data:write_dataset",
        data__train=str(tmp_path / "runs" / "data" / "train.jsonl"),
    )
    record = jobs.create(GRPO, config, [], job_id="allowed")
    channels = record.runner.cfg.services.channels
    assert channels.trainer.auth.token_file == str(tmp_path / "operator.token")
    assert channels.databuffer.auth.token_file is None  # the operator's default, not the job's


def test_meshrl_run_trusts_its_own_config(tmp_path):
    local = JobManager(run_root=str(tmp_path / "runs"))
    config = _config(
        tmp_path,
        trainer__address="127.0.0.9:50051",
        services__channels__trainer__auth={"token_file": str(tmp_path / "mine")},
    )
    record = local.create(GRPO, config, [], job_id="local")
    assert record.runner.cfg.services.channels.trainer.auth.token_file == str(tmp_path / "mine")


def test_a_workflows_reward_model_outside_the_readable_folders_is_refused(tmp_path):
    import json

    elsewhere = tmp_path / "elsewhere" / "rm"
    elsewhere.mkdir(parents=True)
    (elsewhere / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForSequenceClassification"]}))
    workflow = yaml.safe_load(GRPO)
    workflow.pop("x-policy-forward", None)
    reward = next(n for n in workflow["nodes"] if n["node_id"] == "reward")
    reward.update(node_type="MODEL_INFERENCE", node_role="REWARD")
    reward["config"] = {"inputs": ["prompt_ids", "response_ids", "answer"], "model_path": str(elsewhere)}
    jobs = _manager(tmp_path)
    with pytest.raises(PermissionDenied, match="job_permissions.read_roots") as info:
        jobs.create(yaml.safe_dump(workflow), _config(tmp_path), [])
    assert "reward model" in info.value.field and jobs.jobs == {}
