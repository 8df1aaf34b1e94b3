"""Colocated mode's order of sleeping and waking (meshrl.scheduler.step.job.colocate), driven through the real step
executor on the built-in GRPO workflow: replicas and trainer record every call they get into one log, and
the test checks the sequence (rollout generates awake; replicas release; trainer onloads; trainer nodes;
replicas resume weights; publication; trainer offloads; replicas resume KV), the metrics it reports, and
that a workflow which would generate after training is refused before anything runs."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from meshrl.common.errors import ConfigError
from meshrl.scheduler.events import EventLog
from meshrl.scheduler.step.dag.executor import NodeResult, StepExecutor
from meshrl.scheduler.step.job.colocate import Phase, Turns, check_colocated_workflow, node_phase
from meshrl.scheduler.workflow import load_builtin

MIB = 1 << 20


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def add(self, call: str) -> None:
        with self.lock:
            self.calls.append(call)


class FakeReplica:
    """Answers like Rollout.ReleaseMemory / ResumeMemory: resident memory drops while released."""

    def __init__(self, log: Recorder, address: str) -> None:
        self.log, self.address, self.released = log, address, set()

    def _reply(self, before: int):
        after = 300 * MIB if "weights" in self.released else 600 * MIB
        return SimpleNamespace(
            released=sorted(self.released), resident_bytes_before=before, resident_bytes_after=after, seconds=0.01
        )

    def release_memory(self, tags=()):
        before = 300 * MIB if "weights" in self.released else 600 * MIB
        self.released |= set(tags or ("weights", "kv_cache"))
        self.log.add(f"{self.address}.release({','.join(tags) or 'all'})")
        return self._reply(before)

    def resume_memory(self, tags=()):
        self.released -= set(tags)
        self.log.add(f"{self.address}.resume({','.join(tags)})")
        return self._reply(0)


class FakeTrainer:
    def __init__(self, log: Recorder) -> None:
        self.log = log

    def offload(self):
        self.log.add("trainer.offload")
        return SimpleNamespace(bytes=8 * MIB, seconds=0.02, device="cpu")

    def onload(self):
        self.log.add("trainer.onload")
        return SimpleNamespace(bytes=8 * MIB, seconds=0.02, device="cpu")


def _run_steps(steps: int):
    log = Recorder()
    replicas = [FakeReplica(log, "r0"), FakeReplica(log, "r1")]
    turns = Turns(lambda: replicas, FakeTrainer(log))
    nodes = load_builtin("grpo").nodes
    check_colocated_workflow(nodes)

    def handler_for(node):
        def handler(n, ctx):
            phase = node_phase(n)
            if phase == Phase.GENERATE:  # generation needs awake replicas, training needs them asleep
                assert all(not r.released for r in replicas), n.node_id
            if phase == Phase.TRAIN:
                assert all(r.released == {"weights", "kv_cache"} for r in replicas), n.node_id
            log.add(f"node.{n.node_id}")
            return NodeResult()

        return handler

    executor = StepExecutor(nodes, turns.wrap(handler_for), EventLog("colocate"))
    turns.sleep_replicas()  # at the start of the job, before the trainer loads its models
    turns.publish(lambda: log.add("publish"))  # the first publication wakes them
    metrics = []
    for step in range(1, steps + 1):
        executor.run_step("colocate", step)
        turns.publish(lambda: log.add("publish"))
        metrics.append(turns.metrics())
    return log.calls, metrics


def test_colocated_step_sleeps_and_wakes_in_order():
    calls, metrics = _run_steps(2)
    start = [
        "r0.release(all)",
        "r1.release(all)",
        "r0.resume(weights)",
        "r1.resume(weights)",
        "publish",
        "trainer.offload",
        "r0.resume(kv_cache)",
        "r1.resume(kv_cache)",
    ]
    assert calls[: len(start)] == start
    step = calls[len(start) : len(start) + (len(calls) - len(start)) // 2]
    generate = step.index("node.rollout")
    assert step[:generate] == ["node.data_load"]  # data_load and rollout run awake, before anything sleeps
    sleep = step.index("r0.release(all)")
    assert step[sleep : sleep + 3] == ["r0.release(all)", "r1.release(all)", "trainer.onload"]
    trainer_nodes = [i for i, c in enumerate(step) if c in ("node.old_logprob", "node.ref_logprob", "node.actor_train")]
    assert len(trainer_nodes) == 3 and min(trainer_nodes) > sleep + 2
    assert step[max(trainer_nodes) :] == [
        "node.actor_train",
        "r0.resume(weights)",
        "r1.resume(weights)",
        "publish",
        "trainer.offload",
        "r0.resume(kv_cache)",
        "r1.resume(kv_cache)",
    ]
    assert calls[len(start) + len(step) :] == step  # the second step runs the same sequence
    for m in metrics:  # two replicas: 2 x 600 MiB awake, 2 x 300 MiB asleep
        assert m["colocate/replica_rss_awake_mib"] == 1200 and m["colocate/replica_rss_asleep_mib"] == 600
        assert m["colocate/trainer_offloaded_mib"] == 8 and m["colocate/release_seconds"] > 0


def test_trainer_only_lends_the_device_between_steps():
    log = Recorder()
    replica = FakeReplica(log, "r0")
    turns = Turns(lambda: [replica], FakeTrainer(log))
    turns.sleep_replicas()
    turns.publish(lambda: log.add("publish"))
    log.calls.clear()
    with turns.trainer_only():
        assert replica.released == {"kv_cache"}  # its weights stay: no publication is needed to wake it
        log.add("checkpoint")
    assert log.calls == [
        "r0.release(kv_cache)",
        "trainer.onload",
        "checkpoint",
        "trainer.offload",
        "r0.resume(kv_cache)",
    ]
    assert not replica.released and turns.phase == Phase.GENERATE


def test_a_failed_publication_still_gives_the_kv_cache_back():
    log = Recorder()
    replica = FakeReplica(log, "r0")
    turns = Turns(lambda: [replica], FakeTrainer(log))
    turns.sleep_replicas()

    def fail():
        raise RuntimeError("publication failed")

    with pytest.raises(RuntimeError):
        turns.publish(fail)
    assert log.calls == ["r0.release(all)", "r0.resume(weights)", "r0.resume(kv_cache)"]
    assert turns.phase == Phase.GENERATE


def test_generation_after_training_is_refused_before_the_job_starts():
    nodes = [
        n.model_copy(update={"dependencies": ["data_load"]}) if n.node_id == "old_logprob" else n
        for n in load_builtin("grpo").nodes
    ]  # old_logprob no longer waits for the rollout
    with pytest.raises(ConfigError, match="old_logprob.*does not wait for ROLLOUT"):
        check_colocated_workflow(nodes)
