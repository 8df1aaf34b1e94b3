"""What the scheduler itself reads from the data buffer: the log-prob gap metric reads its three columns from
the batches that write them (not every column of every input batch), the held-out evaluation tells the
router its row count (so nobody reads the prompts to count them) and reads only the responses."""

from __future__ import annotations

import numpy as np

from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Batch, Ragged
from meshrl.common.errors import NotFound
from meshrl.scheduler.step.columns import column_reads
from meshrl.scheduler.step.data import Record
from meshrl.scheduler.step.evaluation import evaluate
from meshrl.scheduler.step.executor import NodeResult, StepContext
from meshrl.scheduler.step.pipeline import GAP_COLUMNS, _gap
from meshrl.scheduler.workflow.builtin import load_builtin
from meshrl.scheduler.workflow.columns import node_outputs


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
    writes = {"advantage": frozenset({"advantages"}), "old_logprob": frozenset({"old_logprobs"}),
              "rollout": frozenset({"response_ids", "old_logprobs"})}  # fmt: skip
    reads = column_reads(keys, writes, ["old_logprobs", "response_ids"])
    assert [k.node_id for k in reads.keys] == ["old_logprob", "rollout"] and reads.columns == [
        "old_logprobs",
        "response_ids",
    ]
    assert column_reads(keys, writes, ["old_logprobs", "values"]) is None


def test_the_gap_metric_reads_its_three_columns_from_the_two_batches_that_write_them():
    tokens = Ragged.from_rows([[0.1, 0.2], [0.3]], dtype=np.float32)
    buffer = RecordingBuffer({
        "rollout": Batch({S.ROLLOUT_LOGPROBS: tokens, S.RESPONSE_VERSIONS: Ragged.from_rows([[4, 4], [3]]),
                          S.RESPONSE_IDS: Ragged.from_rows([[1, 2], [3]])}),
        "old_logprob": Batch({S.OLD_LOGPROBS: Ragged.from_rows([[0.1, 0.4], [0.3]], dtype=np.float32)}),
    })  # fmt: skip
    ctx = _grpo_context()
    metrics = _gap(buffer, ctx, ("actor_train",), 4, node_outputs(ctx.nodes.values()))
    assert buffer.reads == [(["old_logprob", "rollout"], GAP_COLUMNS)]  # was: every column of 5 batches
    assert abs(metrics["async/logprob_gap_lag0"] - 0.1) < 1e-6  # |0.2 - 0.4| and |0.1 - 0.1| at version 4
    assert metrics["async/logprob_gap_lag1"] == 0.0


def test_the_gap_metric_is_left_out_when_no_batch_holds_its_columns():
    buffer = RecordingBuffer({"rollout": Batch({S.RESPONSE_IDS: Ragged.from_rows([[1]])})})
    ctx = _grpo_context()
    for nid in ctx.results:  # batches of no workflow node (as the async mode's rows are): every one is asked
        ctx.results[nid].outputs = [batch_key("j", 3, "rows")]
    assert _gap(buffer, ctx, ("actor_train",), 1, node_outputs(ctx.nodes.values())) == {}
    assert buffer.reads == [(["rows"], GAP_COLUMNS)]


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
    buffer = RecordingBuffer({"eval": Batch({S.RESPONSE_IDS: Ragged.from_rows([[4], [5], [7]]),
                                             S.PROMPT_IDS: Ragged.from_rows([[1], [2], [3]])})})  # fmt: skip
    fleet = Fleet()
    metrics = evaluate("j", 0, records, Encoder(), buffer, fleet, _exact, max_tokens=4)
    assert fleet.kwargs["num_prompts"] == 3  # None made the router read the prompt batch to count it
    assert buffer.reads == [(["eval"], (S.RESPONSE_IDS,))]
    assert metrics["eval/accuracy"] == 1 / 3 and metrics["eval/prompts"] == 3
    assert buffer.deleted == ["eval_prompts", "eval"]
