"""Rollout calls that are refused change nothing, and a call whose caller left stops its work: an unknown
collective group leaves the replica serving, weight paths outside the roots are refused, GenerateBatch past
its bounds is refused before generating, and an expired GenerateBatch cancels its requests."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from meshrl.api.common.v1 import weights_pb2
from meshrl.api.rollout.v1 import rollout_pb2 as pb
from meshrl.api.rollout.v1 import rollout_pb2_grpc
from meshrl.common import batch_schema as S
from meshrl.common.batch_key import batch_key
from meshrl.common.codec import Ragged
from meshrl.common.errors import InvalidArgument, NotFound
from meshrl.common.grpc_channel import open_channel
from meshrl.common.grpc_server import ServerConfig, start_server
from meshrl.common.path_roots import PathRoots
from meshrl.rollout.limits import RequestLimits
from meshrl.rollout.replica import RolloutReplica
from meshrl.rollout.server import service
from tests._databuffer import served_client


@pytest.fixture(scope="module")
def buffer():
    with served_client("rollout-refused") as client:
        yield client


@pytest.fixture()
def served(model_dir, new_engine, buffer, tmp_path):
    engine = new_engine(model_dir, max_batch_size=8)
    limits = RequestLimits(max_n=8, max_rows=4, max_samples=16, max_stop_token_ids=4)
    replica = RolloutReplica(engine, replica_id="r", capacity=8, databuffer=buffer, buffer_wait_s=5, limits=limits)
    replica.mark_serving()
    running = start_server(ServerConfig(port=0), [service(replica, PathRoots(roots=[str(tmp_path / "run")]))])
    channel = open_channel(running.address)
    yield rollout_pb2_grpc.RolloutStub(channel), replica
    channel.close()
    running.stop(0)


def _status(stub) -> tuple:
    s = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    return s.state, s.weight_version


def _refused(call, code: grpc.StatusCode, text: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == code, info.value.details()
    assert text in info.value.details(), info.value.details()


def _generates(stub) -> None:
    req = pb.GenerateRequest(prompt_ids=[1, 2, 3], sampling=pb.SamplingParams(max_tokens=2, temperature=0))
    assert sum(len(c.token_ids) for c in stub.GenerateStream(req, timeout=30)) >= 1


def test_an_unknown_collective_group_leaves_the_replica_serving(served):
    stub, _ = served
    before = _status(stub)
    req = pb.UpdateWeightsFromDistributedRequest(group_name="no-such-group", version=1, timeout_seconds=5)
    _refused(lambda: stub.UpdateWeightsFromDistributed(req, timeout=30), grpc.StatusCode.NOT_FOUND, "no-such-group")
    assert _status(stub) == before == (pb.REPLICA_STATE_SERVING, 0)
    _generates(stub)


def test_weight_and_staging_paths_outside_the_roots_are_refused(served, tmp_path):
    stub, _ = served
    before = _status(stub)
    denied = grpc.StatusCode.PERMISSION_DENIED
    outside = pb.UpdateWeightsFromDiskRequest(weights=weights_pb2.DiskWeights(path="/etc", version=1))
    _refused(lambda: stub.UpdateWeightsFromDisk(outside, timeout=30), denied, "weights.path")
    dotdot = str(tmp_path / "run" / ".." / "x")
    escape = pb.UpdateWeightsFromDiskRequest(weights=weights_pb2.DiskWeights(path=dotdot, version=1))
    _refused(lambda: stub.UpdateWeightsFromDisk(escape, timeout=30), denied, "outside")
    staging = weights_pb2.DiskWeights(path=str(tmp_path / "run" / "v1"), version=1, local_staging_dir="/tmp/elsewhere")
    req = pb.UpdateWeightsFromDiskRequest(weights=staging)
    _refused(lambda: stub.UpdateWeightsFromDisk(req, timeout=30), denied, "local_staging_dir")
    assert _status(stub) == before
    _generates(stub)


def _put_prompts(buffer, name: str, rows: int):
    key = batch_key("job-lim", 0, name)
    buffer.put(key, {S.PROMPT_IDS: Ragged.from_rows([[1, 2, 3]] * rows, dtype=np.int32)})
    return key


@pytest.mark.parametrize(
    "rows,n,stop,code,text",
    [
        (2, 9, 0, grpc.StatusCode.RESOURCE_EXHAUSTED, "max_n"),
        (5, 1, 0, grpc.StatusCode.RESOURCE_EXHAUSTED, "max_rows"),
        (4, 5, 0, grpc.StatusCode.RESOURCE_EXHAUSTED, "max_samples"),
        (1, 1, 5, grpc.StatusCode.INVALID_ARGUMENT, "stop_token_ids"),
    ],
)
def test_generate_batch_past_its_bounds_is_refused_before_any_work(served, buffer, rows, n, stop, code, text):
    stub, _ = served
    source = _put_prompts(buffer, f"in-{rows}-{n}-{stop}", rows)
    out = batch_key("job-lim", 0, f"out-{rows}-{n}-{stop}")
    sampling = pb.SamplingParams(max_tokens=2, stop_token_ids=list(range(stop)))
    req = pb.GenerateBatchRequest(input=source, output=out, sampling=sampling, n=n)
    _refused(lambda: stub.GenerateBatch(req, timeout=30), code, text)
    with pytest.raises(NotFound):
        buffer.get(out, wait_seconds=0)
    _generates(stub)


def test_text_prompts_are_bounded():
    with pytest.raises(InvalidArgument, match="max_prompt_text_chars"):
        RequestLimits(max_prompt_text_chars=10).check_prompt_text("x" * 11)


def test_an_expired_generate_batch_stops_and_cancels_its_requests(served, buffer):
    stub, replica = served
    source = _put_prompts(buffer, "slow-in", 2)
    out = batch_key("job-lim", 0, "slow-out")
    stub.Pause(pb.PauseRequest(mode=2), timeout=10)  # in place: the requests wait, the call cannot finish
    req = pb.GenerateBatchRequest(input=source, output=out, sampling=pb.SamplingParams(max_tokens=4), n=2)
    _refused(lambda: stub.GenerateBatch(req, timeout=1.0), grpc.StatusCode.DEADLINE_EXCEEDED, "")
    deadline = time.monotonic() + 5
    while replica._active and time.monotonic() < deadline:
        time.sleep(0.05)
    assert replica._active == 0, "the expired call still holds the replica"
    stub.Continue(pb.ContinueRequest(), timeout=10)
    time.sleep(0.5)
    assert stub.GetStatus(pb.GetStatusRequest(), timeout=10).running_requests == 0
    with pytest.raises(NotFound):
        buffer.get(out, wait_seconds=0)  # nothing was written for the expired call
    _generates(stub)


def _g(**fields) -> pb.GenerateRequest:
    return pb.GenerateRequest(**{"prompt_ids": [1, 2, 3], "sampling": pb.SamplingParams(max_tokens=2), **fields})


def _batch(**fields) -> pb.GenerateBatchRequest:
    base = {
        "input": batch_key("job-every", 0, "in"),
        "output": batch_key("job-every", 0, "out"),
        "n": 1,
        "sampling": pb.SamplingParams(max_tokens=2),
    }
    return pb.GenerateBatchRequest(**{**base, **fields})


BAD, MISSING = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
# Every rollout RPC that changes state (generation writes samples, the weight calls change weights and groups,
# Pause/Continue/FlushCache the engine), with bad input. Continue and FlushCache take no input to be bad; n = 0
# is proto3's unset (one sample); destroying a group that was never joined is a no-op (code None: it succeeds
# and changes nothing).
EVERY_RPC = [
    ("GenerateBatch", _batch(n=-3), BAD, "n = -3"),
    ("GenerateBatch", _batch(sampling=pb.SamplingParams(max_tokens=-1)), BAD, "max_tokens"),
    ("GenerateBatch", _batch(sampling=pb.SamplingParams(max_tokens=2, temperature=float("nan"))), BAD, "temperature"),
    ("GenerateBatch", _batch(sampling=pb.SamplingParams(max_tokens=2, top_p=1.5)), BAD, "top_p"),
    ("GenerateBatch", _batch(row_begin=3, row_end=1), BAD, "row"),
    ("GenerateBatch", _batch(input=batch_key("job-every", 0, "absent")), MISSING, "absent"),
    ("GenerateStream", _g(prompt_ids=[]), BAD, "prompt"),
    ("GenerateStream", _g(prompt_ids=[1, 10**9]), BAD, "outside the model's vocabulary"),
    ("GenerateStream", _g(sampling=pb.SamplingParams(max_tokens=-1)), BAD, "max_tokens"),
    ("GenerateStream", _g(sampling=pb.SamplingParams(max_tokens=2, temperature=-1.0)), BAD, "temperature"),
    ("GenerateStream", _g(sampling=pb.SamplingParams(max_tokens=2, stop_token_ids=list(range(9)))), BAD, "stop"),
    ("UpdateWeightsFromDisk", pb.UpdateWeightsFromDiskRequest(), BAD, "weights.path"),
    (
        "UpdateWeightsFromDisk",
        pb.UpdateWeightsFromDiskRequest(weights=weights_pb2.DiskWeights(path="/etc")),
        grpc.StatusCode.PERMISSION_DENIED,
        "weights.path",
    ),
    (
        "InitWeightUpdateGroup",
        pb.InitWeightUpdateGroupRequest(
            group=weights_pb2.CollectiveGroup(
                master_address="127.0.0.1", master_port=1, world_size=0, rank_offset=1, group_name="g"
            )
        ),
        BAD,
        "world_size",
    ),
    (
        "InitWeightUpdateGroup",
        pb.InitWeightUpdateGroupRequest(
            group=weights_pb2.CollectiveGroup(
                master_address="127.0.0.1", master_port=1, world_size=2, rank_offset=1, group_name="g", backend=7
            )
        ),
        BAD,
        "backend",
    ),
    (
        "UpdateWeightsFromDistributed",
        pb.UpdateWeightsFromDistributedRequest(group_name="nope", version=1),
        MISSING,
        "nope",
    ),
    ("DestroyWeightUpdateGroup", pb.DestroyWeightUpdateGroupRequest(group_name="nope"), None, ""),
    ("Pause", pb.PauseRequest(mode=7), BAD, "mode"),
]


def _state(stub) -> tuple:
    status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    sums = stub.GetWeightChecksums(pb.GetWeightChecksumsRequest(), timeout=30)
    return status.state, status.weight_version, sums.SerializeToString(deterministic=True)


@pytest.mark.parametrize(
    ("method", "request_", "code", "text"), EVERY_RPC, ids=[f"{c[0]}-{i}" for i, c in enumerate(EVERY_RPC)]
)
def test_every_mutating_rollout_rpc_refuses_bad_input_and_changes_nothing(served, buffer, method, request_, code, text):
    stub, _ = served
    buffer.put(
        batch_key("job-every", 0, "in"),
        {S.PROMPT_IDS: Ragged.from_rows([[1, 2, 3]] * 2, dtype=np.int32)},
        overwrite=True,
    )
    before = _state(stub)

    def call():
        reply = getattr(stub, method)(request_, timeout=30)
        return list(reply) if method == "GenerateStream" else reply

    if code is None:
        call()
    else:
        _refused(call, code, text)
    assert _state(stub) == before
    with pytest.raises(NotFound):
        buffer.get(batch_key("job-every", 0, "out"), wait_seconds=0)
    _generates(stub)
