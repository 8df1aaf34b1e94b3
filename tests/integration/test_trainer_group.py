"""A trainer group on a local Ray instance: TP=2 ranks as two Ray actors on their own bundles, started with
the trainer's environment launcher; a rank killed under it is reported at once (and named when the group is
asked), the group is recreated and serves again, teardown leaves no rank process; bundles that cannot be placed
fail naming them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path

import pytest

from meshrl.common.errors import ResourceExhausted
from meshrl.scheduler.clients import TrainerClient
from meshrl.scheduler.config import OptimSection

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def local_ray():
    import ray

    from meshrl.scheduler.launch.local_ray import init_local_ray

    temp_dir = tempfile.mkdtemp(prefix="mrlgrp-", dir="/tmp")  # short: Ray's socket paths have a length limit
    init_local_ray(ray, num_cpus=4, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir)
    try:
        yield ray
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from meshrl.trainer.model_builder import build_small_model

    root = tmp_path_factory.mktemp("group")
    path = build_small_model(root / "model", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=3)
    return root, str(path)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def test_group_lifecycle_reports_a_dead_rank_and_recreates(local_ray, model):
    from meshrl.scheduler.launch.trainer_group import TrainerGroup

    root, path = model
    lost: list[tuple[int, str]] = []
    reported = threading.Event()

    def on_exit(rank: int, what: str) -> None:
        lost.append((rank, what))
        reported.set()

    args = [
        "--set",
        "parallel.tensor_parallel=2",
        "--set",
        "torch_threads=1",
        "--set",
        f"paths.roots=[{json.dumps(str(root))}]",
    ]
    group = TrainerGroup(args, 2, root / "logs", {"CPU": 1}, workers=["n0:0", "n0:1"], timeout=120, on_exit=on_exit)
    try:
        status = TrainerClient(group.create(), timeout=60).status()
        assert (status.tensor_parallel_size, status.data_parallel_size) == (2, 1)
        placed = [p.as_dict() for p in group.placements]
        assert [p["rank"] for p in placed] == [0, 1] and [p["worker"] for p in placed] == ["n0:0", "n0:1"]
        assert len({p["bundle"] for p in placed}) == 2 and all(p["devices"] == [] for p in placed)
        assert (root / "logs" / "trainer.log").exists() and (root / "logs" / "trainer-rank1.log").exists()

        first = group.pids
        os.kill(first[1], signal.SIGKILL)
        assert reported.wait(60), "the killed rank was not reported"
        assert lost[0][0] == 1 and "signal SIGKILL" in lost[0][1]
        assert group.lost_rank(30).startswith("rank 1 on ") and group.lost_rank(30).endswith("has ended")

        client = TrainerClient(group.recreate(), timeout=60)
        assert client.status().tensor_parallel_size == 2 and group.lost_rank(30) is None
        assert set(group.pids).isdisjoint(first) and not any(_running(pid) for pid in first)
        assert len(lost) == 1  # the planned teardown of the first group reported nothing
        client.load_model("actor", path, "float32", OptimSection(), 0)  # both ranks answer rank 0's commands
    finally:
        pids = group.pids
        group.teardown(grace=5)
    assert group.actors == [] and group.bundles is None
    assert not any(_running(pid) for pid in pids)


def test_bundles_that_cannot_be_placed_fail_naming_them(local_ray, model):
    from meshrl.scheduler.launch.trainer_group import TrainerGroup

    root, _ = model
    pin = {"node:203.0.113.9": 0.001}  # a node this cluster does not have
    group = TrainerGroup([], 1, root / "logs", {"CPU": 1}, [pin], timeout=2)
    with pytest.raises(ResourceExhausted, match=r"1 x \{'CPU': 1\} pinned to \[\['node:203.0.113.9'\]\]"):
        group.create()
    assert group.actors == [] and group.bundles is None
