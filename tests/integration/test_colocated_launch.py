"""The Ray launcher on a local Ray with two logical GPUs: the instances of one `share` get one bundle and each
claims half of it (so Ray's accounting shows the sharing), and each service process sees the bundle's GPU
(its CUDA_VISIBLE_DEVICES, read from /proc); services on bundles of their own each see their own GPU, not
none (the service actors claim nothing of their bundle, so the ids come from the bundle, not the actor).
Real data-buffer services on the machine's Redis stand in for any service: only where they run is checked."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from meshrl.scheduler.launch.launcher import RayLauncher, ServiceSpec  # noqa: E402
from tests._databuffer import SYSTEM_REDIS  # noqa: E402


@pytest.fixture
def launcher(tmp_path):
    if ray.is_initialized():
        ray.shutdown()
    temp = tempfile.mkdtemp(prefix="r17c", dir="/tmp")
    ray.init(
        num_cpus=4,
        num_gpus=2,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        _temp_dir=temp,
    )
    launched = RayLauncher(tmp_path, 90.0, None, "PACK")
    try:
        yield launched
    finally:
        launched.stop_all(grace=5)
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def visible_devices(pid: int) -> str:
    env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
    return env["CUDA_VISIBLE_DEVICES"]


def spec(name: str, share: str = "") -> ServiceSpec:
    return ServiceSpec("databuffer", name, ["--set", f"redis.url={SYSTEM_REDIS}"], cpus=1.0, gpus=1.0, share=share)


def test_colocated_services_share_one_bundle_and_its_gpu(launcher):
    launcher.start([spec("trainer", "colocated"), spec("rollout-0", "colocated")])
    (pg_t, loc_t), (pg_r, loc_r) = launcher.bundles["trainer"], launcher.bundles["rollout-0"]
    assert (pg_t, loc_t) == (pg_r, loc_r) and len(loc_t.gpu_ids) == 1  # one group, one bundle, one GPU
    assert len(launcher.groups) == 1 and len(launcher.groups[0]) == 1
    gpu = str(loc_t.gpu_ids[0])
    assert visible_devices(launcher.pid("trainer")) == visible_devices(launcher.pid("rollout-0")) == gpu
    # each claimed half of the bundle's GPU (and CPU): nothing of the bundle is left
    group_gpu = f"GPU_group_{pg_t}"
    assert ray.cluster_resources()[group_gpu] == 1.0
    assert ray.available_resources().get(group_gpu, 0.0) == pytest.approx(0.0)
    assert ray.available_resources().get(f"CPU_group_{pg_t}", 0.0) == pytest.approx(0.0)


def test_disaggregated_services_each_see_their_own_gpu(launcher):
    launcher.start([spec("a"), spec("b")])
    seen = {visible_devices(launcher.pid(n)) for n in ("a", "b")}
    assert seen == {"0", "1"}  # before, a service actor claiming nothing of its bundle was shown no GPU ("")
    assert launcher.bundles["a"][1].bundle_index != launcher.bundles["b"][1].bundle_index
