"""Outside input is bounded: YAML before anything is built (aliases, size, depth, expansion), error messages
whatever the value, status messages below gRPC's metadata limit (real error kept); probes answer under load."""

from __future__ import annotations

import time

import grpc
import pytest
import yaml

from meshrl.common.bounded_yaml import YamlLimitError, YamlLimits, load_bounded
from meshrl.common.config import parse_overrides
from meshrl.common.errors import MAX_MESSAGE_BYTES, ConfigError, InvalidArgument, cap_message, short_repr


def laughs(levels: int = 9, indent: str = "") -> str:
    """The classic: 9 levels of 9 aliases each, a billion 'lol's once expanded (under 1 KB of text)."""
    lines = [f'{indent}a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        refs = ", ".join([f"*a{i - 1}"] * 9)
        lines.append(f"{indent}a{i}: &a{i} [{refs}]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_is_refused_before_expanding():
    start = time.monotonic()
    with pytest.raises(YamlLimitError) as info:
        load_bounded(laughs(), limits=YamlLimits(max_aliases=10_000))
    assert "expands past" in str(info.value)
    assert time.monotonic() - start < 2.0
    with pytest.raises(YamlLimitError, match="aliases"):
        load_bounded(laughs())  # 72 aliases past a small alias budget
    with pytest.raises(YamlLimitError, match="aliases"):
        load_bounded(laughs(), limits=YamlLimits(max_aliases=20))


def test_merge_keys_count_as_expansion():
    text = "a: &a {x: 1, y: 2}\n" + "".join(
        f"b{i}: &b{i} {{<<: [*{'a' if i == 0 else f'b{i - 1}'}], k{i}: {i}}}\n" for i in range(20)
    )
    assert load_bounded(text)["b19"]["x"] == 1  # legitimate anchors and merges still work
    with pytest.raises(YamlLimitError):
        load_bounded(text, limits=YamlLimits(max_expanded=200))


def test_size_depth_and_recursion_limits():
    with pytest.raises(YamlLimitError, match="bytes"):
        load_bounded("x: " + "a" * 100, limits=YamlLimits(max_bytes=50))
    with pytest.raises(YamlLimitError, match="nest"):
        load_bounded("[" * 100 + "]" * 100)
    with pytest.raises(YamlLimitError, match="nest"):
        load_bounded("[" * 5000 + "]" * 5000)  # deep enough to overflow PyYAML's recursive composer
    with pytest.raises(YamlLimitError, match="recursive|contains"):
        load_bounded("a: &a [*a]\n")
    with pytest.raises(yaml.YAMLError):  # malformed stays a YAML error for callers to describe
        load_bounded("a: [1, 2\n")
    assert load_bounded("") is None and load_bounded("a: 1") == {"a": 1}


def test_overrides_and_config_files_are_bounded(tmp_path):
    with pytest.raises(YamlLimitError):
        parse_overrides(["x=" + laughs().replace("\n", ", ").join("{}")])
    from meshrl.common.config import read_yaml

    path = tmp_path / "c.yaml"
    path.write_text(laughs())
    with pytest.raises(InvalidArgument):
        read_yaml(path)


def test_error_messages_stay_small_whatever_the_value():
    shared = ["lol"] * 9
    for _ in range(8):
        shared = [shared] * 9  # a billion leaves, shared (as YAML aliases construct them)
    start = time.monotonic()
    text = str(ConfigError("job.name", shared, "not a string", "give a name"))
    assert len(text) < 1000 and time.monotonic() - start < 1.0
    assert len(short_repr("x" * 10**7)) < 200


def test_cap_message_keeps_the_start_and_the_end():
    long = "ValueError: the real cause\n" + "é" * 50_000 + "\nlast frame"
    capped = cap_message(long)
    assert len(capped.encode()) <= MAX_MESSAGE_BYTES
    assert capped.startswith("ValueError: the real cause") and capped.endswith("last frame")
    assert cap_message("short") == "short"


def test_a_long_error_reaches_the_client_with_its_code_and_start():
    from meshrl.api.databuffer.v1 import databuffer_pb2 as dpb
    from meshrl.api.databuffer.v1 import databuffer_pb2_grpc
    from meshrl.common.grpc_server import ServerConfig, Service, start_server

    class Servicer(databuffer_pb2_grpc.DataBufferServicer):
        def GetStats(self, request, context):
            raise InvalidArgument("the real error: " + "ü" * 100_000)

    service = Service(databuffer_pb2_grpc.add_DataBufferServicer_to_server, Servicer(), "t")
    running = start_server(ServerConfig(port=0), [service])
    try:
        with grpc.insecure_channel(running.address) as channel:
            with pytest.raises(grpc.RpcError) as info:
                databuffer_pb2_grpc.DataBufferStub(channel).GetStats(dpb.GetStatsRequest(), timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details().startswith("the real error: ")
    finally:
        running.stop(0)


def test_health_and_status_answer_while_every_worker_is_busy():
    import threading

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from meshrl.api.databuffer.v1 import databuffer_pb2 as dpb
    from meshrl.api.databuffer.v1 import databuffer_pb2_grpc
    from meshrl.common.grpc_server import ServerConfig, Service, start_server

    release = threading.Event()

    class Busy(databuffer_pb2_grpc.DataBufferServicer):
        def GetBatch(self, request, context):
            release.wait(30)
            yield dpb.GetBatchResponse()

        def GetStats(self, request, context):
            return dpb.GetStatsResponse()

    service = Service(databuffer_pb2_grpc.add_DataBufferServicer_to_server, Busy(), "t")
    running = start_server(ServerConfig(port=0, max_workers=2), [service])
    try:
        with grpc.insecure_channel(running.address) as channel:
            stub = databuffer_pb2_grpc.DataBufferStub(channel)
            streams = [stub.GetBatch(dpb.GetBatchRequest(), timeout=30) for _ in range(4)]  # more than the workers
            time.sleep(0.5)
            check = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
            assert check.status == health_pb2.HealthCheckResponse.SERVING
            stub.GetStats(dpb.GetStatsRequest(), timeout=3)
            release.set()
            for s in streams:
                list(s)
    finally:
        release.set()
        running.stop(0)
