"""The step executor: dependency order, concurrent branches, upstream keys (stopping at nodes that
rewrite rows), node events, and a failing node reported with its traceback."""

import threading
import time
from dataclasses import dataclass, field

import pytest

from meshrl.api.scheduler.v1 import scheduler_pb2 as spb
from meshrl.common.batch_key import batch_key
from meshrl.scheduler.events import EventLog
from meshrl.scheduler.step.dag.executor import NodeFailed, NodeResult, StepExecutor


@dataclass
class N:
    node_id: str
    dependencies: list[str] = field(default_factory=list)
    node_type: str = "COMPUTE"
    node_role: str = "REWARD"


def graph():
    return [N("load"), N("roll", ["load"]), N("a", ["roll"]), N("b", ["roll"]), N("train", ["a", "b"])]


def test_order_concurrency_and_inputs():
    seen, running, peak = {}, [0], [0]
    lock = threading.Lock()

    def handler(node, ctx):
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        seen[node.node_id] = [k.node_id for k in ctx.input_keys(node.node_id)]
        time.sleep(0.2 if node.node_id in ("a", "b") else 0)
        with lock:
            running[0] -= 1
        return NodeResult([batch_key("j", ctx.step, node.node_id)], rewrites_rows=node.node_id == "roll")

    events = EventLog("j")
    metrics = StepExecutor(graph(), lambda n: handler, events).run_step("j", 1)
    assert seen["load"] == [] and seen["roll"] == ["load"]
    assert seen["a"] == ["roll"]  # not "load": the rollout rewrote the rows
    assert sorted(seen["train"]) == ["a", "b", "roll"]
    assert peak[0] == 2  # a and b ran at the same time
    assert set(metrics) == {f"time/{n}" for n in ("load", "roll", "a", "b", "train")}
    states = [(e.node.node_id, e.node.state) for e in events.read(0, 0)[0] if e.WhichOneof("body") == "node"]
    assert ("train", spb.NODE_STATE_COMPLETED) in states and states.index(("a", spb.NODE_STATE_RUNNING)) > 4


def test_failure_names_the_node_and_keeps_the_traceback():
    def handler(node, ctx):
        if node.node_id == "a":
            raise ValueError("reward function broke")
        return NodeResult([batch_key("j", ctx.step, node.node_id)])

    events = EventLog("j")
    with pytest.raises(NodeFailed, match="node 'a' failed at step 3") as info:
        StepExecutor(graph(), lambda n: handler, events).run_step("j", 3)
    assert "ValueError: reward function broke" in info.value.detail
    errors = events.errors()
    assert len(errors) == 1 and "Traceback" in errors[0]
    ran = {e.node.node_id for e in events.read(0, 0)[0] if e.WhichOneof("body") == "node" and e.node.state == 2}
    assert "train" not in ran  # nothing downstream of a failure starts


def test_a_node_that_runs_alone_runs_in_the_calling_thread():
    """The chain's nodes (load, roll, train) run in the step loop's own thread: a pool thread would cost two
    hand-offs per node; the concurrent branches (a, b) still run in pool threads, at the same time."""
    threads, failing = {}, {"train"}

    def handler(node, ctx):
        threads[node.node_id] = threading.current_thread()
        if node.node_id in failing:
            raise ValueError("train broke")
        return NodeResult([batch_key("j", ctx.step, node.node_id)])

    events = EventLog("j")
    with pytest.raises(NodeFailed, match="node 'train' failed at step 2"):  # reported as a pool thread's failure
        StepExecutor(graph(), lambda n: handler, events).run_step("j", 2)
    me = threading.current_thread()
    assert threads["load"] is me and threads["roll"] is me and threads["train"] is me  # was: pool threads
    assert threads["a"] is not me and threads["b"] is not me
    assert len(events.errors()) == 1


def test_concurrent_nodes_run_on_threads_kept_across_steps_until_close():
    threads: dict[int, set[threading.Thread]] = {}
    both = threading.Barrier(2, timeout=10)  # a and b really run at once

    def handler(node, ctx):
        if node.node_id in ("a", "b"):
            both.wait()
            threads.setdefault(ctx.step, set()).add(threading.current_thread())
        return NodeResult([batch_key("j", ctx.step, node.node_id)])

    executor = StepExecutor(graph(), lambda n: handler, EventLog("j"))
    for step in (1, 2, 3):
        executor.run_step("j", step)
    assert threads[1] == threads[2] == threads[3] and len(threads[1]) == 2  # no new threads per step
    assert all(t.is_alive() for t in threads[1])
    executor.close()
    assert not any(t.is_alive() for t in threads[1])
    executor.run_step("j", 4)  # a closed executor still runs steps, on fresh threads
    assert threads[4].isdisjoint(threads[1])
    executor.close()


def test_each_calling_thread_gets_its_own_node_pool():
    """The producer and consumer of an asynchronous step call run_nodes at the same time: neither queues
    behind the other's nodes."""
    names: dict[str, set[threading.Thread]] = {"p": set(), "c": set()}
    start = threading.Barrier(4, timeout=10)  # every a and b of both callers runs at once

    def handler(node, ctx):
        if node.node_id in ("a", "b"):
            start.wait()
            names[ctx.job_id].add(threading.current_thread())
        return NodeResult([batch_key(ctx.job_id, ctx.step, node.node_id)])

    executor = StepExecutor(graph(), lambda n: handler, EventLog("j"), workers=2)
    callers = [threading.Thread(target=executor.run_step, args=(j, 1)) for j in ("p", "c")]
    for t in callers:
        t.start()
    for t in callers:
        t.join(20)
    executor.close()
    assert len(names["p"]) == len(names["c"]) == 2 and names["p"].isdisjoint(names["c"])
