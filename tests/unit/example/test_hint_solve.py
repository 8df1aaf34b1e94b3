"""examples/hint_solve's user code: the hand-over passes the hinter's tokens on exactly, and each agent's rule
scores as documented."""

from __future__ import annotations

import json

import numpy as np

from examples.hint_solve.agents import hand_over, hint_reward, solve_reward, write_dataset
from meshrl.common import batch_schema as S
from meshrl.common.codec import Batch, Ragged


def test_the_solver_prompt_is_the_hinters_prompt_and_response_token_for_token():
    prompts = Ragged.from_rows([np.array([5, 6]), np.array([7])], np.int32)
    responses = Ragged.from_rows([np.array([8, 9, 10]), np.array([], dtype=np.int32)], np.int32)
    answers = Ragged.from_rows([np.frombuffer(b"3", np.uint8), np.frombuffer(b"12", np.uint8)], np.uint8)
    out = hand_over(Batch({S.PROMPT_IDS: prompts, S.RESPONSE_IDS: responses, S.ANSWER: answers}), {})
    assert [out[S.PROMPT_IDS].row(i).tolist() for i in range(2)] == [[5, 6, 8, 9, 10], [7]]
    assert out[S.PROMPT_IDS].values.dtype == np.int32 and out[S.ANSWER] is answers


def test_each_agent_has_its_own_rule():
    assert hint_reward(["", "", ""], ["it is 7", "maybe 3", "no idea"], ["7", "7", "7"]) == [1.0, 0.2, 0.0]
    assert solve_reward(["", "", ""], ["7 because 7", "3 or 7", "seven"], ["7", "7", "7"]) == [1.0, 0.2, 0.0]


def test_the_dataset_is_one_digit_sums(tmp_path):
    (path,) = write_dataset(tmp_path, seed=1, n_train=20)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 20
    for row in rows:
        a, b = row["prompt"].rstrip("=").split("+")
        assert int(a) + int(b) == int(row["answer"])
