"""The Trainer gRPC servicer: converts protos at the edge and calls `TrainerService`.

Built by `__main__` on rank 0; typed errors raised below become status codes in
meshrl.common.grpc_errors (bad input -> INVALID_ARGUMENT, unknown key -> NOT_FOUND, no model -> FAILED_PRECONDITION).
"""

from __future__ import annotations

from opentelemetry import trace

from meshrl.api.common.v1 import keys_pb2, weights_pb2
from meshrl.api.trainer.v1 import trainer_pb2 as pb
from meshrl.api.trainer.v1 import trainer_pb2_grpc
from meshrl.common.errors import InvalidArgument
from meshrl.common.grpc_server import Service
from meshrl.common.telemetry import attributes as A
from meshrl.trainer.config import DefaultsConfig
from meshrl.trainer.service import Key, TrainerService

SERVICE_NAME = "meshrl.trainer.v1.Trainer"
ROLES = {pb.ROLE_ACTOR: "actor", pb.ROLE_REFERENCE: "reference", pb.ROLE_CRITIC: "critic"}
ROLE_ENUMS = {v: k for k, v in ROLES.items()}
TRANSPORTS = {weights_pb2.WEIGHT_TRANSPORT_DISK: "disk", weights_pb2.WEIGHT_TRANSPORT_DISTRIBUTED: "distributed"}


def role_name(value: int, field: str = "role") -> str:
    if value not in ROLES:
        raise InvalidArgument(f"{field} = {value} is not a role; use ROLE_ACTOR, ROLE_REFERENCE or ROLE_CRITIC")
    return ROLES[value]


def key_dict(key: keys_pb2.BatchKey) -> Key:
    if not key.job_id or not key.node_id:
        raise InvalidArgument("a batch key needs job_id and node_id")
    return {
        "job_id": key.job_id,
        "step": key.step,
        "node_id": key.node_id,
        "shard": key.shard if key.has_shard else None,
    }


def optimizer_dict(opt: pb.OptimizerConfig) -> dict | None:
    """Non-zero fields of the proto (zero = the OptimizerConfig default); None when the message is empty."""
    fields = {f.name: v for f, v in opt.ListFields()}
    return fields or None


def loss_dict(loss: pb.LossConfig, role: str, d: DefaultsConfig) -> dict:
    """The LossConfig of a request; zero / empty fields take the service defaults."""
    clip_low = loss.clip_low or d.clip_low
    return {
        "policy_loss": loss.policy_loss or ("value" if role == "critic" else d.policy_loss),
        "clip_low": clip_low,
        "clip_high": loss.clip_high or (d.clip_high if d.clip_high is not None else clip_low),
        "dual_clip": loss.dual_clip,
        "aggregation": loss.aggregation or d.aggregation,
        "kl_coef": loss.kl_coef,
        "kl_estimator": loss.kl_estimator or d.kl_estimator,
        "entropy_coef": loss.entropy_coef,
        "tis_cap": loss.tis_cap,
        "value_clip": loss.value_clip or d.value_clip,
    }


def tag_span(attributes: dict) -> None:
    """Adds `attributes` to the current (server) span, when one records."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(attributes)


def _compute_reply(out: dict) -> pb.ComputeResponse:
    tag_span({A.TOKENS: out["tokens"], A.MICRO_BATCHES: out["micro_batches"]})
    return pb.ComputeResponse(**out)


class TrainerServicer(trainer_pb2_grpc.TrainerServicer):
    def __init__(self, service: TrainerService) -> None:
        self.service = service

    def LoadModel(self, request: pb.LoadModelRequest, context) -> pb.LoadModelResponse:
        role = role_name(request.role)
        self.service.check_layout(request.parallel.tensor_parallel, request.parallel.pipeline_parallel,
                                  request.parallel.data_parallel)  # fmt: skip
        copy_from = role_name(request.copy_from, "copy_from") if request.copy_from else None
        info = self.service.load_model(
            role,
            request.model_path,
            dtype=request.dtype or "float32",
            optimizer=optimizer_dict(request.optimizer),
            seed=request.seed,
            gradient_checkpointing=request.gradient_checkpointing,
            copy_from=copy_from,
        )
        return pb.LoadModelResponse(role=request.role, **info)

    def ComputeLogProbs(self, request: pb.ComputeLogProbsRequest, context) -> pb.ComputeResponse:
        out = self.service.compute_logprobs(
            role_name(request.role),
            [key_dict(k) for k in request.inputs],
            key_dict(request.output),
            with_entropy=request.with_entropy,
            temperature=request.temperature,
            micro_batch_tokens=request.micro_batch_tokens,
            output_name=request.output_name,
        )
        return _compute_reply(out)

    def ComputeValues(self, request: pb.ComputeValuesRequest, context) -> pb.ComputeResponse:
        out = self.service.compute_values(
            [key_dict(k) for k in request.inputs], key_dict(request.output), request.micro_batch_tokens
        )
        return _compute_reply(out)

    def TrainStep(self, request: pb.TrainStepRequest, context) -> pb.TrainStepResponse:
        role = role_name(request.role)
        out = self.service.train_step(
            role,
            [key_dict(k) for k in request.inputs],
            loss_dict(request.loss, role, self.service.cfg.defaults),
            micro_batch_tokens=request.micro_batch_tokens,
            mini_batches=request.mini_batches,
            lr_override=request.lr_override,
        )
        tag_span({A.TOKENS: out["tokens"], A.MICRO_BATCHES: out.pop("micro_batches")})
        return pb.TrainStepResponse(**out)

    def SaveCheckpoint(self, request: pb.SaveCheckpointRequest, context) -> pb.SaveCheckpointResponse:
        if not request.path:
            raise InvalidArgument("SaveCheckpoint needs a path")
        size = self.service.save_checkpoint(role_name(request.role), request.path, request.step, request.data_state)
        return pb.SaveCheckpointResponse(path=request.path, bytes=size)

    def LoadCheckpoint(self, request: pb.LoadCheckpointRequest, context) -> pb.LoadCheckpointResponse:
        step, data_state = self.service.load_checkpoint(role_name(request.role), request.path)
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
            disk_root=request.disk_root,
            keep_last=request.keep_last,
            bucket_bytes=request.bucket_bytes,
            group_name=request.group_name,
        )
        tag_span({A.TRANSPORT: TRANSPORTS[request.transport], A.WEIGHT_VERSION: out.version, A.BYTES: out.bytes})
        reply = pb.PublishWeightsResponse(
            version=out.version,
            bytes=out.bytes,
            buckets=out.buckets,
            seconds=out.seconds,
            checksums=weights_pb2.WeightChecksums(version=out.version, sha256=out.checksums),
        )
        if out.disk is not None:
            reply.disk.CopyFrom(
                weights_pb2.DiskWeights(
                    path=out.disk.path, version=out.version, manifest_sha256=out.disk.manifest_sha256
                )
            )
        return reply

    def GetWeightChecksums(self, request: pb.GetWeightChecksumsRequest, context) -> weights_pb2.WeightChecksums:
        version, sums = self.service.checksums(role_name(request.role or pb.ROLE_ACTOR))
        return weights_pb2.WeightChecksums(version=version, sha256=sums)

    def GetStatus(self, request: pb.GetStatusRequest, context) -> pb.TrainerStatus:
        status = self.service.status()
        roles = [
            pb.RoleStatus(
                role=ROLE_ENUMS[name],
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


def service(trainer: TrainerService) -> Service:
    return Service(trainer_pb2_grpc.add_TrainerServicer_to_server, TrainerServicer(trainer), SERVICE_NAME)
