"""The actor's and the reference's log-prob nodes of one step share one trainer call (step/dag/shared_passes.py):
the rows are read once, each node keeps its own key and metrics, the call carries the rollout's sampling
temperature, and nodes that do not start together, or that this walk does not run, keep calls of their own."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from meshrl.api.trainer.v1 import trainer_pb2 as tpb
from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.errors import Unavailable
from meshrl.scheduler.step.dag.executor import NodeResult, StepContext
from meshrl.scheduler.step.dag.nodes import NodeHandlers
from meshrl.scheduler.step.dag.shared_passes import call_group
from meshrl.scheduler.workflow.builtin import load_builtin

PAIR = ("old_logprob", "ref_logprob")
JOB = SimpleNamespace(rollout=SimpleNamespace(temperature=0.6))  # the job config the handlers read


class Trainer:
    """Records each log-prob call and answers it like a trainer."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.calls: list[dict] = []

    def compute_logprobs(
        self, role, inputs, output, name, entropy, columns=(), weight_version=None, more_passes=(), temperature=None
    ):
        self.calls.append(
            {
                "role": role,
                "output": output.node_id,
                "columns": list(columns),
                "entropy": entropy,
                "weight_version": weight_version,
                "more": list(more_passes),
                "temperature": temperature,
            }
        )
        if self.error is not None:
            raise self.error
        metrics = {"entropy": 1.5, "logprob_gap_lag0": 0.25} if role == "actor" else {"mean": -2.0}
        passes = [SimpleNamespace(metrics={"mean": -2.0}) for _ in more_passes]
        return SimpleNamespace(metrics=metrics, passes=passes)


def _context(scheduled=PAIR, version=4) -> StepContext:
    nodes = {n.node_id: n for n in load_builtin("grpo").nodes}
    results = {nid: NodeResult([batch_key("j", 3, nid)]) for nid in ("data_load", "rollout")}
    results["rollout"].rewrites_rows = True
    return StepContext("j", 3, results, nodes, version=version, scheduled=frozenset(scheduled))


def _run_pair(trainer, ctx) -> dict[str, NodeResult]:
    """Both nodes' handlers at once, as the executor starts them."""
    handlers = NodeHandlers(JOB, None, trainer, None, None, None, None)
    with ThreadPoolExecutor(2) as pool:
        futures = {nid: pool.submit(handlers.inference, ctx.nodes[nid], ctx) for nid in PAIR}
        return {nid: f.result(30) for nid, f in futures.items()}


def test_both_passes_go_in_one_call_over_the_union_of_their_columns():
    trainer = Trainer()
    results = _run_pair(trainer, _context())
    (call,) = trainer.calls
    assert call["role"] == "actor" and call["output"] == "old_logprob" and call["entropy"] is True
    assert call["columns"] == [S.PROMPT_IDS, S.RESPONSE_IDS, S.ROLLOUT_LOGPROBS, S.RESPONSE_VERSIONS]
    assert call["weight_version"] == 4  # the actor's pi_old pass reports the rollout gap
    assert call["temperature"] == 0.6  # rollout.temperature: both passes at the rows' sampling temperature
    (ref,) = call["more"]
    assert ref.role == tpb.ROLE_REFERENCE and ref.output.node_id == "ref_logprob"
    assert ref.output_name == S.REF_LOGPROBS and not ref.with_entropy and not ref.HasField("weight_version")
    assert [k.node_id for k in results["old_logprob"].outputs] == ["old_logprob"]
    assert [k.node_id for k in results["ref_logprob"].outputs] == ["ref_logprob"]
    assert results["old_logprob"].metrics == {"old_logprob/entropy": 1.5, "async/logprob_gap_lag0": 0.25}
    assert results["ref_logprob"].metrics == {"ref_logprob/mean": -2.0}


def test_a_failed_call_fails_both_nodes_with_its_error():
    trainer = Trainer(error=Unavailable("the trainer went away"))
    ctx = _context()
    handlers = NodeHandlers(JOB, None, trainer, None, None, None, None)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(handlers.inference, ctx.nodes[nid], ctx) for nid in PAIR]
        for future in futures:
            with pytest.raises(Unavailable, match="went away"):
                future.result(30)
    assert len(trainer.calls) == 1


def test_nodes_outside_this_walk_or_started_apart_keep_calls_of_their_own():
    ctx = _context(scheduled=("old_logprob",))  # the reference's node runs on another walk (or was given)
    assert [n.node_id for n in call_group(ctx.nodes["old_logprob"], ctx)] == ["old_logprob"]
    ctx = _context()
    ctx.nodes["ref_logprob"] = ctx.nodes["ref_logprob"].model_copy(
        update={"dependencies": ["rollout", "reward"]}
    )  # starts later
    assert [n.node_id for n in call_group(ctx.nodes["old_logprob"], ctx)] == ["old_logprob"]
    ctx = _context(scheduled=(*PAIR, "actor_train", "advantage"))
    assert [n.node_id for n in call_group(ctx.nodes["advantage"], ctx)] == ["advantage"]
    assert [n.node_id for n in call_group(ctx.nodes["ref_logprob"], ctx)] == list(PAIR)


def test_once_runs_the_work_one_time_and_hands_every_waiter_its_result_or_error():
    ctx, runs, gate = StepContext("j", 1), [], threading.Event()

    def work():
        runs.append(1)
        gate.wait(10)
        return "done"

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(ctx.once, "k", work) for _ in range(3)]
        gate.set()
        assert [f.result(10) for f in futures] == ["done"] * 3
    assert runs == [1]
    with pytest.raises(ValueError, match="bad"):
        ctx.once("e", lambda: (_ for _ in ()).throw(ValueError("bad")))
    with pytest.raises(ValueError, match="bad"):  # a later waiter gets the same error, not a second run
        ctx.once("e", lambda: "ran again")
