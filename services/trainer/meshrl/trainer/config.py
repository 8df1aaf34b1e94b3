"""Typed configuration of the trainer service (`python -m meshrl.trainer --config FILE --set k=v`).

Loaded by `__main__` through `meshrl.common.config.parse_service_args`; every section forbids
unknown fields, so a misspelt key fails at start-up naming the field.
"""

from __future__ import annotations

import pydantic

from meshrl.common.comm_backend import CommBackend, resolve_backend
from meshrl.common.config import StrictModel
from meshrl.common.grpc_channel import ChannelConfig, peer_channel
from meshrl.common.grpc_server import ServerConfig
from meshrl.common.loss_config import LossConfig
from meshrl.common.path_roots import PathRoots
from meshrl.common.telemetry import TelemetryConfig
from meshrl.common.weights.hashing import DEFAULT_DIGEST, DIGESTS
from meshrl.trainer.launched import Launcher
from meshrl.trainer.optim_config import OptimizerConfig

DEFAULT_PORT = 50052


class DataParallelConfig(StrictModel):
    size: int = pydantic.Field(
        1, ge=1, description="data-parallel replicas; ranks = size x tensor_parallel x pipeline_parallel"
    )
    backend: CommBackend = pydantic.Field(
        CommBackend.AUTO, description="torch.distributed backend of the ranks: auto = nccl with CUDA, else gloo"
    )
    master_address: str = pydantic.Field("127.0.0.1", description="rendezvous address of the ranks (rank 0's host)")
    master_port: int = pydantic.Field(0, ge=0, le=65535, description="rendezvous port; 0 = a free one")
    start_timeout_seconds: float = pydantic.Field(300.0, gt=0, description="wait this long for every rank to join")
    launcher: Launcher = pydantic.Field(
        Launcher.AUTO,
        description="spawn: rank 0 starts the other ranks as its children; environment: every rank is started by a "
        "launcher such as torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK); auto: environment "
        "when RANK and WORLD_SIZE are set",
    )

    @pydantic.field_validator("backend")
    @classmethod
    def _device_holds_it(cls, value: CommBackend) -> CommBackend:
        resolve_backend(value, "data_parallel.backend")  # nccl without CUDA fails at load, naming the field
        return value

    def resolved_backend(self) -> str:
        return resolve_backend(self.backend, "data_parallel.backend")


class ParallelConfig(StrictModel):
    """Model parallelism of every role this trainer loads (Megatron's layout: TP neighbours are consecutive ranks)."""

    tensor_parallel: int = pydantic.Field(1, ge=1, description="ranks that split each layer (and the vocabulary)")
    pipeline_parallel: int = pydantic.Field(1, ge=1, description="pipeline stages (layers split evenly; 1F1B)")


class DefaultsConfig(StrictModel):
    """Values used when a request leaves a field unset."""

    micro_batch_tokens: int = pydantic.Field(4096, ge=1, description="padded tokens per micro-batch")
    bucket_bytes: int = pydantic.Field(512 << 20, ge=1 << 10, description="weight publication bucket size")
    loss: LossConfig = pydantic.Field(default_factory=LossConfig, description="the objective of a train step")
    optimizer: OptimizerConfig = pydantic.Field(default_factory=OptimizerConfig, description="of trainable roles")


class PublicationConfig(StrictModel):
    """How complete weight versions are written to disk (meshrl.common.weights.write_version)."""

    digest: str = pydantic.Field(
        DEFAULT_DIGEST,
        description=f"per-tensor digest in the manifest, one of {sorted(DIGESTS)}: xxh3_128 (fast; catches "
        "corruption, not deliberate alteration) or sha256 (where tampering with the shared folder is a threat)",
    )
    fsync: bool = pydantic.Field(
        False,
        description="fsync every file before the version is renamed into place (durable across a host crash; "
        "off: a torn version fails its replicas' digest check and the trainer re-publishes after a restart)",
    )

    @pydantic.field_validator("digest")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in DIGESTS:
            raise ValueError(f"digest {value!r} is unknown: use one of {sorted(DIGESTS)}")
        return value


class TrainerConfig(StrictModel):
    server: ServerConfig = pydantic.Field(default_factory=lambda: ServerConfig(port=DEFAULT_PORT))
    databuffer: ChannelConfig = pydantic.Field(
        default_factory=ChannelConfig,
        description="the channel to the data buffer: address, tls (ca_file, cert_file, key_file), auth.token_file",
    )
    databuffer_address: str | None = pydantic.Field(
        None, description="host:port of the data buffer that batches are read from and written to"
    )
    databuffer_wait_seconds: float = pydantic.Field(
        30.0, ge=0, description="wait this long for an input batch to appear before NOT_FOUND"
    )
    data_parallel: DataParallelConfig = pydantic.Field(default_factory=DataParallelConfig)
    parallel: ParallelConfig = pydantic.Field(default_factory=ParallelConfig)
    defaults: DefaultsConfig = pydantic.Field(default_factory=DefaultsConfig)
    publication: PublicationConfig = pydantic.Field(default_factory=PublicationConfig)
    atomic_steps: bool = pydantic.Field(
        True, description="snapshot model+optimizer before multi-step train calls so a NaN rolls them all back"
    )
    torch_threads: int | None = pydantic.Field(None, ge=1, description="torch CPU threads (None = torch's default)")
    single_thread_below_gflop: float = pydantic.Field(
        1.5,
        ge=0,
        description="a CPU call whose estimated work (2 or 6 x parameters x tokens) is below this many "
        "GFLOP runs on one torch thread: waking the others costs more than they save (0: never)",
    )
    telemetry: TelemetryConfig = pydantic.Field(default_factory=TelemetryConfig)
    paths: PathRoots = pydantic.Field(
        default_factory=PathRoots.working_folder,
        description="roots of the model, checkpoint and weight folders that calls name (default: the working directory)",
    )

    def databuffer_peer(self) -> ChannelConfig | None:
        """The data buffer's channel (databuffer_address is a shortcut for databuffer.address); None: none."""
        return peer_channel(self.databuffer, self.databuffer_address, "databuffer")

    @property
    def world_size(self) -> int:
        """Trainer ranks (processes): data x tensor x pipeline parallel."""
        return self.data_parallel.size * self.parallel.tensor_parallel * self.parallel.pipeline_parallel
