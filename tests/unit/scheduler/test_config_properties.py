"""Property tests (hypothesis) of what a user hands the scheduler: job config text and `--set`
overrides, and workflow files. Any of them either loads or is refused with a typed error
(ConfigError / InvalidArgument / WorkflowError, all INVALID_ARGUMENT) -- never another exception."""

from __future__ import annotations

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.jobs import build_job_config
from meshrl.scheduler.workflow import builtin_workflow_text, load_workflow_text

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BASE = {"model": {"path": "m"}, "data": {"train": "t.jsonl"}}
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=6),
    st.lists(st.integers(-3, 3), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
PATHS = st.sampled_from(
    [
        "job.steps",
        "job.name",
        "rollout.n",
        "rollout.temperature",
        "rollout.top_p",
        "rollout.engine",
        "trainer.gpus",
        "trainer.optimizer.lr",
        "algorithm.advantage",
        "algorithm.loss.clip_low",
        "weights.transport",
        "eval.every",
        "logging.backends",
        "logging.wandb_mode",
        "telemetry.exporter",
        "telemetry.sample_ratio",
        "data.prompts_per_step",
        "services.use_ray",
        "model.dtype",
        "nosuch.field",
        "job.nosuch",
        "job",
    ]
)


@SETTINGS
@given(st.dictionaries(PATHS, SCALARS, max_size=3))
def test_any_overrides_load_or_are_refused(values):
    overrides = [f"{path}={yaml.safe_dump(value, default_flow_style=True).strip()}" for path, value in values.items()]
    try:
        build_job_config(yaml.safe_dump(BASE), overrides)
    except InvalidArgument:
        pass


@SETTINGS
@given(st.text(max_size=80))
@example("\x08")  # found by hypothesis: PyYAML's ReaderError escaped as a crash
@example("job: [")
def test_any_config_text_loads_or_is_refused(text):
    try:
        build_job_config(text, [])
    except InvalidArgument:
        pass


GRPO = yaml.safe_load(builtin_workflow_text("grpo"))


@st.composite
def mutated_workflows(draw):
    """The built-in GRPO workflow with a few fields dropped or replaced by arbitrary values."""
    data = yaml.safe_load(yaml.safe_dump(GRPO))
    for _ in range(draw(st.integers(1, 3))):
        target = data
        if draw(st.booleans()) and data.get("nodes"):
            nodes = data["nodes"]
            target = nodes[draw(st.integers(0, len(nodes) - 1))] if isinstance(nodes, list) else data
        if not isinstance(target, dict) or not target:
            break
        key = draw(st.sampled_from(sorted(target)))
        if draw(st.booleans()):
            del target[key]
        else:
            target[key] = draw(SCALARS)
    return yaml.safe_dump(data)


@SETTINGS
@given(mutated_workflows())
def test_any_mutated_workflow_loads_or_is_refused(text):
    try:
        load_workflow_text(text, import_executables=False)
    except InvalidArgument:
        pass


@SETTINGS
@given(st.text(max_size=80))
def test_any_workflow_text_loads_or_is_refused(text):
    try:
        load_workflow_text(text, import_executables=False)
    except InvalidArgument:
        pass
