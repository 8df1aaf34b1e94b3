"""The Trainer gRPC service in-process: proto conversion, data-buffer keys, errors as status codes,
checkpoints and weight publication (disk and a gloo broadcast to a receiver)."""

from __future__ import annotations

import os
import threading

import grpc
import numpy as np
import pydantic
import pytest
import torch
from _worker import make_batch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from meshrl.api.common.v1 import keys_pb2, weights_pb2
from meshrl.api.trainer.v1 import trainer_pb2 as pb
from meshrl.api.trainer.v1 import trainer_pb2_grpc
from meshrl.common.codec import Batch, Ragged, merge_batches
from meshrl.common.errors import MODEL_NOT_LOADED, FailedPrecondition, NotFound, from_rpc_error
from meshrl.common.grpc_server import ServerConfig, start_server
from meshrl.common.net import free_port
from meshrl.common.path_roots import PathRoots
from meshrl.common.weights import WeightGroup, list_versions, read_manifest, read_version, tensor_checksums
from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.server import service
from meshrl.trainer.service import TrainerService


class MemoryBuffer:
    """The two data-buffer client calls the trainer makes, over a dict (NotFound like the real one)."""

    def __init__(self) -> None:
        self.batches: dict[tuple, Batch] = {}

    @staticmethod
    def _k(key: keys_pb2.BatchKey) -> tuple:
        return key.job_id, key.step, key.node_id, key.shard if key.has_shard else None

    def get_many(self, keys, *, columns=(), wait_seconds=0.0, timeout=60.0) -> Batch:
        for key in keys:
            if self._k(key) not in self.batches:
                raise NotFound(f"no batch {self._k(key)}")
        merged = merge_batches(self.batches[self._k(k)] for k in keys)
        return Batch({c: merged.columns[c] for c in columns}) if columns else merged

    def put(self, key, columns, **_) -> int:
        self.batches[self._k(key)] = Batch(dict(columns))
        return 0

    def close(self) -> None:
        self.batches.clear()


def key(node: str, step: int = 0) -> keys_pb2.BatchKey:
    return keys_pb2.BatchKey(job_id="job", step=step, node_id=node)


@pytest.fixture()
def served(qwen2_dir, tmp_path):
    cfg = TrainerConfig(server=ServerConfig(port=0), paths=PathRoots(roots=[str(tmp_path.parent)]))  # temp folders
    buffer = MemoryBuffer()
    trainer = TrainerService(cfg, TrainerCore(), buffer)
    running = start_server(cfg.server, [service(trainer)])
    channel = grpc.insecure_channel(running.address)
    stub = trainer_pb2_grpc.TrainerStub(channel)
    yield stub, buffer, trainer
    channel.close()
    running.stop(0)


def load_actor(stub, qwen2_dir):
    opt = pb.OptimizerConfig(lr=1e-3, warmup_steps=1)
    return stub.LoadModel(pb.LoadModelRequest(role=pb.ROLE_ACTOR, model_path=str(qwen2_dir), optimizer=opt), timeout=60)


def test_logprobs_train_status_through_grpc(served, qwen2_dir):
    stub, buffer, trainer = served
    reply = load_actor(stub, qwen2_dir)
    assert reply.architecture == "Qwen2ForCausalLM" and reply.num_parameters > 0 and reply.vocab_size == 275
    batch = make_batch(reply.vocab_size)
    buffer.put(key("rollout"), {k: batch[k] for k in ("prompt_ids", "response_ids")})
    buffer.put(key("adv"), {"advantages": batch["advantages"]})
    req = pb.ComputeLogProbsRequest(
        role=pb.ROLE_ACTOR, inputs=[key("rollout")], output=key("old"), output_name="old_logprobs", with_entropy=True
    )
    out = stub.ComputeLogProbs(req, timeout=60)
    assert out.tokens == batch["response_ids"].offsets[-1]
    written = buffer.batches[("job", 0, "old", None)].columns
    assert set(written) == {"old_logprobs", "entropy"}
    direct = trainer.core.compute_logprobs("actor", batch).values.values
    np.testing.assert_allclose(written["old_logprobs"].values, direct, atol=1e-6)
    train = pb.TrainStepRequest(
        role=pb.ROLE_ACTOR,
        inputs=[key("rollout"), key("adv"), key("old")],
        loss=pb.LossConfig(clip_high=0.28),
        mini_batches=2,
    )
    result = stub.TrainStep(train, timeout=120)
    assert result.optimizer_steps == 2 and result.metrics["lr"] == pytest.approx(1e-3)
    assert {"loss", "grad_norm", "clip_fraction", "entropy"} <= set(result.metrics)
    status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    assert status.roles[0].train_steps == 2 and status.data_parallel_size == 1 and status.device == "cpu"
    assert "actor/loss" in status.metrics


def test_errors_map_to_status_codes(served, qwen2_dir, tmp_path):
    stub, buffer, _ = served
    req = pb.ComputeLogProbsRequest(role=pb.ROLE_ACTOR, inputs=[key("rollout")], output=key("o"))
    with pytest.raises(grpc.RpcError) as err:
        stub.ComputeLogProbs(req, timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # no model loaded
    lost = from_rpc_error(err.value)  # typed: a caller tells a restarted trainer by its reason, not its message
    assert isinstance(lost, FailedPrecondition) and lost.reason == MODEL_NOT_LOADED
    load_actor(stub, qwen2_dir)
    with pytest.raises(grpc.RpcError) as err:
        stub.ComputeLogProbs(req, timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND  # the key is not in the buffer
    bad = pb.LoadModelRequest(role=pb.ROLE_REFERENCE, model_path=str(tmp_path))
    with pytest.raises(grpc.RpcError) as err:
        stub.LoadModel(bad, timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "config.json" in err.value.details()
    for loss, named in ((pb.LossConfig(clip_low=1.5), "loss.clip_low"), (pb.LossConfig(aggregation=99), "aggregation")):
        with pytest.raises(grpc.RpcError) as err:
            stub.TrainStep(pb.TrainStepRequest(role=pb.ROLE_ACTOR, inputs=[key("x")], loss=loss))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and named in err.value.details()


def test_copy_from_and_checkpoint_rpcs(served, qwen2_dir, tmp_path):
    stub, buffer, trainer = served
    load_actor(stub, qwen2_dir)
    batch = make_batch(275)
    buffer.put(key("b"), batch)
    stub.TrainStep(pb.TrainStepRequest(role=pb.ROLE_ACTOR, inputs=[key("b")], lr_override=0.01), timeout=60)
    stub.LoadModel(pb.LoadModelRequest(role=pb.ROLE_REFERENCE, copy_from=pb.ROLE_ACTOR), timeout=60)
    assert trainer.core.checksums("reference") == trainer.core.checksums("actor")  # the trained weights, not the dir's
    path = str(tmp_path / "ckpt")
    saved = stub.SaveCheckpoint(pb.SaveCheckpointRequest(role=pb.ROLE_ACTOR, path=path, step=3, data_state=b"pos"))
    assert saved.bytes > 0
    stub.TrainStep(pb.TrainStepRequest(role=pb.ROLE_ACTOR, inputs=[key("b")]), timeout=60)
    loaded = stub.LoadCheckpoint(pb.LoadCheckpointRequest(role=pb.ROLE_ACTOR, path=path))
    assert loaded.step == 3 and loaded.data_state == b"pos"
    assert trainer.core.checksums("reference") == trainer.core.checksums("actor")


def test_publish_to_disk_is_a_loadable_hf_folder(served, qwen2_dir, tmp_path):
    stub, _, trainer = served
    load_actor(stub, qwen2_dir)
    root = tmp_path / "weights"
    for version in (1, 2, 3):
        req = pb.PublishWeightsRequest(
            role=pb.ROLE_ACTOR,
            transport=weights_pb2.WEIGHT_TRANSPORT_DISK,
            version=version,
            disk_root=str(root),
            keep_last=2,
            bucket_bytes=30_000,
        )
        reply = stub.PublishWeights(req, timeout=60)
    assert [v for v, _ in list_versions(str(root))] == [2, 3]
    assert reply.disk.path == str(root / "v000003") and reply.buckets > 1 and reply.bytes > 0
    manifest, sha = read_manifest(reply.disk.path, reply.disk.manifest_sha256)
    assert manifest.version == 3 and sha == reply.disk.manifest_sha256
    # what a replica loads equals the trainer's export, and it is a loadable HF model folder
    received = dict(read_version(reply.disk.path, reply.disk.manifest_sha256))
    original = load_file(qwen2_dir / "model.safetensors")
    assert set(received) == set(original) and all(torch.equal(received[n], original[n]) for n in original)
    AutoModelForCausalLM.from_pretrained(reply.disk.path)
    sums = stub.GetWeightChecksums(pb.GetWeightChecksumsRequest(role=pb.ROLE_ACTOR), timeout=10)
    assert sums.version == 3 and dict(sums.sha256) == dict(reply.checksums.sha256)
    assert dict(sums.sha256) == tensor_checksums(received, names=list(sums.sha256))
    stale = pb.PublishWeightsRequest(
        role=pb.ROLE_ACTOR, transport=weights_pb2.WEIGHT_TRANSPORT_DISK, version=1, disk_root=str(root)
    )
    with pytest.raises(grpc.RpcError) as err:
        stub.PublishWeights(stale, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # versions never go back


def test_publish_over_a_gloo_group(served, qwen2_dir):
    stub, _, trainer = served
    load_actor(stub, qwen2_dir)
    group = weights_pb2.CollectiveGroup(
        master_address="127.0.0.1",
        master_port=free_port(),
        world_size=2,
        rank_offset=0,
        group_name="g",
        backend=weights_pb2.COMM_BACKEND_GLOO,
        timeout_seconds=60,
    )
    received: dict = {}

    def replica() -> None:  # what a rollout replica does: join as rank 1, receive one version
        member_spec = weights_pb2.CollectiveGroup()
        member_spec.CopyFrom(group)
        member_spec.rank_offset = 1
        member = WeightGroup.join(member_spec)
        try:
            received["version"] = member.receive(
                lambda version, bucket: received.update({n: t.clone() for n, t in bucket})
            )
        finally:
            member.destroy()

    thread = threading.Thread(target=replica)
    thread.start()
    assert stub.InitWeightUpdateGroup(pb.InitWeightUpdateGroupRequest(group=group), timeout=60).world_size == 2
    req = pb.PublishWeightsRequest(
        role=pb.ROLE_ACTOR,
        transport=weights_pb2.WEIGHT_TRANSPORT_DISTRIBUTED,
        version=5,
        group_name="g",
        bucket_bytes=40_000,
    )
    reply = stub.PublishWeights(req, timeout=60)
    thread.join(60)
    assert reply.buckets > 1 and received.pop("version") == 5
    original = load_file(qwen2_dir / "model.safetensors")
    assert set(received) == set(original)
    assert all(torch.equal(received[n], original[n]) for n in original)
    stub.DestroyWeightUpdateGroup(pb.DestroyWeightUpdateGroupRequest(group_name="g"), timeout=10)
    with pytest.raises(grpc.RpcError) as err:
        stub.PublishWeights(req, timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_the_actor_pass_reports_the_rollout_gap_per_version_lag(served, qwen2_dir):
    """With weight_version set and the rollout's log-probs and versions among the rows read, the actor's
    reply carries logprob_gap_lag<k> (the scheduler reads none of those columns itself)."""
    stub, buffer, trainer = served
    reply = load_actor(stub, qwen2_dir)
    batch = make_batch(reply.vocab_size)
    offsets = batch["response_ids"].offsets
    tokens = int(offsets[-1])
    rollout = np.linspace(-3.0, -0.5, tokens).astype(np.float32)
    versions = np.where(np.arange(tokens) % 3 == 0, 4, 5).astype(np.int64)
    buffer.put(
        key("rollout"),
        {
            "prompt_ids": batch["prompt_ids"],
            "response_ids": batch["response_ids"],
            "rollout_logprobs": Ragged(rollout, offsets),
            "response_versions": Ragged(versions, offsets),
        },
    )
    cols = ["prompt_ids", "response_ids", "rollout_logprobs", "response_versions"]
    req = pb.ComputeLogProbsRequest(
        role=pb.ROLE_ACTOR,
        inputs=[key("rollout")],
        output=key("old"),
        output_name="old_logprobs",
        columns=cols,
        weight_version=5,
    )
    metrics = stub.ComputeLogProbs(req, timeout=60).metrics
    old = buffer.batches[("job", 0, "old", None)].columns["old_logprobs"].values
    gap = np.abs(old - rollout)
    assert metrics["logprob_gap_lag0"] == pytest.approx(float(gap[versions == 5].mean()))
    assert metrics["logprob_gap_lag1"] == pytest.approx(float(gap[versions == 4].mean()))
    assert metrics["logprob_mismatch_mean"] == pytest.approx(float(gap.mean()), rel=1e-5)
    req.ClearField("weight_version")  # not told its version: no gap per lag
    assert not [k for k in stub.ComputeLogProbs(req, timeout=60).metrics if k.startswith("logprob_gap_lag")]


def test_a_train_step_takes_its_in_train_pi_old_at_the_requests_temperature(served, qwen2_dir):
    """TrainStep carries the rows' sampling temperature: rollout log-probs taken at 0.6 match the in-train pi_old
    pass at 0.6 (gap ~0), and a train call left at the model's own distribution (1) reports the difference."""
    stub, buffer, trainer = served
    reply = load_actor(stub, qwen2_dir)
    batch = make_batch(reply.vocab_size)
    cols = ["prompt_ids", "response_ids"]
    buffer.put(key("rollout"), {c: batch[c] for c in cols})
    req = pb.ComputeLogProbsRequest(
        role=pb.ROLE_ACTOR,
        inputs=[key("rollout")],
        output=key("behaviour"),
        output_name="rollout_logprobs",
        columns=cols,
        temperature=0.6,
    )
    stub.ComputeLogProbs(req, timeout=60)
    inputs = [key("rollout"), key("behaviour")]
    loss = pb.LossConfig(old_logprobs=pb.OLD_LOG_PROBS_IN_TRAIN, kl_coef=0.0)
    gaps = {}
    for temperature in (0.6, None):
        buffer.put(key("adv"), {"advantages": batch["advantages"]})
        train = pb.TrainStepRequest(
            role=pb.ROLE_ACTOR, inputs=[*inputs, key("adv")], loss=loss, lr_override=1e-9, temperature=temperature
        )
        gaps[temperature] = stub.TrainStep(train, timeout=60).metrics["logprob_mismatch_mean"]
    assert gaps[0.6] < 1e-5 < 1e-2 < gaps[None]
    bad = pb.TrainStepRequest(role=pb.ROLE_ACTOR, inputs=inputs, loss=loss, temperature=0.0)
    with pytest.raises(grpc.RpcError) as err:
        stub.TrainStep(bad, timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "temperature" in err.value.details()


def test_a_log_prob_pass_reads_its_rows_while_another_pass_holds_the_model(served, qwen2_dir):
    """One rank: the reference's pass reads its rows while the actor's computes (only the forward pass holds
    the trainer's lock), instead of waiting for the whole of the other call before reading."""
    stub, buffer, trainer = served
    reply = load_actor(stub, qwen2_dir)
    batch = make_batch(reply.vocab_size)
    buffer.put(key("rollout"), {k: batch[k] for k in ("prompt_ids", "response_ids")})
    read, real_get = threading.Event(), buffer.get_many

    def get_many(keys, **kwargs):
        read.set()
        return real_get(keys, **kwargs)

    buffer.get_many = get_many
    req = pb.ComputeLogProbsRequest(
        role=pb.ROLE_ACTOR, inputs=[key("rollout")], output=key("old"), output_name="old_logprobs"
    )
    with trainer._lock:  # another pass computing
        call = stub.ComputeLogProbs.future(req, timeout=60)
        assert read.wait(30)  # was: no read before the lock is free
        assert not call.done()  # ... but its forward pass waits for the model
    assert call.result().tokens == batch["response_ids"].offsets[-1]
    assert ("job", 0, "old", None) in buffer.batches


def test_one_call_runs_the_reference_pass_beside_the_actors_over_rows_read_once(served, qwen2_dir):
    """more_passes: the rows are read once, each pass writes its own key, the reply holds each pass's result,
    and the values equal those of a call per pass."""
    stub, buffer, trainer = served
    reply = load_actor(stub, qwen2_dir)
    stub.LoadModel(pb.LoadModelRequest(role=pb.ROLE_REFERENCE, model_path=str(qwen2_dir)), timeout=60)
    batch = make_batch(reply.vocab_size)
    buffer.put(key("rollout"), {k: batch[k] for k in ("prompt_ids", "response_ids")})
    reads, real_get = [], buffer.get_many
    buffer.get_many = lambda keys, **kw: reads.append(kw["columns"]) or real_get(keys, **kw)
    ref = pb.LogProbPass(role=pb.ROLE_REFERENCE, output=key("ref"), output_name="ref_logprobs")
    req = pb.ComputeLogProbsRequest(
        role=pb.ROLE_ACTOR,
        inputs=[key("rollout")],
        output=key("old"),
        output_name="old_logprobs",
        with_entropy=True,
        more_passes=[ref],
        columns=["prompt_ids", "response_ids"],
    )
    out = stub.ComputeLogProbs(req, timeout=60)
    assert len(reads) == 1 and len(out.passes) == 1
    tokens = batch["response_ids"].offsets[-1]
    assert out.tokens == tokens and out.passes[0].tokens == tokens and "entropy" in out.metrics
    assert "entropy" not in out.passes[0].metrics
    old = buffer.batches[("job", 0, "old", None)].columns
    written = buffer.batches[("job", 0, "ref", None)].columns
    assert set(old) == {"old_logprobs", "entropy"} and set(written) == {"ref_logprobs"}
    np.testing.assert_allclose(
        old["old_logprobs"].values, trainer.core.compute_logprobs("actor", batch).values.values, atol=1e-6
    )
    alone = trainer.core.compute_logprobs("reference", batch).values.values
    np.testing.assert_allclose(written["ref_logprobs"].values, alone, atol=1e-6)


@pytest.mark.parametrize(
    ("more", "named"),
    [
        ([pb.LogProbPass(role=pb.ROLE_REWARD, output=key("r"))], "more_passes[0]"),
        ([pb.LogProbPass(role=9, output=key("r"))], "more_passes[0].role"),
        ([pb.LogProbPass(role=pb.ROLE_ACTOR, output=key("old"))], "more_passes[0].output"),
        (
            [pb.LogProbPass(role=pb.ROLE_ACTOR, output=key("a")), pb.LogProbPass(role=pb.ROLE_ACTOR, output=key("a"))],
            "more_passes[1].output",
        ),
    ],
)
def test_a_bad_further_pass_is_refused_by_name_and_nothing_is_written(served, qwen2_dir, more, named):
    stub, buffer, _ = served
    load_actor(stub, qwen2_dir)
    buffer.put(key("rollout"), {k: v for k, v in make_batch(275).items() if k in ("prompt_ids", "response_ids")})
    req = pb.ComputeLogProbsRequest(role=pb.ROLE_ACTOR, inputs=[key("rollout")], output=key("old"), more_passes=more)
    with pytest.raises(grpc.RpcError) as err:
        stub.ComputeLogProbs(req, timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and named in err.value.details()
    assert list(buffer.batches) == [("job", 0, "rollout", None)]


def test_the_trainers_publication_settings_choose_the_digest_and_fsync(qwen2_dir, tmp_path, monkeypatch):
    """`publication.digest` / `publication.fsync` (TrainerConfig, e.g. `--set publication.digest=sha256`) reach
    every complete version the trainer writes; an unknown digest is refused when the config is read."""
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    for digest, fsync in (("sha256", True), ("xxh3_128", False)):
        cfg = TrainerConfig(server=ServerConfig(port=0), publication={"digest": digest, "fsync": fsync})
        trainer = TrainerService(cfg, TrainerCore(), MemoryBuffer())
        trainer.core.load_model("actor", str(qwen2_dir))
        synced.clear()
        disk = trainer.publish("actor", "disk", 1, disk_root=str(tmp_path / digest)).disk
        manifest, _ = read_manifest(disk.path, disk.manifest_sha256)
        assert manifest.digest == digest
        assert bool(synced) == fsync
        assert dict(read_version(disk.path, disk.manifest_sha256))  # the replica side verifies that digest
    with pytest.raises(pydantic.ValidationError, match="digest 'md5' is unknown"):
        TrainerConfig(publication={"digest": "md5"})
