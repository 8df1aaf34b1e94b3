"""Every example's job config and workflow load and validate (the GPU ones included, which cannot run here)."""

from pathlib import Path

import pytest

from meshrl.scheduler.jobs import build_job_config
from meshrl.scheduler.workflow import builtin_workflow_text, load_workflow_text

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = sorted((ROOT / "examples").glob("*/config*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_example_config_and_workflow_validate(path):
    cfg, raw = build_job_config(path.read_text(), [])
    workflow_file = path.parent / "workflow.yaml"
    text = workflow_file.read_text() if workflow_file.exists() else builtin_workflow_text("grpo")
    workflow = load_workflow_text(text, raw, allowed_modules=cfg.job.allowed_modules)
    assert workflow.nodes and cfg.job.steps > 0


def test_the_default_example_is_the_one_make_run_uses():
    makefile = (ROOT / "Makefile").read_text()
    assert "examples/countdown/workflow.yaml" in makefile
    assert len(CONFIGS) >= 3
