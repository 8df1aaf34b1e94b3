"""Where SaveCheckpoint may write: a folder inside the trainer's roots, never a root itself, and it replaces only
an earlier checkpoint; a folder that is not one (a run folder, someone's data) is refused and left as it was,
through the real gRPC servicer."""

from __future__ import annotations

import grpc
import pytest

from meshrl.api.trainer.v1 import trainer_pb2 as pb
from meshrl.api.trainer.v1 import trainer_pb2_grpc
from meshrl.common.grpc_server import ServerConfig, start_server
from meshrl.common.path_roots import PathRoots
from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.server import service
from meshrl.trainer.service import TrainerService


@pytest.fixture()
def stub(qwen2_dir, tmp_path):
    root = tmp_path / "run"
    root.mkdir()
    cfg = TrainerConfig(server=ServerConfig(port=0), paths=PathRoots(roots=[str(qwen2_dir), str(root)]))
    running = start_server(cfg.server, [service(TrainerService(cfg, TrainerCore(), None))])
    channel = grpc.insecure_channel(running.address)
    stub = trainer_pb2_grpc.TrainerStub(channel)
    stub.LoadModel(pb.LoadModelRequest(role=pb.ROLE_ACTOR, model_path=str(qwen2_dir)), timeout=60)
    yield stub, root
    channel.close()
    running.stop(0)


def _save(stub, path) -> pb.SaveCheckpointResponse:
    return stub.SaveCheckpoint(pb.SaveCheckpointRequest(role=pb.ROLE_ACTOR, path=str(path), step=1), timeout=60)


def test_a_root_itself_or_a_folder_that_is_not_a_checkpoint_is_never_replaced(stub):
    stub, root = stub
    (root / "notes.txt").write_text("keep me")
    data = root / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("{}\n")
    for path, code in ((root, grpc.StatusCode.PERMISSION_DENIED), (data, grpc.StatusCode.FAILED_PRECONDITION)):
        with pytest.raises(grpc.RpcError) as info:
            _save(stub, path)
        assert info.value.code() == code, info.value.details()
    assert (root / "notes.txt").read_text() == "keep me" and (data / "train.jsonl").read_text() == "{}\n"
    first = _save(stub, root / "ckpt" / "step_1")
    again = _save(stub, root / "ckpt" / "step_1")  # an earlier checkpoint is replaced
    assert first.bytes > 0 and again.bytes == first.bytes
    assert sorted(p.name for p in (root / "ckpt").iterdir()) == ["step_1"]
