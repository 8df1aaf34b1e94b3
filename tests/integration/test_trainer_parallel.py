"""Megatron parallelism through the trainer service (`python -m meshrl.trainer` over gRPC, gloo, 1 thread a rank).

TP=2, PP=2 and TP=2 x DP=2 (4 processes) against one in-process TP=1 trainer with the same weights: per-token
log-probs within 1e-5; after one SGD step the same loss, grad norm, log-probs and exported HF weights within
1e-4. At TP=2 also: publication to two rollout replicas verified by checksums equal to the TP=1 trainer's,
and checkpoints saved at TP=2 resume at TP=1 and back with the same log-probs. A TP=2 trainer whose ranks torchrun starts on two
simulated hosts (127.0.0.2, 127.0.0.3) matches the TP=1 trainer the same way. The model (Qwen2-style: qkv
bias, tied embeddings, GQA, vocabulary 275 padded to 276 at TP=2) is split for real at every layout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import load_file

from meshrl.api.common.v1 import weights_pb2
from meshrl.api.trainer.v1 import trainer_pb2 as tpb
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Ragged
from meshrl.common.databuffer_client import DataBufferClient
from meshrl.common.net import free_port
from meshrl.scheduler.clients import RolloutClient, TrainerClient
from meshrl.scheduler.config import OptimSection, WeightsSection
from meshrl.scheduler.fleet.weight_sync import WeightPublisher
from meshrl.scheduler.launch.launcher import ProcessLauncher, ServiceSpec

pytestmark = pytest.mark.timeout(420)

LOSS = dict(kl_coef=0.05, entropy_coef=0.01, clip_high=0.28)
SGD = dict(name="sgd", lr=0.5, clip_grad=0.0)
MICRO = 24  # tokens per micro-batch: several micro-batches, so PP=2 runs a real 1F1B schedule


def make_batch(vocab: int, rows: int = 8, seed: int = 0) -> dict[str, Ragged]:
    rng = np.random.default_rng(seed)
    prompts = Ragged.from_rows([rng.integers(0, vocab, rng.integers(2, 9)) for _ in range(rows)], np.int32)
    responses = Ragged.from_rows([rng.integers(0, vocab, rng.integers(1, 11)) for _ in range(rows)], np.int32)
    n = int(responses.offsets[-1])
    adv = np.repeat(rng.normal(size=rows), responses.lengths()).astype(np.float32)
    noisy = lambda: Ragged((-5.6 + 0.1 * rng.normal(size=n)).astype(np.float32), responses.offsets)  # noqa: E731
    return {
        "prompt_ids": prompts,
        "response_ids": responses,
        "advantages": Ragged(adv, responses.offsets),
        "old_logprobs": noisy(),
        "ref_logprobs": noisy(),
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from meshrl.trainer.model_builder import build_small_model

    root = tmp_path_factory.mktemp("parallel")
    model = str(build_small_model(root / "model", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=3))
    launcher = ProcessLauncher(root / "logs", start_timeout=180)
    try:
        address = launcher.start(
            [ServiceSpec("databuffer", "databuffer", ["--set", f"redis.embedded.data_dir={root}/r"])]
        )
        buffer = DataBufferClient(address["databuffer"])
        batch = make_batch(275)
        buffer.put(batch_key("job", 0, "data"), batch)
        yield {
            "launcher": launcher,
            "root": root,
            "model": model,
            "buffer": buffer,
            "batch": batch,
            "buffer_address": address["databuffer"],
        }
        buffer.close()
    finally:
        launcher.stop_all(grace=10)


@pytest.fixture(scope="module")
def reference(stack):
    """The TP=1 trainer in this process: log-probs, one SGD step, log-probs and HF export after it."""
    from meshrl.trainer.core import TrainerCore
    from meshrl.trainer.losses import LossConfig
    from meshrl.trainer.optim import OptimizerConfig

    core = TrainerCore()
    core.load_model("actor", stack["model"], optimizer=OptimizerConfig(**SGD))
    batch = stack["batch"]
    out = {"checksums": core.checksums("actor")}
    out["before"] = core.compute_logprobs("actor", batch, micro_batch_tokens=MICRO).values.values
    out["metrics"] = core.train_step("actor", batch, LossConfig(**LOSS), micro_batch_tokens=MICRO).metrics
    out["after"] = core.compute_logprobs("actor", batch, micro_batch_tokens=MICRO).values.values
    out["export"] = {name: t.clone() for name, t in core.iter_hf_tensors("actor")}
    out["core"] = core
    return out


def start_trainer(stack, name: str, tp: int, pp: int, dp: int) -> TrainerClient:
    args = [
        "--set",
        f"databuffer_address={stack['buffer_address']}",
        "--set",
        f"parallel.tensor_parallel={tp}",
        "--set",
        f"parallel.pipeline_parallel={pp}",
        "--set",
        f"data_parallel.size={dp}",
        "--set",
        "torch_threads=1",
        "--set",
        "databuffer_wait_seconds=0",
        "--set",
        f"paths.roots=[{json.dumps(str(stack['root']))}]",
    ]
    address = stack["launcher"].start([ServiceSpec("trainer", name, args)])[name]
    client = TrainerClient(address, timeout=300)
    client.load_model("actor", stack["model"], "float32", OptimSection(**SGD), 0)
    return client


def served_logprobs(stack, trainer: TrainerClient, tag: str) -> np.ndarray:
    req = tpb.ComputeLogProbsRequest(
        role=tpb.ROLE_ACTOR,
        inputs=[batch_key("job", 0, "data")],
        output=batch_key("job", 0, tag),
        output_name="lp",
        micro_batch_tokens=MICRO,
    )
    trainer.stub.ComputeLogProbs(req, timeout=300)
    return stack["buffer"].get(batch_key("job", 0, tag))["lp"].values


def sgd_step(trainer: TrainerClient) -> dict[str, float]:
    reply = trainer.train_step("actor", [batch_key("job", 0, "data")], LOSS, MICRO, 1, 0)
    return dict(reply.metrics)


def exported(trainer: TrainerClient, root: Path, version: int) -> dict:
    req = tpb.PublishWeightsRequest(
        role=tpb.ROLE_ACTOR, transport=weights_pb2.WEIGHT_TRANSPORT_DISK, version=version, disk_root=str(root)
    )
    folder = Path(trainer.publish(req, timeout=300).disk.path)
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def check_against_reference(stack, reference, trainer: TrainerClient, tag: str) -> None:
    np.testing.assert_allclose(served_logprobs(stack, trainer, f"{tag}-0"), reference["before"], atol=1e-5, rtol=0)
    metrics = sgd_step(trainer)
    for key in ("loss", "grad_norm", "kl", "entropy"):
        assert metrics[key] == pytest.approx(reference["metrics"][key], abs=1e-4, rel=1e-4), key
    np.testing.assert_allclose(served_logprobs(stack, trainer, f"{tag}-1"), reference["after"], atol=1e-4, rtol=0)
    tensors = exported(trainer, stack["root"] / f"export-{tag}", 1)
    assert set(tensors) == set(reference["export"])
    for name, tensor in tensors.items():
        np.testing.assert_allclose(tensor.numpy(), reference["export"][name].numpy(), atol=1e-4, rtol=0, err_msg=name)


@pytest.mark.parametrize("tp,pp,dp", [(1, 2, 1), (2, 1, 2)], ids=["pp2", "tp2xdp2"])
def test_layout_matches_one_process(stack, reference, tp, pp, dp):
    name = f"trainer-tp{tp}pp{pp}dp{dp}"
    trainer = start_trainer(stack, name, tp, pp, dp)
    status = trainer.status()
    assert (status.tensor_parallel_size, status.pipeline_parallel_size, status.data_parallel_size) == (tp, pp, dp)
    check_against_reference(stack, reference, trainer, name)
    stack["launcher"].stop(name)


def test_tensor_parallel_publishes_checkpoints_and_matches(stack, reference):
    trainer = start_trainer(stack, "trainer-tp2", 2, 1, 1)
    # Fresh weights: the gathered TP=2 export hashes exactly like the TP=1 trainer's, and reaches two replicas.
    assert dict(trainer.checksums().sha256) == reference["checksums"]
    replicas = [f"rollout-{i}" for i in range(2)]
    specs = [
        ServiceSpec(
            "rollout",
            n,
            ["--set", f"databuffer_address={stack['buffer_address']}", "--set", f"engine.model_path={stack['model']}"],
        )
        for n in replicas
    ]
    addresses = stack["launcher"].start(specs)
    clients = [RolloutClient(addresses[n]) for n in replicas]
    publisher = WeightPublisher(
        trainer, WeightsSection(transport="distributed", timeout_seconds=60), str(stack["root"] / "published")
    )
    result = publisher.publish(clients)  # verifies every replica's checksums against the trainer's, or raises
    assert result.stale == [] and all(dict(c.checksums().sha256) == reference["checksums"] for c in clients)
    for n in replicas:
        stack["launcher"].stop(n)

    check_against_reference(stack, reference, trainer, "tp2")
    # A checkpoint saved at TP=2 resumes at TP=1 with the same log-probs, and one saved at TP=1 resumes at TP=2.
    core = reference["core"]
    saved = stack["root"] / "ckpt-tp2"
    trainer.save_checkpoint("actor", str(saved), 5, b"pos")
    written = sorted(f.name for f in saved.iterdir() if f.name.startswith(("model-", "optim-")))
    # each TP rank its own slice and optimizer state
    assert written == [
        f"{kind}-tp{t}-pp0{dp}.safetensors" for kind, dp in (("model", ""), ("optim", "-dp0")) for t in (0, 1)
    ]
    at_tp2 = served_logprobs(stack, trainer, "tp2-ckpt")
    assert core.load_checkpoint("actor", str(saved)) == (5, b"pos")
    np.testing.assert_allclose(
        core.compute_logprobs("actor", stack["batch"], micro_batch_tokens=MICRO).values.values,
        at_tp2,
        atol=1e-5,
        rtol=0,
    )
    back = stack["root"] / "ckpt-tp1"
    core.save_checkpoint("actor", str(back), step=6)
    core.train_step("actor", stack["batch"], micro_batch_tokens=MICRO)  # move away; the TP=2 trainer resumes
    assert trainer.load_checkpoint("actor", str(back)).step == 6
    sgd_step(trainer)
    core.load_checkpoint("actor", str(back))
    from meshrl.trainer.losses import LossConfig

    core.train_step("actor", stack["batch"], LossConfig(**LOSS), micro_batch_tokens=MICRO)
    expected = core.compute_logprobs("actor", stack["batch"], micro_batch_tokens=MICRO).values.values
    np.testing.assert_allclose(served_logprobs(stack, trainer, "tp2-resumed"), expected, atol=1e-4, rtol=0)
    stack["launcher"].stop("trainer-tp2")


def start_torchrun_hosts(stack, hosts: list[str], tp: int) -> tuple[list[subprocess.Popen], TrainerClient]:
    """One torchrun agent per simulated host (1 rank each, `--nnodes len(hosts)`), every rank started with the
    same trainer config; rank 0 (on hosts[0]) serves gRPC there and hosts the rendezvous. torchrun takes the
    rendezvous port as a number, so another process can take the free port chosen for it before its agent
    binds it (seen once in a full suite run): then the agents start again on another port."""
    for attempt in range(3):
        try:
            return _start_torchrun_hosts(stack, hosts, tp, free_port(hosts[0]))
        except _PortTaken:
            if attempt == 2:
                raise


class _PortTaken(Exception):
    """The rendezvous port chosen for torchrun was bound by another process first."""


def _start_torchrun_hosts(
    stack, hosts: list[str], tp: int, master: int
) -> tuple[list[subprocess.Popen], TrainerClient]:
    port_file = stack["root"] / "torchrun-trainer.port"
    config = [
        "--set",
        f"databuffer_address={stack['buffer_address']}",
        "--set",
        f"parallel.tensor_parallel={tp}",
        "--set",
        "torch_threads=1",
        "--set",
        "databuffer_wait_seconds=0",
        "--set",
        "data_parallel.launcher=environment",
        "--set",
        f"server.host={hosts[0]}",
        "--set",
        "server.port=0",
        "--set",
        f"server.port_file={port_file}",
        "--set",
        f"paths.roots=[{json.dumps(str(stack['root']))}]",
    ]
    agents = []
    for node, host in enumerate(hosts):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(len(hosts)),
            "--node-rank",
            str(node),
            "--nproc-per-node",
            "1",
            "--master-addr",
            hosts[0],
            "--master-port",
            str(master),
            "--local-addr",
            host,
            "-m",
            "meshrl.trainer",
            *config,
        ]
        log = open(stack["root"] / f"torchrun-{node}.log", "wb")  # noqa: SIM115 - the child owns it
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        agents.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
        log.close()
    deadline = time.monotonic() + 240
    while not port_file.exists():
        exited = [a.returncode for a in agents if a.poll() is not None]
        if exited or time.monotonic() > deadline:
            logs = "\n".join((stack["root"] / f"torchrun-{n}.log").read_text()[-2000:] for n in range(len(hosts)))
            stop_agents(agents)
            if f"port: {master}," in logs and "EADDRINUSE" in logs:
                raise _PortTaken(master)
            pytest.fail(f"torchrun trainer did not start (agents exited: {exited}):\n{logs}")
        time.sleep(0.2)
    client = TrainerClient(f"{hosts[0]}:{port_file.read_text().strip()}", timeout=300)
    client.load_model("actor", stack["model"], "float32", OptimSection(**SGD), 0)
    return agents, client


def stop_agents(agents: list[subprocess.Popen]) -> None:
    for agent in agents:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait(10)


def test_torchrun_ranks_on_two_hosts_match_one_process(stack, reference):
    """Ranks started by torchrun, one per simulated host (127.0.0.2, 127.0.0.3), with only the environment
    torchrun sets: rank 0 serves and drives rank 1, and the TP=2 trainer equals the TP=1 one."""
    agents, trainer = start_torchrun_hosts(stack, ["127.0.0.2", "127.0.0.3"], tp=2)
    try:
        status = trainer.status()
        assert (status.tensor_parallel_size, status.data_parallel_size) == (2, 1)
        check_against_reference(stack, reference, trainer, "torchrun")
        # SIGTERM to rank 0's host: rank 0 stops, telling rank 1 to stop, so the second host's agent ends cleanly.
        os.killpg(agents[0].pid, signal.SIGTERM)
        assert agents[1].wait(120) == 0
        agents[0].wait(60)
    finally:
        stop_agents(agents)
