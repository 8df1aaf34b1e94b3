"""One trace per training step across every service (issue 9), read back from the run's JSONL span files.

A two-step GRPO job with two rollout replicas (plain processes) must leave, for each step, exactly one
trace rooted at the scheduler's `step N` span that holds spans of the scheduler, the data buffer, the
trainer and each replica, every parent inside the trace, and the attributes the trace viewer reads:
buffer keys and bytes, generation requests / tokens / weight version per replica, log-prob and train
tokens and micro-batches, and the weight publication with its per-replica apply spans. A job whose
user COMPUTE node raises must fail with an ERROR span carrying the exception, and still close its trace.
"""

from __future__ import annotations

import numpy as np
import yaml

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.common import telemetry
from meshrl.common.telemetry import SpanRecord, read_span_files
from meshrl.common.telemetry import attributes as A

from .conftest import job_config

DATA_BUFFER = "meshrl.databuffer.v1.DataBuffer"
ROLLOUT = "meshrl.rollout.v1.Rollout"
TRAINER = "meshrl.trainer.v1.Trainer"
FAILURE = "boom: the user function of node 'explode' failed on purpose"


def explode(batch, config: dict) -> dict[str, np.ndarray]:
    """The user function of the failing COMPUTE node (an executable_ref points here)."""
    raise ValueError(FAILURE)


def run_traced(workflow: str, config: str):
    """Runs one job in this process like `meshrl run`: the scheduler's spans go to RUN_DIR/traces too."""
    from meshrl.scheduler.jobs import JobManager

    jobs = JobManager()
    record = jobs.create(workflow, config, [])
    run = record.runner.run
    telemetry.shutdown_telemetry()  # whatever an earlier test in this process set up
    telemetry.setup_telemetry(
        "scheduler", record.runner.cfg.telemetry.model_copy(update={"path": str(run.traces / "scheduler.jsonl")})
    )
    try:
        jobs.run(record)
    finally:
        telemetry.shutdown_telemetry()
    return record, read_span_files(sorted(run.traces.glob("*.jsonl")))


class StepTrace:
    """The spans of one `step N` trace, with the questions the tests ask of them."""

    def __init__(self, spans: list[SpanRecord], step: int) -> None:
        roots = [s for s in spans if s.name == A.step_span_name(step) and s.parent_span_id is None]
        assert len(roots) == 1, f"expected one root span 'step {step}', found {len(roots)}"
        self.root = roots[0]
        self.spans = [s for s in spans if s.trace_id == self.root.trace_id]
        self.by_id = {s.span_id: s for s in self.spans}

    def named(self, name: str, kind: str | None = None) -> list[SpanRecord]:
        return [s for s in self.spans if s.name == name and (kind is None or s.kind == kind)]

    def server(self, service: str, method: str) -> list[SpanRecord]:
        return self.named(f"{service}/{method}", "SERVER")

    def ancestors(self, span: SpanRecord) -> list[str]:
        names = []
        while span.parent_span_id is not None:
            span = self.by_id[span.parent_span_id]
            names.append(span.name)
        return names

    def check_parents(self) -> None:
        """One root; every other span's parent is in this trace."""
        assert [s for s in self.spans if s.parent_span_id is None] == [self.root]
        lost = [(s.name, s.lane) for s in self.spans if s.parent_span_id and s.parent_span_id not in self.by_id]
        assert not lost, f"spans whose parent is not in the trace of {self.root.name}: {lost}"


def test_each_step_is_one_trace_across_every_service(tiny_task, tmp_path):
    rollout = {"replicas": 2, "n": 2, "max_tokens": 6}
    config = job_config(
        tiny_task, tmp_path, rollout=rollout, data={"eval": None}, telemetry={"exporter": "file"}
    )  # no evaluation: only the steps matter here
    from meshrl.scheduler.workflow import builtin_workflow_text

    record, spans = run_traced(builtin_workflow_text("grpo"), config)
    assert record.state == spb.JOB_STATE_SUCCEEDED, record.error
    node_ids = [n.node_id for n in record.runner.workflow.nodes]
    replicas = sorted({s.instance for s in spans if s.service == "rollout"})
    assert len(replicas) == 2, f"rollout lanes {replicas}"

    for step in (1, 2):
        t = StepTrace(spans, step)
        t.check_parents()
        assert t.root.service == "scheduler" and t.root.attributes[A.STEP] == step
        lanes = {s.lane for s in t.spans}
        assert {"scheduler", "databuffer/databuffer", "trainer/trainer"} <= lanes, lanes
        assert {f"rollout/{r}" for r in replicas} <= lanes, lanes
        nodes = {s.attributes.get(A.NODE_ID): s for s in t.spans if s.name.startswith(A.NODE_SPAN_PREFIX)}
        assert sorted(nodes) == sorted(node_ids)
        assert all(s.parent_span_id == t.root.span_id for s in nodes.values())

        # Data buffer: every write and read carries its key and bytes (streamed or unary); a read sends at most
        # what was written (a node reads only its declared columns and rows).
        written: dict[str, int] = {}
        for s in t.server(DATA_BUFFER, "PutBatch") + t.server(DATA_BUFFER, "PutSmallBatch"):
            assert s.attributes[A.BYTES] > 0 and f"/step {step}/" in s.attributes[A.BUFFER_KEY]
            written[s.attributes[A.BUFFER_KEY]] = s.attributes[A.BYTES]
        reads = [
            s
            for s in t.server(DATA_BUFFER, "GetBatch") + t.server(DATA_BUFFER, "GetSmallBatch")
            if s.attributes.get(A.BYTES)
        ]  # a too-large unary try reads nothing and is retried streamed
        assert reads and {s.attributes[A.BUFFER_KEY] for s in reads} <= set(written), "read a key not written"
        assert all(0 < s.attributes[A.BYTES] <= written[s.attributes[A.BUFFER_KEY]] for s in reads)
        many = [s for s in t.server(DATA_BUFFER, "GetSmallBatches") if s.attributes.get(A.BYTES)]
        for s in many:  # several small batches in one call: each key named, at most their written bytes in all
            keys = list(s.attributes[A.BUFFER_KEYS])
            assert keys and set(keys) <= set(written), f"read keys not written: {keys}"
            assert s.attributes[A.BYTES] <= sum(written[k] for k in keys)
        readers = {t.by_id[s.parent_span_id].lane for s in reads + many}  # the client span runs in the reader
        assert {"scheduler", "trainer/trainer", *(f"rollout/{r}" for r in replicas)} <= readers, readers

        # Generation: one GenerateBatch per replica, under the rollout node, serving step N's weights
        # (version 1 is the initial publication; each step publishes the next).
        generated = t.server(ROLLOUT, "GenerateBatch")
        assert sorted(s.attributes[A.REPLICA] for s in generated) == replicas
        assert sorted(s.instance for s in generated) == replicas
        for s in generated:
            assert s.attributes[A.REQUESTS] > 0 and s.attributes[A.TOKENS] > 0
            assert s.attributes[A.WEIGHT_VERSION] == step
            assert A.node_span_name("rollout") in t.ancestors(s)
        tokens = sum(s.attributes[A.TOKENS] for s in generated)
        assert sum(s.attributes[A.REQUESTS] for s in generated) == 4 * rollout["n"]

        # Trainer: both log-prob passes (one call: the reference's pass rides in more_passes) and the train
        # step score exactly the generated tokens.
        logprobs = t.server(TRAINER, "ComputeLogProbs")
        train = t.server(TRAINER, "TrainStep")
        assert len(logprobs) == 1 and logprobs[0].attributes[A.PASSES] == 2 and len(train) == 1
        for s in [*logprobs, *train]:
            assert s.attributes[A.TOKENS] == tokens and s.attributes[A.MICRO_BATCHES] >= 1
        assert A.node_span_name("actor_train") in t.ancestors(train[0])

        # Weight publication: transport and bytes, the trainer's export, one apply span per replica.
        (publish,) = t.named("weights.publish")
        version = step + 1
        assert publish.parent_span_id == t.root.span_id
        assert publish.attributes[A.TRANSPORT] == "disk" and publish.attributes[A.WEIGHT_VERSION] == version
        nbytes = publish.attributes[A.BYTES]
        assert nbytes > 0
        (export,) = t.server(TRAINER, "PublishWeights")
        assert export.attributes[A.BYTES] == nbytes and export.attributes[A.WEIGHT_VERSION] == version
        applied = t.server(ROLLOUT, "UpdateWeightsFromDisk")
        assert sorted(s.attributes[A.REPLICA] for s in applied) == replicas
        for s in applied:
            assert t.ancestors(s)[1] == "weights.publish"  # server <- client <- weights.publish
            assert s.attributes[A.WEIGHT_VERSION] == version and s.attributes[A.BYTES] == nbytes
            assert 0 < s.attributes[A.APPLY_SECONDS] <= s.duration_ns / 1e9
        assert not [s.name for s in t.spans if s.is_error]


def failing_workflow() -> str:
    """GRPO with one more COMPUTE node after the rollout, whose user function raises."""
    from meshrl.scheduler.workflow import builtin_workflow_text

    wf = yaml.safe_load(builtin_workflow_text("grpo"))
    wf["nodes"].append(
        {
            "node_id": "explode",
            "node_type": "COMPUTE",
            "node_role": "DEFAULT",
            "dependencies": ["rollout"],
            "executable_ref": f"{__name__}:explode",
        }
    )
    return yaml.safe_dump(wf, sort_keys=False)


def test_a_failing_node_is_an_error_span_and_the_trace_still_closes(tiny_task, tmp_path):
    config = job_config(
        tiny_task,
        tmp_path,
        job={"name": "e2e-fail", "steps": 1, "run_root": str(tmp_path), "allowed_modules": ["meshrl", __name__]},
        data={"eval": None},
        telemetry={"exporter": "file"},
    )
    record, spans = run_traced(failing_workflow(), config)
    assert record.state == spb.JOB_STATE_FAILED
    assert "node 'explode' failed at step 1" in record.error and FAILURE in record.error

    t = StepTrace(spans, 1)  # the root span was exported although the step raised
    t.check_parents()
    assert t.root.is_error and "explode" in (t.root.status_message or "")
    (node,) = t.named(A.node_span_name("explode"))
    assert node.is_error and node.parent_span_id == t.root.span_id and FAILURE in node.status_message
    (event,) = [e for e in node.events if e.name == "exception"]
    assert event.attributes["exception.type"] == "ValueError"
    assert event.attributes["exception.message"] == FAILURE
    assert "Traceback" in event.attributes["exception.stacktrace"]
    assert {s.attributes[A.NODE_ID] for s in t.spans if s.is_error and A.NODE_ID in s.attributes} == {"explode"}

    failed = [e.node for e in record.events.read(0, 0)[0] if e.WhichOneof("body") == "node" and e.node.error]
    assert [(n.node_id, n.step, n.state) for n in failed] == [("explode", 1, spb.NODE_STATE_FAILED)]
    assert "Traceback (most recent call last)" in failed[0].error and f"ValueError: {FAILURE}" in failed[0].error
    assert "explode" in record.runner.run.events_file.read_text()
