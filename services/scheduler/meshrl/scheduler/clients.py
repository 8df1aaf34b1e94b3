"""Typed clients of the trainer and rollout services, as the scheduler calls them.

Each call carries a deadline and raises meshrl's typed errors; requests carry only
data-buffer keys and settings, never bulk data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from meshrl.api.common.v1 import keys_pb2, tensor_pb2, weights_pb2
from meshrl.api.rollout.v1 import rollout_pb2 as rpb
from meshrl.api.rollout.v1 import rollout_pb2_grpc
from meshrl.api.trainer.v1 import trainer_pb2 as tpb
from meshrl.api.trainer.v1 import trainer_pb2_grpc
from meshrl.common.grpc_channel import ChannelConfig, call, open_channel, wait_until_serving
from meshrl.common.proto_settings import settings_to_proto
from meshrl.common.roles import role_proto
from meshrl.scheduler.config import OptimSection


def optimizer_proto(section: OptimSection) -> tpb.OptimizerConfig:
    """The job's optimizer section as the trainer's message: set fields only (the trainer owns the defaults)."""
    return settings_to_proto(tpb.OptimizerConfig, section.model_dump())


def loss_proto(settings: Mapping[str, Any]) -> tpb.LossConfig:
    """Loss settings (LossConfig field -> value, None = the trainer's default) as the trainer's message."""
    return settings_to_proto(tpb.LossConfig, settings)


class TrainerClient:
    def __init__(self, address: str, timeout: float = 900.0, channel: ChannelConfig | None = None) -> None:
        self.address = address
        self.channel = open_channel(address, channel)
        self.stub = trainer_pb2_grpc.TrainerStub(self.channel)
        self.timeout = timeout

    def wait_ready(self, timeout: float) -> None:
        wait_until_serving(self.channel, timeout=timeout)

    def load_model(
        self,
        role: str,
        path: str,
        dtype: str,
        optimizer: OptimSection | None,
        seed: int,
        copy_from: str = "",
        gradient_checkpointing: bool = False,
    ) -> tpb.LoadModelResponse:
        """`optimizer`'s set fields go to the trainer; the ones left out take the trainer's defaults."""
        opt = optimizer_proto(optimizer) if optimizer else None
        req = tpb.LoadModelRequest(
            role=role_proto(role),
            model_path=path,
            dtype=tensor_pb2.DType.Value(f"DTYPE_{dtype.upper()}"),
            optimizer=opt,
            seed=seed,
            gradient_checkpointing=gradient_checkpointing,
        )
        if copy_from:
            req.copy_from = role_proto(copy_from)
        return call(self.stub.LoadModel, req, timeout=self.timeout)

    def compute_logprobs(
        self,
        role: str,
        inputs: Sequence[keys_pb2.BatchKey],
        output: keys_pb2.BatchKey,
        name: str,
        entropy: bool,
        columns: Sequence[str] = (),
        weight_version: int | None = None,
        more_passes: Sequence[tpb.LogProbPass] = (),
        temperature: float | None = None,
    ) -> tpb.ComputeResponse:
        """`columns`: the only input columns the trainer reads (empty: every column); `weight_version`: the
        version the actor's weights are at (its reply then carries the rollout gap per version lag);
        `more_passes`: further passes over the same rows (the reply's `passes`); `temperature`: the one the
        rows were sampled at (None: the model's own distribution, 1)."""
        req = tpb.ComputeLogProbsRequest(
            role=role_proto(role),
            inputs=inputs,
            output=output,
            output_name=name,
            with_entropy=entropy,
            temperature=temperature,
            columns=columns,
            weight_version=weight_version,
            more_passes=more_passes,
        )
        return call(self.stub.ComputeLogProbs, req, timeout=self.timeout)

    def compute_values(
        self, inputs: Sequence[keys_pb2.BatchKey], output: keys_pb2.BatchKey, columns: Sequence[str] = ()
    ) -> tpb.ComputeResponse:
        req = tpb.ComputeValuesRequest(inputs=inputs, output=output, columns=columns)
        return call(self.stub.ComputeValues, req, timeout=self.timeout)

    def compute_scores(
        self, inputs: Sequence[keys_pb2.BatchKey], output: keys_pb2.BatchKey, name: str, columns: Sequence[str] = ()
    ) -> tpb.ComputeResponse:
        """The reward model's score per row, written to `output` as the column `name`."""
        req = tpb.ComputeScoresRequest(
            role=tpb.ROLE_REWARD, inputs=inputs, output=output, output_name=name, columns=columns
        )
        return call(self.stub.ComputeScores, req, timeout=self.timeout)

    def train_step(
        self,
        role: str,
        inputs: Sequence[keys_pb2.BatchKey],
        loss: Mapping[str, Any],
        micro_batch_tokens: int,
        mini_batches: int,
        step: int,
        lr: float | None = None,
        columns: Sequence[str] = (),
        weight_version: int | None = None,
        step_lrs: Sequence[float] = (),
        temperature: float | None = None,
    ) -> tpb.TrainStepResponse:
        """`loss` (LossConfig field -> value) goes to the trainer; None values and fields left out take the
        trainer's defaults. `lr` overrides the learning-rate schedule for this call; `step_lrs` gives each of
        its optimizer steps a rate (one step per rate over equal row chunks; pass mini_batches 1 or their
        number). `weight_version` (the version the call starts from) makes an in-train pi_old pass report
        the rollout gap per version lag. `temperature`: as in `compute_logprobs`."""
        req = tpb.TrainStepRequest(
            role=role_proto(role),
            inputs=inputs,
            loss=loss_proto(loss),
            micro_batch_tokens=micro_batch_tokens,
            mini_batches=mini_batches,
            global_step=step,
            lr_override=lr,
            columns=columns,
            weight_version=weight_version,
            step_lrs=step_lrs,
            temperature=temperature,
        )
        return call(self.stub.TrainStep, req, timeout=self.timeout)

    def save_checkpoint(self, role: str, path: str, step: int, data_state: bytes) -> tpb.SaveCheckpointResponse:
        req = tpb.SaveCheckpointRequest(role=role_proto(role), path=path, step=step, data_state=data_state)
        return call(self.stub.SaveCheckpoint, req, timeout=self.timeout)

    def load_checkpoint(self, role: str, path: str) -> tpb.LoadCheckpointResponse:
        return call(
            self.stub.LoadCheckpoint, tpb.LoadCheckpointRequest(role=role_proto(role), path=path), timeout=self.timeout
        )

    def init_weight_group(self, group: weights_pb2.CollectiveGroup, timeout: float):
        return call(self.stub.InitWeightUpdateGroup, tpb.InitWeightUpdateGroupRequest(group=group), timeout=timeout)

    def destroy_weight_group(self, name: str, timeout: float = 60.0) -> None:
        call(self.stub.DestroyWeightUpdateGroup, tpb.DestroyWeightUpdateGroupRequest(group_name=name), timeout=timeout)

    def publish(self, req: tpb.PublishWeightsRequest, timeout: float) -> tpb.PublishWeightsResponse:
        return call(self.stub.PublishWeights, req, timeout=timeout)

    def checksums(self, role: str = "actor") -> weights_pb2.WeightChecksums:
        return call(self.stub.GetWeightChecksums, tpb.GetWeightChecksumsRequest(role=role_proto(role)), timeout=60)

    def status(self) -> tpb.TrainerStatus:
        return call(self.stub.GetStatus, tpb.GetStatusRequest(), timeout=30)

    def offload(self) -> tpb.OffloadResponse:
        """Colocated mode: the optimizer state to host memory while the replicas use the device."""
        return call(self.stub.Offload, tpb.OffloadRequest(), timeout=self.timeout)

    def onload(self) -> tpb.OffloadResponse:
        return call(self.stub.Onload, tpb.OffloadRequest(), timeout=self.timeout)

    def close(self) -> None:
        self.channel.close()


class RolloutClient:
    def __init__(self, address: str, timeout: float = 600.0, channel: ChannelConfig | None = None) -> None:
        self.address = address
        self.channel = open_channel(address, channel)
        self.stub = rollout_pb2_grpc.RolloutStub(self.channel)
        self.timeout = timeout

    def wait_ready(self, timeout: float) -> None:
        wait_until_serving(self.channel, timeout=timeout)

    def update_from_disk(
        self,
        weights: weights_pb2.DiskWeights,
        pause_mode: int,
        flush: bool,
        timeout: float,
        checksum_names: Sequence[str] = (),
    ) -> rpb.UpdateWeightsResponse:
        """Loads a published version; the reply carries the checksums of `checksum_names` taken after it."""
        req = rpb.UpdateWeightsFromDiskRequest(
            weights=weights, pause_mode=pause_mode, flush_cache=flush, checksum_names=checksum_names
        )
        return call(self.stub.UpdateWeightsFromDisk, req, timeout=timeout)

    def init_weight_group(self, group: weights_pb2.CollectiveGroup, timeout: float):
        return call(self.stub.InitWeightUpdateGroup, rpb.InitWeightUpdateGroupRequest(group=group), timeout=timeout)

    def update_from_distributed(
        self, name: str, version: int, pause_mode: int, flush: bool, timeout: float, checksum_names: Sequence[str] = ()
    ) -> rpb.UpdateWeightsResponse:
        req = rpb.UpdateWeightsFromDistributedRequest(
            group_name=name,
            version=version,
            pause_mode=pause_mode,
            flush_cache=flush,
            timeout_seconds=timeout,
            checksum_names=checksum_names,
        )
        return call(self.stub.UpdateWeightsFromDistributed, req, timeout=timeout + 10)

    def destroy_weight_group(self, name: str, timeout: float = 60.0) -> None:
        req = rpb.DestroyWeightUpdateGroupRequest(group_name=name)
        call(self.stub.DestroyWeightUpdateGroup, req, timeout=timeout, wait_for_ready=False)

    def checksums(self, names: Sequence[str] = ()) -> weights_pb2.WeightChecksums:
        return call(self.stub.GetWeightChecksums, rpb.GetWeightChecksumsRequest(names=names), timeout=60)

    def status(self, timeout: float = 30.0) -> rpb.RolloutStatus:
        return call(self.stub.GetStatus, rpb.GetStatusRequest(), timeout=timeout, wait_for_ready=False)

    def release_memory(self, tags: Sequence[str] = ()) -> rpb.MemoryResponse:
        """Colocated mode: the replica gives up its weights' and/or KV cache's memory (empty = both)."""
        return call(self.stub.ReleaseMemory, rpb.MemoryRequest(tags=list(tags)), timeout=self.timeout)

    def resume_memory(self, tags: Sequence[str] = ()) -> rpb.MemoryResponse:
        return call(self.stub.ResumeMemory, rpb.MemoryRequest(tags=list(tags)), timeout=self.timeout)

    def close(self) -> None:
        self.channel.close()
