"""The trainer layout of the job config against the workflow's trainer nodes (`launch.trainer_layout`)."""

import pytest

from meshrl.common.errors import ConfigError
from meshrl.scheduler.config import TrainerSection
from meshrl.scheduler.launch.trainer_layout import check_trainer_layout
from meshrl.scheduler.workflow import load_builtin, load_workflow_data


def workflow(**actor_config):
    data = load_builtin("grpo").model_dump(mode="json")
    for node in data["nodes"]:
        if node["node_id"] == "rollout":
            node["config"]["tensor_parallel_size"] = 4  # engines: not the trainer's business
        if node["node_id"] == "actor_train":
            node["config"].update(actor_config)
    return load_workflow_data(data)


def test_nodes_that_agree_or_say_nothing_pass():
    check_trainer_layout(workflow(), TrainerSection(tensor_parallel=2))
    check_trainer_layout(workflow(tensor_parallel_size=2, pipeline_parallel_size=1), TrainerSection(tensor_parallel=2))


def test_a_disagreeing_trainer_node_is_refused_with_the_fix():
    with pytest.raises(ConfigError) as err:
        check_trainer_layout(workflow(pipeline_parallel_size=2), TrainerSection(tensor_parallel=2))
    message = str(err.value)
    assert "trainer.pipeline_parallel" in message and "'actor_train'" in message and "pipeline_parallel=2" in message


def test_meshrl_plan_shows_the_trainer_layout_of_the_job_config(tmp_path):
    import io
    import json

    from meshrl.scheduler.planning.plan_cli import plan_main

    config = tmp_path / "job.yaml"
    config.write_text("trainer:\n  tensor_parallel: 2\n")
    out = io.StringIO()
    assert plan_main(["grpo", "--config", str(config), "--nodes", "1", "--gpus-per-node", "4", "--json"], out) == 0
    models = {m["key"]: m for m in json.loads(out.getvalue())["models"]}
    assert models["actor"]["tensor_parallel"] == 2 and models["rollout"]["tensor_parallel"] == 1
