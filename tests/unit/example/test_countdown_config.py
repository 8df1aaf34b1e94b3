"""The default example's files fit the scheduler: the job config validates, the workflow loads, the reward and
data generator it names resolve and work, and the recipe probe's defaults are the config's numbers."""

import sys
from pathlib import Path

import yaml

from meshrl.scheduler.config import JobConfig
from meshrl.scheduler.step.scoring.rewards import resolve_reward
from meshrl.scheduler.workflow import resolve_executable
from meshrl.scheduler.workflow.loader import load_workflow_file

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "countdown"


def _config() -> JobConfig:
    return JobConfig(**yaml.safe_load((EXAMPLE / "config.yaml").read_text()))


def test_config_validates_and_workflow_loads():
    cfg = _config()
    workflow = load_workflow_file(EXAMPLE / "workflow.yaml", allowed_modules=cfg.job.allowed_modules)
    ids = [n.node_id for n in workflow.nodes]
    assert ids[0] == "data_load" and ids[-1] == "actor_train"
    assert "ref_logprob" not in ids and cfg.algorithm.loss.kl_coef == 0.0  # no KL, so no reference model
    assert cfg.rollout.max_batch_size >= cfg.data.prompts_per_step * cfg.rollout.n
    assert 0 < cfg.warmup.steps and cfg.eval.max_prompts == 256


def test_reward_and_generator_resolve_and_write_the_configured_files(tmp_path):
    cfg = _config()
    score = resolve_reward(cfg.algorithm.reward, cfg.job.allowed_modules)
    assert score(["p", "p"], ["3*7-5", "3+7+5"], ["target:16 numbers:3,7,5"] * 2) == [1.0, 0.0]
    generate = resolve_executable(cfg.data.generator, cfg.job.allowed_modules, "data.generator")
    generate(str(tmp_path), cfg.job.seed)  # the scheduler's call: (parent folder of data.train, job seed)
    for path in (cfg.data.train, cfg.data.eval):
        rows = (tmp_path / Path(path).name).read_text().splitlines()
        keys = yaml.safe_load(rows[0])
        assert {cfg.data.prompt_key, cfg.data.answer_key, cfg.data.response_key} <= set(keys)
    assert Path(cfg.data.train).parent == Path(cfg.data.eval).parent


def test_probe_defaults_are_the_config_numbers():
    sys.path.insert(0, str(ROOT / "bench" / "e2e"))
    try:
        import recipe_probe
    finally:
        sys.path.remove(str(ROOT / "bench" / "e2e"))
    assert recipe_probe.recipe_from_config(EXAMPLE / "config.yaml") == recipe_probe.Recipe()
