"""`meshrl plan`: the rendered table and diagrams, JSON output, and its error messages."""

from __future__ import annotations

import io
import json

from meshrl.scheduler.planning.apportion import ClusterSpec, WorkerSlot
from meshrl.scheduler.planning.plan_cli import plan_main
from meshrl.scheduler.planning.plan_render import format_workers, render_plan
from meshrl.scheduler.planning.planner import Placement, PlanOptions, plan_workflow
from meshrl.scheduler.workflow import load_builtin


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = plan_main(list(argv), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_format_workers():
    c = ClusterSpec(2, 4)
    assert format_workers([c.slot(i) for i in (0, 1, 2, 4, 7)]) == "n0:0-2 n1:0 n1:3"
    assert format_workers([WorkerSlot(5, 1, 1)]) == "n1:1" and format_workers([]) == "-"


def test_render_grpo_disaggregated():
    options = PlanOptions(placement=Placement.DISAGGREGATED, param_counts={"actor": "1B", "reference": "1B"})
    text = render_plan(plan_workflow(load_builtin("grpo"), ClusterSpec(2, 4), options))
    lines = text.splitlines()
    assert lines[0] == (
        "Plan for workflow 'grpo': 2 node(s) x 4 GPU = 8 workers, placement disaggregated, strategy param_aware"
    )
    # the DAG diagram: the three branches after the rollout sit side by side on level 2
    level2 = next(i for i, line in enumerate(lines) if line.startswith("  L2"))
    assert "| reward  [s1]" in lines[level2 + 1] and "| old_logprob  [s2]" in lines[level2 + 1]
    assert "| ref_logprob  [s3]" in lines[level2 + 1] and "<- rollout" in lines[level2 + 3]
    assert "| <- advantage, old_logprob, ref_logprob |" in text
    # subgraph table, split reasons, groups
    assert "  s1  reward -> advantage   s0          scheduler (CPU)" in lines
    assert "  - paths from 'rollout' (reward, old_logprob, ref_logprob) reconverge at actor_train" in lines
    assert any(line.startswith("  actor+reference ") and "n0:0-3" in line and "s2, s3, s4" in line for line in lines)
    # device map
    device_map = lines[lines.index("Devices (GPU; letter = worker group, '.' = idle)") :]
    assert device_map[1:6] == [
        "  device  0 1 2 3",
        "  node 0  B B B B",
        "  node 1  A A A A",
        "  A = rollout",
        "  B = actor+reference",
    ]


def test_plan_main_colocated_on_cpu_slots():
    code, out, err = run("rloo", "--nodes", "1", "--cpus-per-node", "2", "--placement", "colocated")
    assert code == 0 and err == ""
    assert "1 node(s) x 2 CPU = 2 workers, placement colocated" in out
    assert "  node 0  A A" in out and "gloo (shares a device)" in out


def test_plan_main_json_and_options(tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text("rollout:\n  n: 8\n")
    code, out, _ = run(
        "ppo",
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--placement",
        "disaggregated",
        "--param-counts",
        "actor=1B",
        "critic=1B",
        "--param-counts",
        "reference=1B",
        "--cost",
        "rollout=4",
        "--config",
        str(config),
        "--set",
        "job.steps=3",
        "--json",
    )
    assert code == 0
    data = json.loads(out)
    assert {g["group_id"]: g["workers"] for g in data["groups"]} == {
        "rollout": [6, 7],
        "critic+actor+reference": [0, 1, 2, 3, 4, 5],
    }


def test_plan_main_errors():
    code, out, err = run("grop")
    assert code == 2 and out == "" and "did you mean 'grpo'?" in err
    code, _, err = run("grpo", "--param-counts", "actor")
    assert code == 2 and "'actor' is not NAME=VALUE" in err
    code, _, err = run("grpo", "--cost", "decode=2")
    assert code == 2 and "unknown node kind" in err
    code, _, err = run("grpo", "--nodes", "1", "--gpus-per-node", "1", "--placement", "disaggregated")
    assert code == 2 and "need at least 2 workers" in err


def test_plan_main_workflow_file_with_user_function(tmp_path, kit, user_module):
    mod = user_module("def keep(batch, config):\n    return batch\n")
    nodes = kit.chain()
    nodes.append(kit.node("custom", "COMPUTE", "DEFAULT", ("advantage",), executable_ref=f"{mod}:keep"))
    path = tmp_path / "wf.yaml"
    path.write_text(kit.as_yaml(nodes))
    code, _, err = run(str(path))
    assert code == 2 and "outside the allowed modules" in err
    code, out, _ = run(str(path), "--allow-module", mod, "--gpus-per-node", "2")
    assert code == 0 and "custom" in out
