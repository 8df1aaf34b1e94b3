"""Bounds on what one trainer call reads and computes, against a real data buffer service: a TrainStep (or any
call reading several input batches) that lists one batch twice is refused (INVALID_ARGUMENT naming the batch)
instead of concatenating its rows twice, and trains nothing (two different batches carrying the same column are
refused too); a ComputeLogProbs with more than MAX_MORE_PASSES further passes is refused before any pass runs."""

from __future__ import annotations

import grpc
import pytest
from _worker import make_batch

from meshrl.api.common.v1 import keys_pb2
from meshrl.api.trainer.v1 import trainer_pb2 as pb
from meshrl.api.trainer.v1 import trainer_pb2_grpc
from meshrl.common.errors import InvalidArgument
from meshrl.common.grpc_server import ServerConfig, start_server
from meshrl.common.path_roots import PathRoots
from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.server import MAX_MORE_PASSES, service
from meshrl.trainer.service import TrainerService
from tests._databuffer import served_client


def _key(node: str, shard: int | None = None) -> keys_pb2.BatchKey:
    if shard is None:
        return keys_pb2.BatchKey(job_id="job", step=0, node_id=node)
    return keys_pb2.BatchKey(job_id="job", step=0, node_id=node, shard=shard, has_shard=True)


@pytest.fixture()
def buffer():
    with served_client("repeated") as client:
        yield client


def test_the_client_refuses_a_key_listed_twice(buffer):
    batch = make_batch(64, rows=4)
    buffer.put(_key("adv"), batch)
    buffer.put(_key("adv2"), batch)
    buffer.put(_key("sharded", 0), batch)
    for keys in ([_key("adv"), _key("adv")], [_key("sharded", 0), _key("adv2"), _key("sharded", 0)]):
        with pytest.raises(InvalidArgument, match="is listed twice") as info:
            buffer.get_many(keys)
        assert info.value.field == "inputs"
    with pytest.raises(InvalidArgument, match="written by two upstream nodes"):
        buffer.get_many([_key("adv"), _key("adv2")])
    assert len(buffer.get_many([_key("adv")]).columns["advantages"]) == 4


@pytest.fixture()
def trainer(buffer, qwen2_dir):
    cfg = TrainerConfig(server=ServerConfig(port=0), paths=PathRoots(roots=[str(qwen2_dir)]))
    svc = TrainerService(cfg, TrainerCore(), buffer)
    running = start_server(cfg.server, [service(svc)])
    try:
        with grpc.insecure_channel(running.address) as channel:
            stub = trainer_pb2_grpc.TrainerStub(channel)
            opt = pb.OptimizerConfig(lr=1e-3)
            stub.LoadModel(
                pb.LoadModelRequest(role=pb.ROLE_ACTOR, model_path=str(qwen2_dir), optimizer=opt), timeout=60
            )
            buffer.put(_key("b"), make_batch(275))
            yield stub, svc
    finally:
        running.stop(0)


def _refused(call, text: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and text in info.value.details(), info.value


def test_a_train_step_over_a_repeated_batch_trains_nothing(trainer):
    stub, svc = trainer
    before = svc.core.checksums("actor")
    request = pb.TrainStepRequest(role=pb.ROLE_ACTOR, inputs=[_key("b"), _key("b")])
    _refused(lambda: stub.TrainStep(request, timeout=60), "listed twice")
    assert svc.core.checksums("actor") == before


def test_more_passes_than_the_cap_are_refused_before_any_runs(trainer, buffer):
    stub, _ = trainer
    passes = [pb.LogProbPass(role=pb.ROLE_ACTOR, output=_key(f"p{i}")) for i in range(MAX_MORE_PASSES + 1)]
    request = pb.ComputeLogProbsRequest(role=pb.ROLE_ACTOR, inputs=[_key("b")], output=_key("out"), more_passes=passes)
    _refused(lambda: stub.ComputeLogProbs(request, timeout=60), f"more than {MAX_MORE_PASSES}")
    assert [k.node_id for k in buffer.list("job", 0)] == ["b"]  # nothing written
    request.ClearField("more_passes")
    request.more_passes.extend(passes[:2])
    stub.ComputeLogProbs(request, timeout=60)  # within the cap: runs
