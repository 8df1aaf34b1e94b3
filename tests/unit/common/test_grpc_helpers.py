"""gRPC helpers: typed errors cross the wire as the right status codes (unary and streaming),
health and reflection answer, retries cover a server that comes up late, and a call cut off by its own
client closing the channel is Unavailable (the peer is gone), not a cancel."""

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from meshrl.common import errors
from meshrl.common.grpc_channel import call, open_channel, wait_until_serving
from meshrl.common.grpc_server import ServerConfig, Service, start_server

SERVICE = "meshrl.test.v1.Echo"
RAISES = {
    "not_found": errors.NotFound("batch job/1/rollout is not in the buffer"),
    "invalid": errors.InvalidArgument("max_tokens must be > 0"),
    "full": errors.ResourceExhausted("budget of 10 bytes exceeded"),
    "down": errors.Unavailable("peer is down"),
    "bug": ValueError("boom"),
}
RELEASE_SLOW = threading.Event()  # the "slow" call's handler returns when this is set


def _unary(request: bytes, context):
    key = request.decode()
    if key == "slow":
        RELEASE_SLOW.wait(30)
    if key in RAISES:
        raise RAISES[key]
    return request


def _stream(request: bytes, context):
    yield b"first"
    raise RAISES[request.decode()]


def _add(_servicer, server):
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(_unary),
        "Stream": grpc.unary_stream_rpc_method_handler(_stream),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])


@pytest.fixture(scope="module")
def server():
    running = start_server(ServerConfig(port=0), [Service(_add, None, SERVICE)])
    yield running
    running.stop(0)


@pytest.fixture(scope="module")
def channel(server):
    ch = open_channel(server.address)
    wait_until_serving(ch, timeout=10)
    yield ch
    ch.close()


@pytest.mark.parametrize(
    "key, code, cls",
    [
        ("not_found", grpc.StatusCode.NOT_FOUND, errors.NotFound),
        ("invalid", grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument),
        ("full", grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhausted),
        ("down", grpc.StatusCode.UNAVAILABLE, errors.Unavailable),
        ("bug", grpc.StatusCode.INTERNAL, errors.Internal),
    ],
)
def test_typed_errors_map_to_status_codes(channel, key, code, cls):
    unary = channel.unary_unary(f"/{SERVICE}/Unary")
    with pytest.raises(grpc.RpcError) as info:
        unary(key.encode(), timeout=10)
    assert info.value.code() == code
    with pytest.raises(cls) as typed:
        call(unary, key.encode(), timeout=10)
    assert str(RAISES[key]) in str(typed.value)


def test_streaming_errors_keep_their_code(channel):
    stream = channel.unary_stream(f"/{SERVICE}/Stream")
    replies = stream(b"invalid", timeout=10)
    assert next(replies) == b"first"
    with pytest.raises(grpc.RpcError) as info:
        next(replies)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_health_and_reflection(channel):
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5).status == 1
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5)
    names = {s.name for r in replies for s in r.list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health"} <= names


def test_graceful_stop_reports_not_serving_first():
    running = start_server(ServerConfig(port=0), [Service(_add, None, SERVICE)])
    ch = open_channel(running.address)
    wait_until_serving(ch, timeout=10)
    running.stop(0)
    with pytest.raises(grpc.RpcError):
        health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=2, wait_for_ready=False)
    ch.close()


def test_plaintext_health_port_shares_the_health_state():
    running = start_server(ServerConfig(port=0, health_port=0), [Service(_add, None, SERVICE)])
    try:
        ch = open_channel(f"127.0.0.1:{running.health_port}")
        stub = health_pb2_grpc.HealthStub(ch)
        assert stub.Check(health_pb2.HealthCheckRequest(service=SERVICE), timeout=5).status == 1
        with pytest.raises(grpc.RpcError) as info:  # only the health service lives there
            ch.unary_unary(f"/{SERVICE}/Unary")(b"x", timeout=5)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        running.stop(0)


def test_a_call_cut_off_by_closing_its_channel_is_unavailable(server):
    """What a scheduler does when a launched service dies (launch/exit_watch.py): it closes the channel, and
    the call waiting on it fails at once with the error the job's recovery restarts after."""
    ch = open_channel(server.address)
    wait_until_serving(ch, timeout=10)
    unary = ch.unary_unary(f"/{SERVICE}/Unary")
    outcome: list[BaseException] = []

    def waiting() -> None:
        try:
            call(unary, b"slow", timeout=30)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            outcome.append(exc)

    caller = threading.Thread(target=waiting)
    caller.start()
    time.sleep(0.3)
    ch.close()
    caller.join(20)
    assert not RELEASE_SLOW.is_set()  # the handler still holds the call: the close alone ended the wait
    RELEASE_SLOW.set()
    (cut,) = outcome
    assert isinstance(cut, errors.Unavailable) and "closed the channel" in str(cut), repr(cut)
    with pytest.raises(errors.Unavailable, match="closed before the call"):
        call(unary, b"echo", timeout=10)
