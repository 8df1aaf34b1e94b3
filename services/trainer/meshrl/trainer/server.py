"""The Trainer gRPC servicer: converts protos at the edge and calls `TrainerService`.

Built by `__main__` on rank 0; typed errors raised below become status codes in
meshrl.common.grpc_errors (bad input -> INVALID_ARGUMENT, unknown key -> NOT_FOUND, no model -> FAILED_PRECONDITION).
"""

from __future__ import annotations

import math

from meshrl.api.common.v1 import weights_pb2
from meshrl.api.common.v1.tensor_pb2 import DTYPE_FLOAT32
from meshrl.api.trainer.v1 import trainer_pb2 as pb
from meshrl.api.trainer.v1 import trainer_pb2_grpc
from meshrl.common.batch_key import BatchRef
from meshrl.common.errors import InvalidArgument
from meshrl.common.grpc_server import Service
from meshrl.common.loss_config import LossConfig
from meshrl.common.proto_settings import optional_field, settings_from_proto
from meshrl.common.roles import role_name, role_proto
from meshrl.common.telemetry import attributes as A
from meshrl.common.telemetry import tag_span
from meshrl.common.weight_group_codes import backend_proto
from meshrl.common.weights.dtypes import dtype_name, from_proto
from meshrl.trainer.optim_config import OptimizerConfig
from meshrl.trainer.service import TrainerService

SERVICE_NAME = "meshrl.trainer.v1.Trainer"
TRANSPORTS = {weights_pb2.WEIGHT_TRANSPORT_DISK: "disk", weights_pb2.WEIGHT_TRANSPORT_DISTRIBUTED: "distributed"}


def optimizer_settings(opt: pb.OptimizerConfig, defaults: OptimizerConfig) -> dict:
    """The request's optimizer: its set fields over the trainer's defaults (a set zero stays zero)."""
    return defaults.over(settings_from_proto(opt)).model_dump()


def loss_settings(loss: pb.LossConfig, role: str, defaults: LossConfig) -> dict:
    """The request's objective: its set fields over the trainer's defaults; the critic's default is `value`."""
    fields = settings_from_proto(loss)
    if role == "critic":
        fields.setdefault("policy_loss", "value")
    return defaults.over(fields).model_dump()


def _temperature(request: pb.ComputeLogProbsRequest | pb.TrainStepRequest) -> float | None:
    """The request's sampling temperature (None: unset, the model's own distribution), or INVALID_ARGUMENT."""
    temperature = optional_field(request, "temperature")
    if temperature is not None and not 0 < temperature < math.inf:
        raise InvalidArgument(
            f"temperature = {temperature} must be a finite number > 0 (the one the rows were sampled at), or unset",
            field="temperature",
        )
    return temperature


def _compute_reply(out: dict) -> pb.ComputeResponse:
    passes = out.pop("passes", [])
    tag_span({A.TOKENS: out["tokens"], A.MICRO_BATCHES: out["micro_batches"], A.PASSES: 1 + len(passes)})
    return pb.ComputeResponse(**out, passes=[pb.PassResult(**p) for p in passes])


MAX_MORE_PASSES = 8  # a pass per model role and setting; each is a forward over the whole batch


def _passes(request: pb.ComputeLogProbsRequest) -> list[dict]:
    """The request's more_passes (at most MAX_MORE_PASSES), each writing a key of its own (two passes into one
    key would lose one)."""
    if len(request.more_passes) > MAX_MORE_PASSES:
        raise InvalidArgument(
            f"more_passes has {len(request.more_passes)} passes, more than {MAX_MORE_PASSES}: "
            "each is a forward over the whole batch; split the call",
            field="more_passes",
        )
    passes = [_pass(i, p) for i, p in enumerate(request.more_passes)]
    seen = [BatchRef.from_proto(request.output, "output")]
    for i, p in enumerate(passes):
        if p["output"] in seen:
            raise InvalidArgument(
                f"more_passes[{i}].output is the output of an earlier pass of this call; give "
                "each pass a key of its own",
                field=f"more_passes[{i}].output",
            )
        seen.append(p["output"])
    return passes


def _pass(i: int, p: pb.LogProbPass) -> dict:
    """A request's more_passes[i], as TrainerService.compute_logprobs takes it."""
    field = f"more_passes[{i}]"
    if p.role == pb.ROLE_REWARD:
        raise InvalidArgument(
            f"{field}: the reward model has a score head, no log-probs; call ComputeScores for it",
            field=f"{field}.role",
        )
    return {
        "role": role_name(p.role, f"{field}.role"),
        "output": BatchRef.from_proto(p.output, f"{field}.output"),
        "with_entropy": p.with_entropy,
        "output_name": p.output_name,
        "weight_version": optional_field(p, "weight_version"),
    }


class TrainerServicer(trainer_pb2_grpc.TrainerServicer):
    def __init__(self, service: TrainerService) -> None:
        self.service = service

    def _inside(self, path: str, field: str) -> str:
        """A path named by the caller, resolved inside the trainer's `paths.roots` (or refused)."""
        return self.service.cfg.paths.inside(path, field) if path else path

    def LoadModel(self, request: pb.LoadModelRequest, context) -> pb.LoadModelResponse:
        role = role_name(request.role)
        self.service.check_layout(
            request.parallel.tensor_parallel, request.parallel.pipeline_parallel, request.parallel.data_parallel
        )
        copy_from = role_name(request.copy_from, "copy_from") if request.copy_from else None
        info = self.service.load_model(
            role,
            self._inside(request.model_path, "model_path"),
            dtype=dtype_name(from_proto(request.dtype or DTYPE_FLOAT32, "LoadModelRequest.dtype")),
            optimizer=optimizer_settings(request.optimizer, self.service.cfg.defaults.optimizer),
            seed=request.seed,
            gradient_checkpointing=request.gradient_checkpointing,
            copy_from=copy_from,
        )
        return pb.LoadModelResponse(role=request.role, **info)

    def ComputeLogProbs(self, request: pb.ComputeLogProbsRequest, context) -> pb.ComputeResponse:
        if request.role == pb.ROLE_REWARD:
            raise InvalidArgument("the reward model has a score head, no log-probs: call ComputeScores for it")
        out = self.service.compute_logprobs(
            role_name(request.role),
            [BatchRef.from_proto(k) for k in request.inputs],
            BatchRef.from_proto(request.output),
            with_entropy=request.with_entropy,
            temperature=_temperature(request),
            micro_batch_tokens=optional_field(request, "micro_batch_tokens"),
            output_name=request.output_name,
            columns=list(request.columns),
            weight_version=optional_field(request, "weight_version"),
            more_passes=_passes(request),
        )
        return _compute_reply(out)

    def ComputeScores(self, request: pb.ComputeScoresRequest, context) -> pb.ComputeResponse:
        role = role_name(request.role) if request.role else "reward"
        if role != "reward":
            raise InvalidArgument(
                f"ComputeScores scores with the reward model: role {role!r} has no score head; "
                "leave role unset (or ROLE_REWARD) and load the reward model under ROLE_REWARD"
            )
        out = self.service.compute_scores(
            [BatchRef.from_proto(k) for k in request.inputs],
            BatchRef.from_proto(request.output),
            micro_batch_tokens=optional_field(request, "micro_batch_tokens"),
            output_name=request.output_name,
            columns=list(request.columns),
        )
        return _compute_reply(out)

    def ComputeValues(self, request: pb.ComputeValuesRequest, context) -> pb.ComputeResponse:
        out = self.service.compute_values(
            [BatchRef.from_proto(k) for k in request.inputs],
            BatchRef.from_proto(request.output),
            optional_field(request, "micro_batch_tokens"),
            columns=list(request.columns),
        )
        return _compute_reply(out)

    def TrainStep(self, request: pb.TrainStepRequest, context) -> pb.TrainStepResponse:
        role = role_name(request.role)
        out = self.service.train_step(
            role,
            [BatchRef.from_proto(k) for k in request.inputs],
            loss_settings(request.loss, role, self.service.cfg.defaults.loss),
            micro_batch_tokens=optional_field(request, "micro_batch_tokens"),
            mini_batches=optional_field(request, "mini_batches"),
            lr_override=optional_field(request, "lr_override"),
            columns=list(request.columns),
            weight_version=optional_field(request, "weight_version"),
            step_lrs=list(request.step_lrs),
            temperature=_temperature(request),
        )
        tag_span({A.TOKENS: out["tokens"], A.MICRO_BATCHES: out.pop("micro_batches")})
        return pb.TrainStepResponse(**out)

    def SaveCheckpoint(self, request: pb.SaveCheckpointRequest, context) -> pb.SaveCheckpointResponse:
        if not request.path:
            raise InvalidArgument("SaveCheckpoint needs a path")
        if request.step < 0:
            raise InvalidArgument(f"step = {request.step} must be >= 0 (the training step it saves)", field="step")
        path = self.service.cfg.paths.target(request.path, "path")  # never a root; replaces only a checkpoint
        size = self.service.save_checkpoint(role_name(request.role), path, request.step, request.data_state)
        return pb.SaveCheckpointResponse(path=request.path, bytes=size)

    def LoadCheckpoint(self, request: pb.LoadCheckpointRequest, context) -> pb.LoadCheckpointResponse:
        step, data_state = self.service.load_checkpoint(role_name(request.role), self._inside(request.path, "path"))
        return pb.LoadCheckpointResponse(step=step, data_state=data_state)

    def InitWeightUpdateGroup(self, request, context) -> pb.InitWeightUpdateGroupResponse:
        return pb.InitWeightUpdateGroupResponse(world_size=self.service.join_group(request.group))

    def DestroyWeightUpdateGroup(self, request, context) -> pb.DestroyWeightUpdateGroupResponse:
        self.service.destroy_group(request.group_name)
        return pb.DestroyWeightUpdateGroupResponse()

    def PublishWeights(self, request: pb.PublishWeightsRequest, context) -> pb.PublishWeightsResponse:
        if request.transport not in TRANSPORTS:
            raise InvalidArgument(
                "PublishWeights needs transport WEIGHT_TRANSPORT_DISK or WEIGHT_TRANSPORT_DISTRIBUTED"
            )
        out = self.service.publish(
            role_name(request.role or pb.ROLE_ACTOR),
            TRANSPORTS[request.transport],
            request.version,
            disk_root=self._inside(request.disk_root, "disk_root") if request.disk_root else "",
            keep_last=request.keep_last,
            bucket_bytes=request.bucket_bytes,
            group_name=request.group_name,
            delta=request.delta,
            max_delta_fraction=request.max_delta_fraction,
        )
        tag_span({A.TRANSPORT: TRANSPORTS[request.transport], A.WEIGHT_VERSION: out.version, A.BYTES: out.bytes})
        reply = pb.PublishWeightsResponse(
            version=out.version,
            bytes=out.bytes,
            buckets=out.buckets,
            seconds=out.seconds,
            checksums=weights_pb2.WeightChecksums(version=out.version, sha256=out.checksums),
            backend=backend_proto(out.backend),
        )
        if out.disk is not None:
            reply.disk.CopyFrom(out.disk)
        return reply

    def GetWeightChecksums(self, request: pb.GetWeightChecksumsRequest, context) -> weights_pb2.WeightChecksums:
        version, sums = self.service.checksums(role_name(request.role or pb.ROLE_ACTOR))
        return weights_pb2.WeightChecksums(version=version, sha256=sums)

    def GetStatus(self, request: pb.GetStatusRequest, context) -> pb.TrainerStatus:
        status = self.service.status()
        roles = [
            pb.RoleStatus(
                role=role_proto(name),
                model_path=r["model_path"],
                num_parameters=r["num_parameters"],
                train_steps=r["train_steps"],
                weight_version=r["weight_version"],
            )
            for name, r in status["roles"].items()
        ]
        return pb.TrainerStatus(
            roles=roles,
            device=status["device"],
            data_parallel_size=status["data_parallel_size"],
            tensor_parallel_size=status["tensor_parallel_size"],
            pipeline_parallel_size=status["pipeline_parallel_size"],
            metrics=status["metrics"],
        )

    def Offload(self, request: pb.OffloadRequest, context) -> pb.OffloadResponse:
        return pb.OffloadResponse(**self.service.set_residency(False))

    def Onload(self, request: pb.OffloadRequest, context) -> pb.OffloadResponse:
        return pb.OffloadResponse(**self.service.set_residency(True))


def service(trainer: TrainerService) -> Service:
    return Service(trainer_pb2_grpc.add_TrainerServicer_to_server, TrainerServicer(trainer), SERVICE_NAME)
