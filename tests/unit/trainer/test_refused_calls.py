"""Trainer calls that are refused change nothing: a non-finite or negative lr override, a batch with no loss
tokens (not a training step), and paths outside the service's roots. Each compares the weights, the step
count and the files on disk before and after, through the real gRPC servicer."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
from _worker import make_batch

from meshrl.api.common.v1 import keys_pb2, tensor_pb2, weights_pb2
from meshrl.api.trainer.v1 import trainer_pb2 as pb
from meshrl.api.trainer.v1 import trainer_pb2_grpc
from meshrl.common.codec import Batch, Ragged, merge_batches
from meshrl.common.errors import NotFound
from meshrl.common.grpc_server import ServerConfig, start_server
from meshrl.common.path_roots import PathRoots
from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.server import service
from meshrl.trainer.service import TrainerService


class DictBuffer:
    def __init__(self) -> None:
        self.batches: dict[str, Batch] = {}

    def get_many(self, keys, *, columns=(), wait_seconds=0.0, timeout=60.0) -> Batch:
        missing = [k.node_id for k in keys if k.node_id not in self.batches]
        if missing:  # as the data buffer answers
            raise NotFound(f"batch {missing[0]} is not in the data buffer")
        merged = merge_batches(self.batches[k.node_id] for k in keys)
        return Batch({c: merged.columns[c] for c in columns}) if columns else merged

    def put(self, key, columns, **_) -> int:
        self.batches[key.node_id] = Batch(dict(columns))
        return 0

    def close(self) -> None:
        self.batches.clear()


@pytest.fixture()
def trainer(qwen2_dir, tmp_path):
    cfg = TrainerConfig(server=ServerConfig(port=0), paths=PathRoots(roots=[str(qwen2_dir), str(tmp_path / "run")]))
    buffer = DictBuffer()
    svc = TrainerService(cfg, TrainerCore(), buffer)
    running = start_server(cfg.server, [service(svc)])
    channel = grpc.insecure_channel(running.address)
    stub = trainer_pb2_grpc.TrainerStub(channel)
    opt = pb.OptimizerConfig(lr=1e-3)
    stub.LoadModel(pb.LoadModelRequest(role=pb.ROLE_ACTOR, model_path=str(qwen2_dir), optimizer=opt), timeout=60)
    yield stub, buffer, svc
    channel.close()
    running.stop(0)


def _key(node: str) -> keys_pb2.BatchKey:
    return keys_pb2.BatchKey(job_id="job", step=0, node_id=node)


def _state(svc: TrainerService) -> tuple:
    status = svc.status()
    return svc.core.checksums("actor"), {r: s["train_steps"] for r, s in status["roles"].items()}


def _refused(call, code: grpc.StatusCode, text: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == code, info.value.details()
    assert text in info.value.details()


@pytest.mark.parametrize("lr", [float("inf"), float("nan"), -1e-3])
def test_a_non_finite_or_negative_lr_override_is_refused(trainer, lr):
    stub, buffer, svc = trainer
    buffer.put(_key("b"), make_batch(275))
    before = _state(svc)
    req = pb.TrainStepRequest(role=pb.ROLE_ACTOR, inputs=[_key("b")], lr_override=lr)
    _refused(lambda: stub.TrainStep(req, timeout=60), grpc.StatusCode.INVALID_ARGUMENT, "lr_override")
    assert _state(svc) == before


def test_a_batch_without_loss_tokens_is_not_a_training_step(trainer):
    stub, buffer, svc = trainer
    batch = make_batch(275, rows=4)
    empty = Ragged.from_rows([np.zeros(0, np.int32)] * 4, np.int32)
    zeros = Ragged(np.zeros(0, np.float32), empty.offsets)
    batch.update(response_ids=empty, advantages=zeros, old_logprobs=zeros, ref_logprobs=zeros)
    buffer.put(_key("empty"), batch)
    before = _state(svc)
    req = pb.TrainStepRequest(role=pb.ROLE_ACTOR, inputs=[_key("empty")])
    _refused(lambda: stub.TrainStep(req, timeout=60), grpc.StatusCode.INVALID_ARGUMENT, "no response (loss) tokens")
    assert _state(svc) == before


def test_paths_outside_the_roots_are_refused_and_nothing_is_written(trainer, tmp_path):
    stub, _, svc = trainer
    before = _state(svc)
    outside = tmp_path / "elsewhere"
    denied = grpc.StatusCode.PERMISSION_DENIED
    save = pb.SaveCheckpointRequest(role=pb.ROLE_ACTOR, path=str(outside / "ckpt"), step=1)
    _refused(lambda: stub.SaveCheckpoint(save, timeout=60), denied, "outside this service's roots")
    sneaky = pb.SaveCheckpointRequest(role=pb.ROLE_ACTOR, path=str(tmp_path / "run" / ".." / "elsewhere"), step=1)
    _refused(lambda: stub.SaveCheckpoint(sneaky, timeout=60), denied, "outside")
    publish = pb.PublishWeightsRequest(
        role=pb.ROLE_ACTOR, transport=weights_pb2.WEIGHT_TRANSPORT_DISK, version=1, disk_root=str(outside)
    )
    _refused(lambda: stub.PublishWeights(publish, timeout=60), denied, "disk_root")
    load = pb.LoadModelRequest(role=pb.ROLE_REFERENCE, model_path="/etc")
    _refused(lambda: stub.LoadModel(load, timeout=60), denied, "model_path")
    _refused(
        lambda: stub.LoadCheckpoint(pb.LoadCheckpointRequest(role=pb.ROLE_ACTOR, path="/"), timeout=60), denied, "path"
    )
    assert not outside.exists() and _state(svc) == before
    inside = pb.SaveCheckpointRequest(role=pb.ROLE_ACTOR, path=str(tmp_path / "run" / "ckpt"), step=1)
    assert stub.SaveCheckpoint(inside, timeout=60).bytes > 0


BAD, MISSING, STATE = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION)


def _every_rpc(run: str, model: str) -> list[tuple]:
    """Every trainer RPC that changes state (models, optimizer, step counts, files, buffer outputs, weight
    groups), with bad input: (method, request, code, text in the message). DestroyWeightUpdateGroup of a group
    never joined is a no-op (code None: it succeeds and changes nothing)."""
    actor, ref, critic = pb.ROLE_ACTOR, pb.ROLE_REFERENCE, pb.ROLE_CRITIC
    inputs, out = [_key("b")], _key("out")
    disk = weights_pb2.WEIGHT_TRANSPORT_DISK
    group = {"master_address": "127.0.0.1", "master_port": 1, "world_size": 2, "group_name": "g"}
    return [
        ("LoadModel", pb.LoadModelRequest(model_path=model), BAD, "role"),
        ("LoadModel", pb.LoadModelRequest(role=actor, model_path=f"{run}/none"), MISSING, "config.json"),
        ("LoadModel", pb.LoadModelRequest(role=actor, model_path=model, dtype=tensor_pb2.DTYPE_INT8), BAD, "int8"),
        (
            "LoadModel",
            pb.LoadModelRequest(role=actor, model_path=model, optimizer=pb.OptimizerConfig(lr=float("nan"))),
            BAD,
            "lr",
        ),
        ("LoadModel", pb.LoadModelRequest(role=ref, model_path=model, copy_from=critic), STATE, "critic"),
        ("ComputeLogProbs", pb.ComputeLogProbsRequest(role=ref, inputs=inputs, output=out), STATE, "no model loaded"),
        (
            "ComputeLogProbs",
            pb.ComputeLogProbsRequest(role=actor, inputs=[_key("absent")], output=out),
            MISSING,
            "absent",
        ),
        (
            "ComputeLogProbs",
            pb.ComputeLogProbsRequest(role=actor, inputs=inputs, output=out, temperature=float("nan")),
            BAD,
            "temperature",
        ),
        (
            "ComputeLogProbs",
            pb.ComputeLogProbsRequest(role=actor, inputs=inputs, output=out, micro_batch_tokens=-1),
            BAD,
            "micro_batch_tokens",
        ),
        ("ComputeValues", pb.ComputeValuesRequest(inputs=inputs, output=out), STATE, "no model loaded"),
        ("TrainStep", pb.TrainStepRequest(role=ref, inputs=inputs), STATE, "no model loaded"),
        ("TrainStep", pb.TrainStepRequest(role=actor, inputs=[_key("absent")]), MISSING, "absent"),
        ("TrainStep", pb.TrainStepRequest(role=actor, inputs=inputs, mini_batches=0), BAD, "mini_batches"),
        (
            "TrainStep",
            pb.TrainStepRequest(role=actor, inputs=inputs, loss=pb.LossConfig(clip_low=-1.0)),
            BAD,
            "clip_low",
        ),
        ("TrainStep", pb.TrainStepRequest(role=actor, inputs=inputs, micro_batch_tokens=0), BAD, "micro_batch_tokens"),
        ("SaveCheckpoint", pb.SaveCheckpointRequest(role=actor, path="", step=1), BAD, "path"),
        ("SaveCheckpoint", pb.SaveCheckpointRequest(role=actor, path=f"{run}/c", step=-1), BAD, "step"),
        ("SaveCheckpoint", pb.SaveCheckpointRequest(role=critic, path=f"{run}/c", step=1), STATE, "no model loaded"),
        ("LoadCheckpoint", pb.LoadCheckpointRequest(role=actor, path=f"{run}/none"), MISSING, "none"),
        (
            "InitWeightUpdateGroup",
            pb.InitWeightUpdateGroupRequest(group=weights_pb2.CollectiveGroup(**{**group, "world_size": 1})),
            BAD,
            "world_size",
        ),
        (
            "InitWeightUpdateGroup",
            pb.InitWeightUpdateGroupRequest(group=weights_pb2.CollectiveGroup(**group, backend=7)),
            BAD,
            "backend",
        ),
        ("DestroyWeightUpdateGroup", pb.DestroyWeightUpdateGroupRequest(group_name="nope"), None, ""),
        (
            "PublishWeights",
            pb.PublishWeightsRequest(role=actor, transport=disk, version=-1, disk_root=f"{run}/w"),
            BAD,
            "version",
        ),
        ("PublishWeights", pb.PublishWeightsRequest(role=actor, version=1, disk_root=f"{run}/w"), BAD, "transport"),
        (
            "PublishWeights",
            pb.PublishWeightsRequest(
                role=actor, transport=weights_pb2.WEIGHT_TRANSPORT_DISTRIBUTED, version=1, group_name="nope"
            ),
            MISSING,
            "nope",
        ),
        (
            "PublishWeights",
            pb.PublishWeightsRequest(role=critic, transport=disk, version=1, disk_root=f"{run}/w"),
            STATE,
            "no model loaded",
        ),
    ]


def _files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_every_mutating_trainer_rpc_refuses_bad_input_and_changes_nothing(trainer, qwen2_dir, tmp_path):
    stub, buffer, svc = trainer
    buffer.put(_key("b"), make_batch(275))
    run = tmp_path / "run"
    wrong = []
    for method, request, code, text in _every_rpc(str(run), str(qwen2_dir)):
        before = (_state(svc), sorted(svc.status()["roles"]), _files(run), sorted(buffer.batches))
        try:
            getattr(stub, method)(request, timeout=60)
            outcome = None, ""
        except grpc.RpcError as exc:
            outcome = exc.code(), exc.details()
        after = (_state(svc), sorted(svc.status()["roles"]), _files(run), sorted(buffer.batches))
        if outcome[0] != code or text not in outcome[1] or after != before:
            wrong.append(f"{method} {str(request)[:80]!r}: got {outcome}, state kept: {after == before}")
    assert not wrong, "\n".join(wrong)
