"""What the scheduler itself reads from the data buffer: nothing for the log-prob gap metric (the actor's old
log-prob pass asks the trainer for it, with the two rollout columns it needs), the held-out evaluation tells the
router its row count (so nobody reads the prompts to count them) and reads only the responses, and the
advantage node reads nothing after the reward node of its step (step/dag/held.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Batch, Ragged
from meshrl.common.errors import NotFound
from meshrl.scheduler.step.dag.columns import column_reads
from meshrl.scheduler.step.dag.executor import NodeResult, StepContext
from meshrl.scheduler.step.dag.nodes import NodeHandlers
from meshrl.scheduler.step.job.evaluation import evaluate
from meshrl.scheduler.step.pacing.pipeline import SyncSteps
from meshrl.scheduler.step.prompts.data import Record
from meshrl.scheduler.workflow.builtin import load_builtin


class RecordingBuffer:
    """A data buffer that records reads and answers them from `batches` ({node_id: Batch})."""

    def __init__(self, batches: dict[str, Batch]) -> None:
        self.batches = batches
        self.reads: list[tuple[list[str], tuple[str, ...]]] = []
        self.puts: list[str] = []
        self.deleted: list[str] = []

    def get_many(self, keys, *, columns=(), **_):
        self.reads.append(([k.node_id for k in keys], tuple(columns)))
        out: dict = {}
        for k in keys:
            held = self.batches.get(k.node_id, Batch()).columns
            out.update({c: v for c, v in held.items() if not columns or c in columns})
        missing = [c for c in columns if c not in out]
        if missing:
            raise NotFound(f"no input batch holds column {missing}")
        return Batch(out)

    def put(self, key, columns, **_):
        self.puts.append(key.node_id)
        return 0

    def delete(self, key, **_):
        self.deleted.append(key.node_id)
        return True


def _grpo_context(job: str = "j", step: int = 3) -> StepContext:
    nodes = {n.node_id: n for n in load_builtin("grpo").nodes}
    results = {nid: NodeResult([batch_key(job, step, nid)]) for nid in nodes if nid != "actor_train"}
    results["rollout"].rewrites_rows = True
    return StepContext(job, step, results, nodes)


def test_column_reads_takes_each_column_from_its_nearest_writer_or_gives_none():
    keys = [batch_key("j", 1, n) for n in ("advantage", "old_logprob", "rollout")]
    writes = {
        "advantage": frozenset({"advantages"}),
        "old_logprob": frozenset({"old_logprobs"}),
        "rollout": frozenset({"response_ids", "old_logprobs"}),
    }
    reads = column_reads(keys, writes, ["old_logprobs", "response_ids"])
    assert [k.node_id for k in reads.keys] == ["old_logprob", "rollout"] and reads.columns == [
        "old_logprobs",
        "response_ids",
    ]
    assert column_reads(keys, writes, ["old_logprobs", "values"]) is None


class RecordingTrainer:
    """The trainer client's log-prob call: records what it was asked and answers with `metrics`."""

    def __init__(self, metrics: dict[str, float]) -> None:
        self.metrics = metrics
        self.calls: list[dict] = []

    def compute_logprobs(
        self, role, inputs, output, name, entropy, columns=(), weight_version=None, more_passes=(), temperature=None
    ):
        self.calls.append(
            {
                "role": role,
                "inputs": [k.node_id for k in inputs],
                "columns": list(columns),
                "weight_version": weight_version,
            }
        )
        return SimpleNamespace(metrics=self.metrics, passes=[])


def _handlers(buffer, trainer) -> NodeHandlers:
    job = SimpleNamespace(rollout=SimpleNamespace(temperature=1.0))  # what the handlers read of the job config
    return NodeHandlers(job, buffer, trainer, None, None, None, None)


def test_the_actor_pass_asks_the_trainer_for_the_gap_and_the_scheduler_reads_nothing():
    buffer, trainer = RecordingBuffer({}), RecordingTrainer({"entropy": 1.5, "logprob_gap_lag0": 0.25})
    ctx = _grpo_context()
    ctx.version = 4
    handlers = _handlers(buffer, trainer)
    old = handlers.inference(ctx.nodes["old_logprob"], ctx)
    ref = handlers.inference(ctx.nodes["ref_logprob"], ctx)
    assert buffer.reads == []  # was: a GetSmallBatches of the gap's three columns after the step's nodes
    assert trainer.calls[0] == {
        "role": "actor",
        "inputs": ["rollout"],
        "weight_version": 4,
        "columns": [S.PROMPT_IDS, S.RESPONSE_IDS, S.ROLLOUT_LOGPROBS, S.RESPONSE_VERSIONS],
    }
    assert trainer.calls[1]["columns"] == [S.PROMPT_IDS, S.RESPONSE_IDS] and trainer.calls[1]["weight_version"] is None
    assert old.metrics == {"old_logprob/entropy": 1.5, "async/logprob_gap_lag0": 0.25}  # the step metric's name
    assert "async/logprob_gap_lag0" not in ref.metrics


def test_the_gap_columns_are_asked_from_stream_rows_and_not_where_no_node_writes_them():
    trainer = RecordingTrainer({})
    ctx = _grpo_context()
    ctx.version = 2
    for nid in ctx.results:  # an asynchronous step's rows: one batch of no workflow node, every column
        ctx.results[nid].outputs = [batch_key("j", 3, "rows")]
    _handlers(RecordingBuffer({}), trainer).inference(ctx.nodes["old_logprob"], ctx)
    assert trainer.calls[-1]["columns"][-2:] == [S.ROLLOUT_LOGPROBS, S.RESPONSE_VERSIONS]
    ctx = _grpo_context()
    ctx.version = 2
    ctx.nodes["rollout"].config["outputs"] = [S.PROMPT_IDS, S.RESPONSE_IDS]  # writes no rollout log-probs
    _handlers(RecordingBuffer({}), trainer).inference(ctx.nodes["old_logprob"], ctx)
    assert trainer.calls[-1]["columns"] == [S.PROMPT_IDS, S.RESPONSE_IDS]


def test_a_sync_step_reads_nothing_itself_and_tells_the_nodes_its_version():
    class Executor:
        def run_nodes(self, job_id, step, version=None, **_):
            self.version = version
            return {"time/rollout": 0.1}, StepContext(job_id, step)

    buffer, executor = RecordingBuffer({}), Executor()
    steps = SyncSteps(executor, buffer, "j", list(load_builtin("grpo").nodes))
    assert steps.run_step(3, 7) == {"time/rollout": 0.1}
    assert executor.version == 7 and buffer.reads == []  # was: the gap metric's own read


class Encoder:
    def encode_prompt(self, text):
        return [len(text)]

    def decode(self, ids):
        return "4" if list(ids) == [4] else "x"


class Fleet:
    def __init__(self) -> None:
        self.kwargs: dict = {}

    def generate(self, source, **kwargs):
        self.kwargs = kwargs
        return [batch_key(kwargs["job_id"], kwargs["step"], "eval")], {"rollout/seconds": 0.5}


def _exact(prompts, responses, answers):
    return [float(r == a) for r, a in zip(responses, answers)]


def test_evaluation_gives_the_router_its_row_count_and_reads_only_the_responses():
    records = [Record(0, "2+2", "4"), Record(1, "1+1", "2"), Record(2, "3+3", "6")]
    buffer = RecordingBuffer(
        {
            "eval": Batch(
                {S.RESPONSE_IDS: Ragged.from_rows([[4], [5], [7]]), S.PROMPT_IDS: Ragged.from_rows([[1], [2], [3]])}
            )
        }
    )
    fleet = Fleet()
    metrics = evaluate("j", 0, records, Encoder(), buffer, fleet, _exact, max_tokens=4)
    assert fleet.kwargs["num_prompts"] == 3  # None made the router read the prompt batch to count it
    assert buffer.reads == [(["eval"], (S.RESPONSE_IDS,))]
    assert metrics["eval/accuracy"] == 1 / 3 and metrics["eval/prompts"] == 3
    assert buffer.deleted == ["eval_prompts", "eval"]


class StoringBuffer(RecordingBuffer):
    """A RecordingBuffer whose puts are read back (the reward node's batch, for a reference advantage)."""

    def put(self, key, columns, **_):
        self.puts.append(key.node_id)
        self.batches[key.node_id] = Batch(dict(columns))
        return 0


def _rollout_batch() -> Batch:
    answers = [b"4", b"4", b"2", b"2"]
    return Batch(
        {
            S.PROMPT_IDS: Ragged.from_rows([[1], [1], [2], [2]], dtype=np.int32),
            S.RESPONSE_IDS: Ragged.from_rows([[4], [5, 6], [7], [4, 4, 4]], dtype=np.int32),
            S.ANSWER: Ragged.from_rows([np.frombuffer(a, np.uint8) for a in answers], dtype=np.uint8),
            S.GROUP_INDEX: np.array([0, 0, 1, 1], dtype=np.int64),
            S.ROLLOUT_LOGPROBS: Ragged.from_rows([[-1.0], [-1.0, -2.0], [-1.0], [-1.0] * 3], dtype=np.float32),
        }
    )


def _compute_handlers(buffer) -> NodeHandlers:
    algorithm = SimpleNamespace(advantage="grpo", loss=SimpleNamespace(kl_coef=0.0), gamma=1.0, lam=1.0)
    cfg = SimpleNamespace(algorithm=algorithm, job=SimpleNamespace(allowed_modules=[]))
    return NodeHandlers(cfg, buffer, None, None, Encoder(), None, _exact)


def test_the_advantage_node_reads_nothing_after_the_reward_node_of_its_step():
    buffer = StoringBuffer({"rollout": _rollout_batch()})
    handlers, ctx = _compute_handlers(buffer), _grpo_context()
    handlers.reward(ctx.nodes["reward"], ctx)
    # one read: the reward's inputs and, in the same call, what the advantage needs from the rollout
    assert buffer.reads == [(["rollout"], (S.PROMPT_IDS, S.RESPONSE_IDS, S.ANSWER, S.GROUP_INDEX))]
    held = handlers.advantage(ctx.nodes["advantage"], ctx)
    assert len(buffer.reads) == 1  # was: a second call for rewards, group_index and response_ids
    advantages = buffer.batches["advantage"][S.ADVANTAGES]
    # the same advantages as a step that holds nothing and reads every input from the buffer
    fresh = _grpo_context()
    handlers.advantage(fresh.nodes["advantage"], fresh)
    assert buffer.reads[-1] == (["reward", "rollout"], (S.REWARDS, S.GROUP_INDEX, S.RESPONSE_IDS))
    assert np.array_equal(buffer.batches["advantage"][S.ADVANTAGES].values, advantages.values)
    assert held.metrics and buffer.batches["reward"][S.REWARDS].tolist() == [1.0, 0.0, 0.0, 0.0]


def test_the_advantage_node_reports_the_share_of_groups_whose_rewards_are_all_equal():
    buffer = StoringBuffer({"rollout": _rollout_batch()})
    handlers, ctx = _compute_handlers(buffer), _grpo_context()
    handlers.reward(ctx.nodes["reward"], ctx)  # group 0 scores [1, 0], group 1 [0, 0]: no advantage in group 1
    result = handlers.advantage(ctx.nodes["advantage"], ctx)
    assert result.metrics["reward/zero_variance_groups"] == 0.5
