"""The two multi-turn examples' environments and data (their learning runs are README commands, not tests):
the calculator answers `calc` calls and scores the final answer; guess-the-number answers higher / lower;
both datasets are deterministic and keep eval apart from train."""

from __future__ import annotations

import json

import pytest

from examples.calculator.env import CalculatorEnv
from examples.calculator.env import write_dataset as write_calculator
from examples.guess_number.env import GuessNumberEnv
from examples.guess_number.env import write_dataset as write_guess
from meshrl.common.errors import InvalidArgument


def test_the_calculator_answers_tool_calls_and_scores_the_answer():
    env = CalculatorEnv()
    assert env.reset("37*41", "1517") == "37*41" and env.tools[0]["function"]["name"] == "calc"
    call = env.step("calc 37*41")
    assert (call.observation, call.reward, call.done, call.role) == ("1517", 0.0, False, "tool")
    assert env.step("calc 7/2").observation == "error" and env.step("calc 2+").observation == "error"
    assert (env.step(" 1517 ").reward, env.step("1517").done) == (1.0, True)
    assert env.step("1516").reward == 0.0
    with pytest.raises(InvalidArgument, match="not an integer"):
        env.reset("x", "abc")


def test_guess_number_answers_higher_and_lower():
    env = GuessNumberEnv()
    env.reset("guess 1-15", "10")
    assert [env.step(t).observation for t in ("8", "12", "x", "16")] == [
        "higher",
        "lower",
        "a number from 1 to 15",
        "a number from 1 to 15",
    ]
    right = env.step("10")
    assert (right.reward, right.done) == (1.0, True)
    env.reset("guess 1-15", "10")
    rewards = [env.step(t).reward for t in ("8", "3", "12", "13", "11")]  # 3 and 13 are ruled out by then
    assert rewards == [0.1, 0.0, 0.1, 0.0, 0.1]


@pytest.mark.parametrize("write", [write_calculator, write_guess])
def test_datasets_are_deterministic(tmp_path, write):
    a = [p.read_bytes() for p in write(tmp_path / "a", seed=3)]
    b = [p.read_bytes() for p in write(tmp_path / "b", seed=3)]
    assert a == b and all(a)


def test_calculator_eval_tasks_never_occur_in_train(tmp_path):
    train, evals = (
        [json.loads(x)["prompt"] for x in p.read_text().splitlines()] for p in write_calculator(tmp_path, seed=0)
    )
    assert len(evals) == 256 and not set(train) & set(evals)


def test_guess_number_eval_covers_every_secret_equally(tmp_path):
    _, evals = write_guess(tmp_path, seed=0)
    secrets = [int(json.loads(x)["answer"]) for x in evals.read_text().splitlines()]
    assert sorted(set(secrets)) == list(range(1, 16)) and all(secrets.count(s) == 10 for s in range(1, 16))
    with pytest.raises(InvalidArgument, match="multiple of 15"):
        write_guess(tmp_path, n_eval=7)


def test_the_calculator_demonstration_is_the_trajectory_an_episode_produces(tmp_path):
    """The warm-up's target tokenizes to exactly the ids an episode of the same turns has (token in, token out)."""
    from transformers import AutoTokenizer

    from examples.calculator.env import demonstration
    from meshrl.scheduler.environments.chat import ChatTurns
    from meshrl.trainer.model_builder import build_tokenizer

    build_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    turns = ChatTurns(tok)
    call = tok.encode("calc 37*41", add_special_tokens=False) + [tok.eos_token_id]
    episode = call + turns.observation_ids("1517", "tool", call) + tok.encode("1517", add_special_tokens=False)
    assert tok.encode(demonstration(37, 41), add_special_tokens=False) == episode
