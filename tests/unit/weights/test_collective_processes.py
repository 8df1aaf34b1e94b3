"""Weight updates between spawned processes: gloo and disk to two replicas, and a replica frozen
with SIGSTOP in the middle of a distributed update."""

from __future__ import annotations

import os
import signal

import _weights_workers as workers
import pytest
from _members import Members

from meshrl.common.net import free_port
from meshrl.common.weights import GroupPlan, write_version


@pytest.fixture
def members():
    m = Members()
    yield m
    m.close()


def test_gloo_updates_reach_two_replicas_bit_exact(members):
    plan = GroupPlan.build([("r1", 1), ("r2", 1)], "127.0.0.1", free_port(), "happy", "gloo", 30.0)
    members.start("sender", workers.happy_sender, plan, members.results)
    for rid in ("r1", "r2"):
        members.start(rid, workers.happy_receiver, plan, rid, members.results)
    acks, trainer_sums = members.get("sender", "done")
    assert acks == [(1, 2), (1, 2), [1, 2], (1, 2)]  # v1, v2, v1 again refused by both, v3
    for rid in ("r1", "r2"):
        steps, sums = members.get(rid, "done")
        assert steps[0] == (1, True) and steps[1] == (2, True)
        assert steps[2] == ("InvalidArgument", 2, True)  # older version refused, v2 still served
        assert steps[3] == (3, True)
        assert sums == trainer_sums  # every tensor, bit for bit


def test_disk_update_reaches_two_replicas_bit_exact(members, tmp_path):
    disk = write_version(str(tmp_path / "weights"), 1, workers.make_tensors(1), keep_last=2)
    for rid in ("r1", "r2"):
        staging = str(tmp_path / f"local-{rid}") if rid == "r2" else ""
        members.start(rid, workers.disk_receiver, disk.SerializeToString(), staging, members.results, rid)
    expected = workers._all_checksums(workers.make_tensors(1))
    for rid in ("r1", "r2"):
        version, same, sums = members.get(rid, "done")
        assert version == 1 and same and sums == expected
    assert os.path.isfile(tmp_path / "local-r2" / "v000001" / "manifest.json")


def test_frozen_replica_is_named_and_the_others_continue(members, tmp_path):
    timeout = 4.0
    plan = GroupPlan.build([("r1", 1), ("r2", 1)], "127.0.0.1", free_port(), "g1", "gloo", timeout)
    commands = {role: members.queue() for role in ("sender", "r1", "r2")}
    members.start("sender", workers.frozen_sender, plan, str(tmp_path / "w"), commands["sender"], members.results)
    for rid in ("r1", "r2"):
        members.start(rid, workers.frozen_receiver, plan, rid, rid == "r2", commands[rid], members.results)
    assert members.get("r1", "v1") and members.get("r2", "v1")

    pid = members.get("r2", "freezing")
    os.kill(pid, signal.SIGSTOP)
    elapsed, unresponsive, message = members.get("sender", "v2")
    assert unresponsive == (2,), message
    assert elapsed < timeout + 1.5 + 6.0, f"the failed update took {elapsed:.1f}s, over its deadline"
    assert plan.replicas_of(unresponsive) == ["r2"]

    # the scheduler's recovery: a fresh group of the others, the update redone for them
    fresh = plan.without(["r2"], free_port(), "g2")
    commands["sender"].put(fresh)
    commands["r1"].put(("rejoin", fresh))
    outcome_r1 = members.get("r1", "v2")
    assert outcome_r1[0] in ("ok", "Unavailable", "DeadlineExceeded")
    acked, disk = members.get("sender", "redo")
    assert acked == (1,)
    assert members.get("r1", "final") == (2, True)

    # the frozen replica wakes up: its update failed, it is stale, and a refit from disk fixes it
    os.kill(pid, signal.SIGCONT)
    commands["r2"].put("continue")
    kind, served, touched = members.get("r2", "v2")
    assert kind in ("Unavailable", "DeadlineExceeded") and served == 1
    commands["r2"].put(("refit", disk))
    assert members.get("r2", "final") == (2, True)
