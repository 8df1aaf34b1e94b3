"""The Rollout gRPC servicer: converts protos at the edge and calls the replica core.

Built by `__main__` around a `RolloutReplica`; typed errors raised by the core become status
codes in meshrl.common.grpc_errors (bad input → INVALID_ARGUMENT, replica unavailable → UNAVAILABLE).
"""

from __future__ import annotations

from meshrl.api.common.v1 import weights_pb2
from meshrl.api.rollout.v1 import rollout_pb2 as pb
from meshrl.api.rollout.v1 import rollout_pb2_grpc
from meshrl.common.errors import InvalidArgument
from meshrl.common.grpc_server import Service
from meshrl.common.path_roots import PathRoots
from meshrl.common.telemetry import attributes as A
from meshrl.common.telemetry import tag_span
from meshrl.common.weights import GroupSpec
from meshrl.rollout.memory import MemoryChange, change_memory
from meshrl.rollout.replica import BatchJob, RolloutReplica
from meshrl.rollout.types import (
    DiskUpdate,
    GenerationRequest,
    GroupUpdate,
    PauseMode,
    SamplingParams,
    WeightUpdateResult,
    new_request_id,
)

SERVICE_NAME = "meshrl.rollout.v1.Rollout"
STATES = {
    "starting": pb.REPLICA_STATE_STARTING,
    "serving": pb.REPLICA_STATE_SERVING,
    "paused": pb.REPLICA_STATE_PAUSED,
    "stale": pb.REPLICA_STATE_STALE,
    "draining": pb.REPLICA_STATE_DRAINING,
}


def pause_mode(value: int, default: PauseMode = PauseMode.IN_PLACE) -> PauseMode:
    if value == weights_pb2.PAUSE_MODE_UNSPECIFIED:
        return default
    try:
        return PauseMode(value)
    except ValueError:
        raise InvalidArgument(f"pause_mode = {value} is not a PauseMode (1 = abort, 2 = in place)") from None


class RolloutServicer(rollout_pb2_grpc.RolloutServicer):
    def __init__(self, replica: RolloutReplica, roots: PathRoots | None = None) -> None:
        self.replica = replica
        self.roots = roots or PathRoots()

    def GenerateBatch(self, request: pb.GenerateBatchRequest, context) -> pb.GenerateBatchResponse:
        job = BatchJob(
            input=request.input,
            output=request.output,
            sampling=SamplingParams.from_proto(request.sampling),
            n=request.n or 1,
            job_id=request.job_id,
            step=request.step,
            row_begin=request.row_begin,
            row_end=request.row_end,
            columns=tuple(request.columns),
            alive=context.is_active,
        )
        s = self.replica.generate_batch(job)
        tag_span(
            {
                A.REPLICA: self.replica.replica_id,
                A.REQUESTS: s.samples,
                A.TOKENS: s.generated_tokens,
                A.WEIGHT_VERSION: s.max_weight_version,
            }
        )
        return pb.GenerateBatchResponse(
            samples=s.samples,
            prompt_tokens=s.prompt_tokens,
            generated_tokens=s.generated_tokens,
            seconds=s.seconds,
            min_weight_version=s.min_weight_version,
            max_weight_version=s.max_weight_version,
        )

    def GenerateStream(self, request: pb.GenerateRequest, context):
        req = GenerationRequest(
            prompt_ids=list(request.prompt_ids),
            sampling=SamplingParams.from_proto(request.sampling),
            request_id=request.request_id or new_request_id(),
            session_id=request.session_id,
        )
        engine = self.replica.engine
        decoded: list[int] = []
        text = ""
        for chunk in self.replica.stream(req, prompt_text=request.prompt_text):
            decoded.extend(chunk.token_ids)
            full = engine.detokenize(decoded) if decoded else ""
            delta = ""
            if not full.endswith("\ufffd"):  # wait for the rest of a multi-byte character
                delta, text = full[len(text) :], full
            yield pb.GenerateChunk(
                token_ids=chunk.token_ids,
                logprobs=chunk.logprobs,
                weight_versions=chunk.weight_versions,
                finish_reason=int(chunk.finish_reason or 0),
                text=delta,
            )

    def UpdateWeightsFromDisk(self, request: pb.UpdateWeightsFromDiskRequest, context) -> pb.UpdateWeightsResponse:
        w = request.weights
        staging = self.roots.inside(w.local_staging_dir, "weights.local_staging_dir") if w.local_staging_dir else ""
        update = DiskUpdate(
            self.roots.inside(w.path, "weights.path"),
            w.version,
            manifest_sha256=w.manifest_sha256,
            staging_dir=staging,
            pause_mode=pause_mode(request.pause_mode),
            flush_cache=request.flush_cache,
            delta_base=w.base_version if w.delta else None,
        )
        r = self.replica.update_weights_from_disk(update)
        return self._applied(r, "disk", request.checksum_names)

    def InitWeightUpdateGroup(self, request: pb.InitWeightUpdateGroupRequest, context):
        spec = GroupSpec.from_proto(request.group)
        return pb.InitWeightUpdateGroupResponse(rank=self.replica.init_weight_update_group(spec))

    def UpdateWeightsFromDistributed(self, request: pb.UpdateWeightsFromDistributedRequest, context):
        update = GroupUpdate(
            request.group_name or "weight_update_group",
            request.version,
            pause_mode=pause_mode(request.pause_mode),
            flush_cache=request.flush_cache,
            timeout_seconds=request.timeout_seconds or 120.0,
        )
        r = self.replica.update_weights_from_distributed(update)
        return self._applied(r, "distributed", request.checksum_names)

    def _applied(self, r: WeightUpdateResult, transport: str, checksum_names) -> pb.UpdateWeightsResponse:
        """The reply to a weight update, with the checksums of `checksum_names` (and the version they were
        taken at) when asked for; the server span gets the version, bytes and apply time."""
        tag_span(
            {
                A.REPLICA: self.replica.replica_id,
                A.TRANSPORT: transport,
                A.WEIGHT_VERSION: r.version,
                A.BYTES: r.bytes,
                A.APPLY_SECONDS: r.seconds,
            }
        )
        reply = pb.UpdateWeightsResponse(
            version=r.version, seconds=r.seconds, bytes=r.bytes, pause_seconds=r.pause_seconds
        )
        if checksum_names:
            version, sums = self.replica.weight_checksums(list(checksum_names))
            reply.checksums.CopyFrom(weights_pb2.WeightChecksums(version=version, sha256=sums))
        return reply

    def DestroyWeightUpdateGroup(self, request: pb.DestroyWeightUpdateGroupRequest, context):
        self.replica.destroy_weight_update_group(request.group_name or "weight_update_group")
        return pb.DestroyWeightUpdateGroupResponse()

    def Pause(self, request: pb.PauseRequest, context) -> pb.PauseResponse:
        return pb.PauseResponse(aborted_requests=self.replica.pause(pause_mode(request.mode)))

    def Continue(self, request: pb.ContinueRequest, context) -> pb.ContinueResponse:
        self.replica.continue_generation()
        return pb.ContinueResponse()

    def FlushCache(self, request: pb.FlushCacheRequest, context) -> pb.FlushCacheResponse:
        return pb.FlushCacheResponse(flushed=self.replica.flush_cache())

    def GetWeightChecksums(self, request: pb.GetWeightChecksumsRequest, context) -> weights_pb2.WeightChecksums:
        version, sums = self.replica.weight_checksums(list(request.names))
        return weights_pb2.WeightChecksums(version=version, sha256=sums)

    def GetStatus(self, request: pb.GetStatusRequest, context) -> pb.RolloutStatus:
        s = self.replica.status()
        return pb.RolloutStatus(
            replica_id=s.replica_id,
            engine=s.engine,
            model_path=s.model_path,
            weight_version=s.weight_version,
            state=STATES[s.state],
            queue_depth=s.queue_depth,
            running_requests=s.running_requests,
            tokens_per_second=s.tokens_per_second,
            capacity=s.capacity,
            generated_tokens=s.generated_tokens,
            device=s.device,
            weight_ranks=s.weight_ranks,
        )

    def ReleaseMemory(self, request: pb.MemoryRequest, context) -> pb.MemoryResponse:
        return _memory_reply(change_memory(self.replica.engine, True, list(request.tags)))

    def ResumeMemory(self, request: pb.MemoryRequest, context) -> pb.MemoryResponse:
        return _memory_reply(change_memory(self.replica.engine, False, list(request.tags)))


def _memory_reply(c: MemoryChange) -> pb.MemoryResponse:
    tag_span({A.BYTES: c.resident_before - c.resident_after})
    return pb.MemoryResponse(
        released=c.released,
        resident_bytes_before=c.resident_before,
        resident_bytes_after=c.resident_after,
        seconds=c.seconds,
    )


def service(replica: RolloutReplica, roots: PathRoots | None = None) -> Service:
    """The servicer; `roots`: the folders weight and staging paths must lie in (config `paths`)."""
    return Service(rollout_pb2_grpc.add_RolloutServicer_to_server, RolloutServicer(replica, roots), SERVICE_NAME)
