"""Multi-turn episodes (`step/user/episodes.py`) through a real rollout gRPC server (transformers engine, tiny model)
and the router, with the environment in a spawned worker process: the trajectory is exactly the engine's ids
and the environment's ids in order (each turn's prompt is the whole trajectory so far, token in / token out), the
loss mask covers exactly the model's tokens, log-probs and versions stay with the model's tokens, and limits and
failing environments end an episode with the reason."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from meshrl.common import batch_schema as S
from meshrl.common.codec import Ragged
from meshrl.common.errors import InvalidArgument
from meshrl.common.grpc_server import ServerConfig, start_server
from meshrl.rollout.config import EngineConfig
from meshrl.rollout.replica import RolloutReplica
from meshrl.rollout.server import service
from meshrl.rollout.transformers_engine import TransformersEngine
from meshrl.scheduler.environments.chat import ChatTurns
from meshrl.scheduler.fleet.router import RolloutRouter
from meshrl.scheduler.step.user import episodes as E
from meshrl.scheduler.step.user.worker_pool import WorkerPool
from meshrl.trainer.model_builder import build_small_model

sys.path.insert(0, str(Path(__file__).parent))  # spawned workers import _user_code_faults by name
MOD = "_user_code_faults"
SAMPLING = {"temperature": 1.0, "top_p": 1.0}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_small_model(tmp_path_factory.mktemp("episode-model"), hidden_size=32, num_layers=2, seed=5)


@pytest.fixture(scope="module")
def router(model_dir):
    engine = TransformersEngine(EngineConfig(model_path=str(model_dir), max_batch_size=16))
    replica = RolloutReplica(engine, replica_id="ep-0", capacity=16)
    replica.mark_serving()
    running = start_server(ServerConfig(port=0), [service(replica)])
    r = RolloutRouter(addresses=[running.address], rpc_timeout_s=60)
    yield r
    r.close()
    running.stop(0)
    engine.shutdown()


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(2, call_timeout_s=2.0, allowed_modules=[MOD, "meshrl"]) as p:
        yield p


@pytest.fixture(scope="module")
def turns(model_dir):
    return ChatTurns(AutoTokenizer.from_pretrained(model_dir))


class Recorder:
    """Wraps RolloutRouter.generate: what each turn was given and what the engine returned."""

    def __init__(self, router):
        self.router, self.calls, self.lock = router, [], threading.Lock()

    def __call__(self, prompt_ids, **kw):
        out = self.router.generate(prompt_ids, **kw)
        with self.lock:
            self.calls.append((list(prompt_ids), out, kw["session_id"]))
        return out


def test_a_trajectory_is_the_engine_output_and_the_environment_output_token_for_token(router, pool, turns):
    rec = Recorder(router)
    limits = E.EpisodeLimits(max_turns=5, max_tokens=400, turn_tokens=6)
    traj = E.run_episode(pool, f"{MOD}:EchoEnv", "2+2", "4", rec, turns, limits, SAMPLING, "job/1/rollout/0/0")
    assert traj.end == E.DONE and traj.turns == 3 and traj.reward == 1.0 and len(rec.calls) == 3
    tok = turns.tokenizer
    # The first prompt: the chat template over the environment's first message.
    expected_prompt = tok.encode(
        tok.apply_chat_template([{"role": "user", "content": "task 2+2"}], add_generation_prompt=True, tokenize=False),
        add_special_tokens=False,
    )
    assert traj.prompt_ids == expected_prompt
    # Each turn saw exactly the trajectory so far; the trajectory is engine ids, then environment ids, in order.
    expected, mask = [], []
    for i, (prompt, out, session) in enumerate(rec.calls):
        assert session == "job/1/rollout/0/0"
        assert prompt == traj.prompt_ids + expected
        expected += list(out.token_ids)
        mask += [1.0] * len(out.token_ids)
        if i < 2:
            closing = "\n" if out.token_ids and out.token_ids[-1] == tok.eos_token_id else "<|im_end|>\n"
            env = tok.encode(
                f"{closing}<|im_start|>user\nseen {i + 1}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
            )
            expected += env
            mask += [0.0] * len(env)
    assert traj.response_ids == expected
    assert traj.loss_mask == mask
    model = np.array(mask) == 1.0
    assert list(np.array(traj.logprobs)[model]) == [lp for _, o, _ in rec.calls for lp in o.logprobs]
    assert all(lp == 0.0 for lp in np.array(traj.logprobs)[~model])
    assert list(np.array(traj.versions)[model]) == [v for _, o, _ in rec.calls for v in o.weight_versions]
    assert all(v == -1 for v in np.array(traj.versions)[~model])
    # The same bytes as the chat template renders the whole conversation (no re-encoding drift).
    text = tok.decode(traj.prompt_ids + traj.response_ids, skip_special_tokens=False)
    assert text.startswith(tok.decode(expected_prompt, skip_special_tokens=False)) and "seen 2<|im_end|>" in text


def test_episode_limits_end_an_episode_with_the_reason(router, pool, turns):
    env = f"{MOD}:NeverDoneEnv"
    t = E.run_episode(
        pool, env, "p", "a", router.generate, turns, E.EpisodeLimits(max_turns=2, turn_tokens=4), SAMPLING, "s1"
    )
    assert t.end == E.MAX_TURNS and t.turns == 2 and t.reward == 0.5
    t = E.run_episode(
        pool,
        env,
        "p",
        "a",
        router.generate,
        turns,
        E.EpisodeLimits(max_turns=50, max_tokens=30, turn_tokens=4),
        SAMPLING,
        "s2",
    )
    assert t.end == E.MAX_TOKENS and len(t.response_ids) <= 30 and t.turns >= 1
    t = E.run_episode(
        pool,
        env,
        "p",
        "a",
        router.generate,
        turns,
        E.EpisodeLimits(max_turns=10_000, max_tokens=400, max_seconds=0.05, turn_tokens=2),
        SAMPLING,
        "s3",
    )
    assert t.end == E.MAX_SECONDS
    with pytest.raises(InvalidArgument, match="max_turns = 0 must be positive"):
        E.EpisodeLimits(max_turns=0)


def test_a_hanging_environment_ends_its_episode_and_the_others_go_on(router, pool, turns):
    t = E.run_episode(
        pool, f"{MOD}:HangingEnv", "p", "a", router.generate, turns, E.EpisodeLimits(turn_tokens=3), SAMPLING, "h"
    )
    assert t.end == E.ENV_ERROR and "timeout" in t.error and t.reward == 0.0 and t.turns == 1
    t = E.run_episode(pool, "os:getcwd", "p", "a", router.generate, turns, E.EpisodeLimits(), SAMPLING, "x")
    assert t.end == E.ENV_ERROR and "outside the allowed modules" in t.error and t.response_ids == []


def test_run_episodes_writes_the_rollout_batch(router, pool, turns):
    limits = E.EpisodeLimits(max_turns=5, max_tokens=400, turn_tokens=4)
    trajs = E.run_episodes(
        pool, f"{MOD}:EchoEnv", ["a", "b"], ["1", "2"], 2, router.generate, turns, limits, SAMPLING, "job/2/rollout"
    )
    answers = Ragged.from_rows([np.frombuffer(b"1", np.uint8), np.frombuffer(b"2", np.uint8)], dtype=np.uint8)
    cols, samples = E.trajectory_columns(trajs, answers, 2, "job", 2)
    assert cols[S.GROUP_INDEX].tolist() == [0, 0, 1, 1]
    assert [bytes(r) for r in cols[S.ANSWER].rows()] == [b"1", b"1", b"2", b"2"]
    assert np.array_equal(cols[S.LOSS_MASK].lengths(), cols[S.RESPONSE_IDS].lengths())
    assert cols[S.RESPONSE_VERSIONS].values.dtype == np.int32
    assert cols[S.REWARDS].tolist() == [1.0] * 4 and cols[S.EPISODE_TURNS].tolist() == [3] * 4
    assert [bytes(r).decode() for r in cols[S.EPISODE_END].rows()] == ["done"] * 4
    assert [s.sample_id for s in samples] == ["job/2/0/0", "job/2/0/1", "job/2/1/0", "job/2/1/1"]
    metrics = E.episode_metrics(trajs, 1.0)
    assert metrics["episode/end_done"] == 1.0 and metrics["episode/turns_mean"] == 3.0


def test_the_rollout_node_runs_episodes_from_the_rows_prompt_text(router, pool, model_dir):
    """NodeHandlers.rollout with an environment, over a real data buffer: the environment gets the dataset row's
    prompt (not the templated ids decoded), and the node writes the episode columns with their metadata."""
    from types import SimpleNamespace

    import redis

    from meshrl.common.batch_key import batch_key
    from meshrl.common.databuffer_client import DataBufferClient
    from meshrl.scheduler.config import JobConfig
    from meshrl.scheduler.step.dag.executor import StepContext
    from meshrl.scheduler.step.dag.nodes import NodeHandlers
    from meshrl.scheduler.step.prompts.data import PromptEncoder, PromptSampler, Record
    from meshrl.scheduler.step.user.user_code import UserCode
    from meshrl.scheduler.workflow import load_workflow_data
    from tests._databuffer import SYSTEM_REDIS, config, delete_prefix, serving, unique_prefix

    cfg = JobConfig.model_validate(
        {
            "model": {"path": str(model_dir)},
            "data": {"train": "unused.jsonl", "prompts_per_step": 2},
            "job": {"allowed_modules": [MOD, "meshrl"]},
            "rollout": {"max_tokens": 4},
        }
    )
    wf = load_workflow_data(
        {
            "dag_id": "ep",
            "nodes": [
                {"node_id": "data", "node_type": "DATA_LOAD", "node_role": "DATA"},
                {
                    "node_id": "rollout",
                    "node_type": "ROLLOUT",
                    "node_role": "ROLLOUT",
                    "dependencies": ["data"],
                    "executable_ref": f"{MOD}:EchoEnv",
                    "config": {"n": 2, "max_turns": 5},
                },
            ],
        },
        allowed_modules=[MOD, "meshrl"],
    )
    records = [Record(0, "2+2", "4"), Record(1, "3+3", "6")]
    prefix = unique_prefix("episodes")
    with serving(config(SYSTEM_REDIS, prefix)) as (_, running):
        buffer = DataBufferClient(running.address)
        user = UserCode(cfg, wf.nodes, print)
        try:
            handlers = NodeHandlers(
                cfg,
                buffer,
                None,
                SimpleNamespace(router=router),
                PromptEncoder(str(model_dir)),
                PromptSampler(records, 0),
                None,
                user,
            )
            nodes = {n.node_id: n for n in wf.nodes}
            ctx = StepContext("job", 1, nodes=nodes)
            ctx.results["data"] = handlers.data_load(nodes["data"], ctx)
            result = handlers.rollout(nodes["rollout"], ctx)
            batch = buffer.get(result.outputs[0])
        finally:
            user.close()
            buffer.close()
    delete_prefix(redis.Redis.from_url(SYSTEM_REDIS), prefix)
    assert result.rewrites_rows and result.outputs[0] == batch_key("job", 1, "rollout")
    firsts = [handlers.encoder.tokenizer.decode(row) for row in batch[S.PROMPT_IDS].rows()]
    assert sorted({f.split("\n")[1] for f in firsts}) == ["task 2+2<|im_end|>", "task 3+3<|im_end|>"]  # the rows
    assert all(f.count("<|im_start|>user") == 1 for f in firsts)
    assert batch[S.REWARDS].tolist() == [1.0] * 4 and batch[S.EPISODE_TURNS].tolist() == [3] * 4
    assert result.metrics["reward/accuracy"] == 1.0 and result.metrics["episode/end_done"] == 1.0
    assert [s.index_in_group for s in batch.samples] == [0, 1, 0, 1]
