"""The trainer as deployed: `python -m meshrl.trainer` with 2 data-parallel ranks, reading and writing
batches through a real data buffer (`python -m meshrl.databuffer` on the local Redis)."""

from __future__ import annotations

import os

import grpc
import numpy as np
import pytest
from _worker import LOSS, make_batch, run_steps

from meshrl.api.trainer.v1 import trainer_pb2 as pb
from meshrl.common.batch_key import batch_key
from meshrl.trainer.core import TrainerCore
from meshrl.trainer.optim import OptimizerConfig

REDIS_URL = os.environ.get("MESHRL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def test_two_rank_service_matches_one_process(two_rank_trainer, qwen2_dir):
    stub, buffer = two_rank_trainer.stub, two_rank_trainer.buffer
    opt = pb.OptimizerConfig(lr=1e-3, warmup_steps=2)
    stub.LoadModel(pb.LoadModelRequest(role=pb.ROLE_ACTOR, model_path=str(qwen2_dir), optimizer=opt), timeout=180)
    batch = make_batch(275)
    buffer.put(batch_key("job", 0, "data"), batch)
    loss = pb.LossConfig(kl_coef=LOSS["kl_coef"], entropy_coef=LOSS["entropy_coef"], clip_high=LOSS["clip_high"])
    req = pb.TrainStepRequest(
        role=pb.ROLE_ACTOR, inputs=[batch_key("job", 0, "data")], loss=loss, micro_batch_tokens=24, mini_batches=2
    )
    served = [dict(stub.TrainStep(req, timeout=180).metrics) for _ in range(2)]
    out = pb.ComputeLogProbsRequest(
        role=pb.ROLE_ACTOR,
        inputs=[batch_key("job", 0, "data")],
        output=batch_key("job", 0, "lp"),
        output_name="old_logprobs",
        micro_batch_tokens=24,
        more_passes=[pb.LogProbPass(role=pb.ROLE_ACTOR, output=batch_key("job", 0, "lp2"), output_name="again")],
    )
    reply = stub.ComputeLogProbs(out, timeout=180)  # two passes in one call, on every rank
    assert reply.tokens == reply.passes[0].tokens == batch["response_ids"].offsets[-1]
    written = buffer.get(batch_key("job", 0, "lp"))["old_logprobs"]
    np.testing.assert_array_equal(buffer.get(batch_key("job", 0, "lp2"))["again"].values, written.values)

    core = TrainerCore()
    core.load_model("actor", str(qwen2_dir), optimizer=OptimizerConfig(lr=1e-3, warmup_steps=2))
    local = run_steps(core, batch)
    for mine, theirs in zip(local, served, strict=True):
        for k in ("loss", "grad_norm", "kl", "entropy", "clip_fraction", "lr"):
            assert theirs[k] == pytest.approx(mine[k], rel=1e-4, abs=1e-6), k
    expected = core.compute_logprobs("actor", batch, micro_batch_tokens=24).values
    np.testing.assert_allclose(written.values, expected.values, atol=1e-4)
    status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    assert status.data_parallel_size == 2 and status.roles[0].train_steps == 4
    with pytest.raises(grpc.RpcError) as err:  # a key that is not in the buffer: NOT_FOUND on every rank, no hang
        stub.TrainStep(pb.TrainStepRequest(role=pb.ROLE_ACTOR, inputs=[batch_key("job", 9, "nope")]), timeout=60)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert stub.GetStatus(pb.GetStatusRequest(), timeout=10).roles[0].train_steps == 4
