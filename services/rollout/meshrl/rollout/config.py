"""Typed configuration of a rollout replica (`python -m meshrl.rollout --config FILE --set k=v`).

Loaded by `__main__` through `meshrl.common.config.parse_service_args`; every section forbids
unknown fields, so a misspelt key fails at start-up with the field and the closest known name.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Literal

import pydantic

from meshrl.common.config import StrictModel
from meshrl.common.grpc_channel import ChannelConfig, peer_channel
from meshrl.common.grpc_server import ServerConfig
from meshrl.common.path_roots import PathRoots
from meshrl.common.telemetry import TelemetryConfig
from meshrl.rollout.limits import RequestLimits

DEFAULT_PORT = 50053
CONTROL_THREADS = 16  # server threads beyond limits.max_streams by default: weight updates, pauses, batches
MIN_CONTROL_THREADS = 4  # the fewest an operator's server.max_workers may leave beside the streams


class TransformersEngineConfig(StrictModel):
    device: str = pydantic.Field("cpu", description="torch device, e.g. cpu or cuda:0")
    dtype: Literal["float32", "bfloat16", "float16"] = pydantic.Field("float32", description="weights dtype")
    attn_implementation: str = pydantic.Field("sdpa", description="transformers attention kernel: sdpa or eager")
    max_admit_per_step: int = pydantic.Field(64, ge=1, description="most new requests prefilled between two steps")
    max_prefill_tokens: int = pydantic.Field(
        8192, ge=1, description="most (padded) prompt tokens prefilled in one forward pass"
    )
    prefix_cache_tokens: int = pydantic.Field(
        65536,
        ge=0,
        description="tokens of prompt KV kept for reuse by a group's samples and a session's turns; 0 = off",
    )
    num_threads: int | None = pydantic.Field(
        1,
        ge=1,
        description="torch CPU threads of this replica process (None = torch's default, one per core). 1 by "
        "default: a replica shares its host with the trainer and other replicas, and oversubscribed threads "
        "made decoding ~10x slower on a busy 2-core host (bench/rollout); raise it on a dedicated CPU host",
    )


class HTTPEngineConfig(StrictModel):
    """An SGLang or vLLM server: launched as a subprocess, or reached at `url`."""

    url: str | None = pydantic.Field(None, description="http://host:port of a running server; unset = launch one")
    host: str = pydantic.Field("127.0.0.1", description="address the launched server binds")
    port: int = pydantic.Field(0, ge=0, le=65535, description="port of the launched server; 0 = a free one")
    python: str = pydantic.Field("", description="interpreter that runs the server (default: this one)")
    extra_args: dict[str, Any] = pydantic.Field(
        default_factory=dict, description="server flags, e.g. {tp_size: 2, mem_fraction_static: 0.8}"
    )
    env: dict[str, str] = pydantic.Field(default_factory=dict, description="extra environment of the launched server")
    api_key: str | None = pydantic.Field(None, description="bearer token of the server's admin endpoints")
    startup_timeout_s: float = pydantic.Field(900.0, gt=0, description="wait this long for the server's health")
    request_timeout_s: float = pydantic.Field(600.0, gt=0, description="deadline of one generate request")
    log_file: str | None = pydantic.Field(None, description="where the launched server's output goes")
    samples_per_request: int = pydantic.Field(
        16,
        ge=1,
        description="vLLM: the samples of one prompt in a batch go as one request asking for this many at most "
        "(fewer requests for the server to parse and stream); 1 = a request per sample. SGLang: always 1",
    )
    stream_interval: int = pydantic.Field(
        16,
        ge=1,
        description="vLLM: tokens per streamed event of a batch request (its last event carries every token's "
        "weight version); a request streamed to a client gets each token as it is made",
    )
    tensor_parallel_size: int = pydantic.Field(
        1,
        ge=1,
        description="GPUs one server splits the model over (SGLang --tp-size, vLLM --tensor-parallel-size); "
        "its workers are that many ranks of a weight group",
    )
    data_parallel_size: int = pydantic.Field(
        1,
        ge=1,
        description="engine-internal data parallelism (SGLang --dp-size, vLLM --data-parallel-size); "
        "native weight groups need 1 (run one replica per data-parallel copy instead)",
    )


class EngineConfig(StrictModel):
    kind: Literal["transformers", "sglang", "vllm"] = pydantic.Field(
        "transformers", description="one of transformers (embedded default), sglang, vllm"
    )
    model_path: str = pydantic.Field(description="a Hugging Face model folder")
    context_length: int | None = pydantic.Field(
        None, ge=2, description="most prompt + response tokens (default: the model's max_position_embeddings)"
    )
    max_batch_size: int = pydantic.Field(
        64, ge=1, description="most sequences decoded together (SGLang / vLLM: requests in flight to the server)"
    )
    transformers: TransformersEngineConfig = pydantic.Field(default_factory=TransformersEngineConfig)
    sglang: HTTPEngineConfig = pydantic.Field(default_factory=HTTPEngineConfig)
    vllm: HTTPEngineConfig = pydantic.Field(default_factory=HTTPEngineConfig)


class RegistryConfig(StrictModel):
    redis_url: str | None = pydantic.Field(
        None, description="redis://host:port/db of the replica registry; unset = do not register"
    )
    namespace: str = pydantic.Field("meshrl", description="key prefix, e.g. one per job")
    ttl_seconds: float = pydantic.Field(10.0, gt=0, description="a replica silent this long drops out")
    heartbeat_seconds: float = pydantic.Field(2.0, gt=0, description="how often the replica refreshes its entry")


class InitialWeightsConfig(StrictModel):
    path: str | None = pydantic.Field(
        None,
        description="published weights to load before serving: a version folder (v000007/) or the folder of "
        "versions (the newest complete one is loaded); unset = the registry's current version, if any",
    )


def _default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class RolloutConfig(StrictModel):
    server: ServerConfig = pydantic.Field(default_factory=lambda: ServerConfig(port=DEFAULT_PORT))
    replica_id: str = pydantic.Field(default_factory=_default_replica_id, description="unique name of this replica")
    advertise_address: str | None = pydantic.Field(
        None, description="host:port routers dial (default: server.host and the bound port)"
    )
    capacity: int | None = pydantic.Field(
        None,
        ge=1,
        description="sequences this replica serves at once, the routers' weight (default engine.max_batch_size)",
    )
    engine: EngineConfig = pydantic.Field(description="the engine and its model: engine.model_path is required")
    registry: RegistryConfig = pydantic.Field(default_factory=RegistryConfig)
    weights: InitialWeightsConfig = pydantic.Field(default_factory=InitialWeightsConfig)
    databuffer: ChannelConfig = pydantic.Field(
        default_factory=ChannelConfig,
        description="the channel to the data buffer: address, tls (ca_file, cert_file, key_file), auth.token_file",
    )
    databuffer_address: str | None = pydantic.Field(
        None, description="host:port of the data buffer (needed by GenerateBatch)"
    )
    databuffer_wait_seconds: float = pydantic.Field(30.0, ge=0, description="wait this long for an input batch")
    drain_timeout_s: float = pydantic.Field(60.0, ge=0, description="time in-flight work gets on SIGTERM")
    telemetry: TelemetryConfig = pydantic.Field(default_factory=TelemetryConfig)
    limits: RequestLimits = pydantic.Field(default_factory=RequestLimits, description="bounds on one call")
    paths: PathRoots = pydantic.Field(
        default_factory=PathRoots.working_folder,
        description="roots of the weight and staging folders that calls name (default: the working directory)",
    )

    @pydantic.model_validator(mode="after")
    def _threads_for_streams(self) -> RolloutConfig:
        """Every GenerateStream holds a server thread: the server keeps threads for the other calls beyond
        limits.max_streams (server.max_workers follows the bound unless it is set)."""
        need = self.limits.max_streams + MIN_CONTROL_THREADS
        if "max_workers" not in self.server.model_fields_set:
            self.server.max_workers = self.limits.max_streams + CONTROL_THREADS
            self.server.model_fields_set.discard("max_workers")  # still the default: a re-check follows the bound
        elif self.server.max_workers < need:
            raise ValueError(
                f"server.max_workers = {self.server.max_workers} leaves too few threads beside limits.max_streams "
                f"= {self.limits.max_streams} (each stream holds one): raise server.max_workers to at least {need}, "
                "lower limits.max_streams, or leave server.max_workers unset"
            )
        return self

    @property
    def effective_capacity(self) -> int:
        return self.capacity or self.engine.max_batch_size

    def databuffer_peer(self) -> ChannelConfig | None:
        """The data buffer's channel (databuffer_address is a shortcut for databuffer.address); None: none."""
        return peer_channel(self.databuffer, self.databuffer_address, "databuffer")
