"""GenerateStream cannot hold a replica's server threads: at most limits.max_streams streams run at once, one
more is refused with RESOURCE_EXHAUSTED naming the setting while other calls keep being answered, a stream's
slot comes back when it ends (or its caller leaves), and the rollout config keeps threads beside the streams."""

from __future__ import annotations

import time

import grpc
import pydantic
import pytest

from meshrl.api.rollout.v1 import rollout_pb2 as pb
from meshrl.api.rollout.v1 import rollout_pb2_grpc
from meshrl.common.errors import ResourceExhausted
from meshrl.common.grpc_channel import open_channel
from meshrl.common.grpc_server import ServerConfig, start_server
from meshrl.rollout.config import RolloutConfig
from meshrl.rollout.limits import RequestLimits
from meshrl.rollout.replica import RolloutReplica
from meshrl.rollout.server import service
from meshrl.rollout.stream_slots import StreamSlots
from meshrl.rollout.types import PauseMode

REQUEST = pb.GenerateRequest(prompt_ids=[1, 2, 3], sampling=pb.SamplingParams(max_tokens=3, temperature=0))


@pytest.fixture()
def served(model_dir, new_engine):
    """A replica that serves at most 2 streams, behind a server of 2 + 4 threads."""
    replica = RolloutReplica(
        new_engine(model_dir, max_batch_size=4), replica_id="r", capacity=4, limits=RequestLimits(max_streams=2)
    )
    replica.mark_serving()
    running = start_server(ServerConfig(port=0, max_workers=6), [service(replica)])
    channel = open_channel(running.address)
    yield rollout_pb2_grpc.RolloutStub(channel), replica
    channel.close()
    running.stop(0)


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.02)


def test_one_stream_past_the_bound_is_refused_and_other_calls_still_answer(served):
    stub, replica = served
    replica.pause(PauseMode.IN_PLACE)  # admitted streams wait, each holding its slot and a server thread
    held = [stub.GenerateStream(REQUEST, timeout=60) for _ in range(2)]
    _until(lambda: replica.streams.in_use == 2, "both streams hold a slot")
    with pytest.raises(grpc.RpcError) as info:
        list(stub.GenerateStream(REQUEST, timeout=30))
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value.details()
    assert "limits.max_streams" in info.value.details()
    assert replica.streams.in_use == 2  # the refused one took nothing
    assert stub.GetWeightChecksums(pb.GetWeightChecksumsRequest(), timeout=10).version == 0  # a thread is free
    stub.Continue(pb.ContinueRequest(), timeout=10)
    for stream in held:
        assert sum(len(c.token_ids) for c in stream) >= 1
    _until(lambda: replica.streams.in_use == 0, "the finished streams give their slots back")
    assert sum(len(c.token_ids) for c in stub.GenerateStream(REQUEST, timeout=30)) >= 1


def test_a_stream_whose_caller_left_gives_its_slot_back(served):
    stub, replica = served
    replica.pause(PauseMode.IN_PLACE)
    stream = stub.GenerateStream(REQUEST, timeout=60)
    _until(lambda: replica.streams.in_use == 1, "the stream holds a slot")
    stream.cancel()
    replica.continue_generation()
    _until(lambda: replica.streams.in_use == 0, "the cancelled stream gives its slot back")
    streams = [stub.GenerateStream(REQUEST, timeout=30) for _ in range(2)]
    assert all(sum(len(c.token_ids) for c in s) >= 1 for s in streams)


def test_slots_refuse_past_the_limit_and_come_back():
    slots = StreamSlots(1, "r7")
    with slots.held():
        with pytest.raises(ResourceExhausted, match="r7 already serves 1 GenerateStream") as info:
            with slots.held():
                pass
        assert "limits.max_streams" in str(info.value)
        assert slots.in_use == 1
    assert slots.in_use == 0
    with slots.held():
        assert slots.in_use == 1


def test_the_server_threads_follow_the_bound_unless_set():
    engine = {"model_path": "m"}
    assert RolloutConfig(engine=engine).server.max_workers == 256 + 16
    assert RolloutConfig(engine=engine, limits={"max_streams": 8}).server.max_workers == 24
    assert RolloutConfig(engine=engine, limits={"max_streams": 8}, server={"max_workers": 12}).server.max_workers == 12


def test_too_few_threads_beside_the_streams_are_refused():
    with pytest.raises(pydantic.ValidationError, match="server.max_workers = 16 leaves too few threads"):
        RolloutConfig(engine={"model_path": "m"}, server={"max_workers": 16})
    with pytest.raises(pydantic.ValidationError, match="at least 12"):
        RolloutConfig(engine={"model_path": "m"}, limits={"max_streams": 8}, server={"max_workers": 11})
