"""Placement groups on a simulated two-node Ray cluster (`ray.cluster_utils.Cluster`, 2 logical GPUs per
node): bundles ordered node by node and device by device, PACK vs SPREAD, infeasible STRICT_PACK, and an
actor pinned to its bundle.

Everything stays on loopback: Ray's "no multi-node" switch (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0) makes every
node and the driver use 127.0.0.1 (giving only the nodes 127.0.0.1 leaves the driver looking for the GCS at
the machine's interface address). The cluster gets its own short temp dir (Unix socket paths are limited)
and is shut down by the fixture.
"""

from __future__ import annotations

import shutil
import tempfile
import time

import pytest

ray = pytest.importorskip("ray")
from ray._private import ray_constants  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from meshrl.common.errors import InvalidArgument, ResourceExhausted  # noqa: E402
from meshrl.scheduler.launch.placement import (  # noqa: E402
    BundleStrategy,
    create_worker_bundles,
    detect_cluster,
    launch_pinned,
    worker_bundle,
)
from meshrl.scheduler.planning.apportion import ClusterSpec  # noqa: E402
from meshrl.scheduler.planning.planner import Placement, PlanOptions, plan_workflow  # noqa: E402
from meshrl.scheduler.workflow import load_builtin  # noqa: E402

GPU = worker_bundle(cpus=0.1, gpus=1)


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    temp = tempfile.mkdtemp(prefix="mrlray", dir="/tmp")
    patch = pytest.MonkeyPatch()
    patch.setenv("RAY_TMPDIR", temp)
    patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    patch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    sim = None
    try:
        sim = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 2, "include_dashboard": False})
        sim.add_node(num_cpus=2, num_gpus=2)
        ray.init(address=sim.address, namespace="meshrl-placement-test", log_to_driver=False)
        yield sim
    finally:
        ray.shutdown()
        if sim is not None:
            sim.shutdown()
        patch.undo()
        shutil.rmtree(temp, ignore_errors=True)


def _wait_all_free(timeout_s: float = 30.0) -> None:
    """Released groups give their resources back asynchronously; SPREAD and PACK decide on what is free."""
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("GPU", 0) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("GPU", 0) == 4


def _where_actor():
    """An actor class defined in a function, so Ray ships it by value (test modules are not importable)."""

    class Where:
        def where(self):
            return ray.get_runtime_context().get_node_id(), tuple(int(g) for g in ray.get_gpu_ids())

    return ray.remote(Where)


def test_detect_cluster(cluster):
    assert detect_cluster("GPU") == ClusterSpec(2, 2, "GPU")


def test_pack_orders_bundles_node_by_node_and_pins_actors(cluster):
    _wait_all_free()
    bundles = create_worker_bundles(4, GPU, BundleStrategy.PACK, name="pack4", timeout_s=60)
    try:
        locs = bundles.locations
        assert len(bundles) == 4 and len(bundles.node_ids()) == 2
        # node by node: workers 0-1 on one node, 2-3 on the other, GPU ids ascending within a node
        assert locs[0].node_id == locs[1].node_id != locs[2].node_id == locs[3].node_id
        assert [loc.gpu_ids for loc in locs] == [(0,), (1,), (0,), (1,)]
        assert sorted(loc.bundle_index for loc in locs) == [0, 1, 2, 3]
        assert all(loc.node_ip == "127.0.0.1" for loc in locs)
        bundles.check_layout(ClusterSpec(2, 2))
        # a plan's worker w lives in bundle w: the actor pinned there reports that bundle's node and GPU
        plan = plan_workflow(load_builtin("grpo"), ClusterSpec(2, 2), PlanOptions(placement=Placement.DISAGGREGATED))
        actor_worker = plan.model("actor").workers[0].index
        where = _where_actor()
        pinned = {w: launch_pinned(where, bundles, w) for w in (0, actor_worker)}
        for w, actor in pinned.items():
            assert ray.get(actor.where.remote(), timeout=60) == (locs[w].node_id, locs[w].gpu_ids)
        with pytest.raises(InvalidArgument):
            launch_pinned(where, bundles, 4)
    finally:
        bundles.release()


def test_pack_vs_spread(cluster):
    _wait_all_free()
    packed = create_worker_bundles(2, GPU, "PACK", timeout_s=60)
    try:
        assert len(packed.node_ids()) == 1
        assert [loc.gpu_ids for loc in packed.locations] == [(0,), (1,)]
    finally:
        packed.release()
    _wait_all_free()
    spread = create_worker_bundles(2, GPU, "SPREAD", timeout_s=60)
    try:
        assert len(spread.node_ids()) == 2
        assert [loc.gpu_ids for loc in spread.locations] == [(0,), (0,)]
        with pytest.raises(Exception, match="did not land node by node"):
            spread.check_layout(ClusterSpec(1, 2))
    finally:
        spread.release()


def test_strict_pack_that_cannot_fit_is_refused(cluster):
    with pytest.raises(ResourceExhausted) as info:
        create_worker_bundles(3, GPU, BundleStrategy.STRICT_PACK, name="too-big", timeout_s=2)
    assert "could not be placed within 2s" in str(info.value) and "'GPU': 4.0" in str(info.value)
    table = ray.util.placement_group_table()
    assert all(pg["state"] == "REMOVED" for pg in table.values() if pg["name"] == "too-big")
    with pytest.raises(InvalidArgument):
        create_worker_bundles(2, GPU, "STRICT_SPREADISH")
