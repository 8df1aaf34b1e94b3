from meshrl.api.common.v1 import keys_pb2 as _keys_pb2
from meshrl.api.common.v1 import tensor_pb2 as _tensor_pb2
from meshrl.api.common.v1 import weights_pb2 as _weights_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicaState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICA_STATE_UNSPECIFIED: _ClassVar[ReplicaState]
    REPLICA_STATE_STARTING: _ClassVar[ReplicaState]
    REPLICA_STATE_SERVING: _ClassVar[ReplicaState]
    REPLICA_STATE_PAUSED: _ClassVar[ReplicaState]
    REPLICA_STATE_STALE: _ClassVar[ReplicaState]
    REPLICA_STATE_DRAINING: _ClassVar[ReplicaState]
REPLICA_STATE_UNSPECIFIED: ReplicaState
REPLICA_STATE_STARTING: ReplicaState
REPLICA_STATE_SERVING: ReplicaState
REPLICA_STATE_PAUSED: ReplicaState
REPLICA_STATE_STALE: ReplicaState
REPLICA_STATE_DRAINING: ReplicaState

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "max_tokens", "stop_token_ids", "seed", "ignore_eos")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    seed: int
    ignore_eos: bool
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., seed: _Optional[int] = ..., ignore_eos: _Optional[bool] = ...) -> None: ...

class GenerateBatchRequest(_message.Message):
    __slots__ = ("input", "output", "sampling", "n", "job_id", "step", "row_begin", "row_end", "columns")
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    ROW_BEGIN_FIELD_NUMBER: _ClassVar[int]
    ROW_END_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    input: _keys_pb2.BatchKey
    output: _keys_pb2.BatchKey
    sampling: SamplingParams
    n: int
    job_id: str
    step: int
    row_begin: int
    row_end: int
    columns: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, input: _Optional[_Union[_keys_pb2.BatchKey, _Mapping]] = ..., output: _Optional[_Union[_keys_pb2.BatchKey, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., n: _Optional[int] = ..., job_id: _Optional[str] = ..., step: _Optional[int] = ..., row_begin: _Optional[int] = ..., row_end: _Optional[int] = ..., columns: _Optional[_Iterable[str]] = ...) -> None: ...

class GenerateBatchResponse(_message.Message):
    __slots__ = ("samples", "prompt_tokens", "generated_tokens", "seconds", "min_weight_version", "max_weight_version")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    MIN_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    samples: int
    prompt_tokens: int
    generated_tokens: int
    seconds: float
    min_weight_version: int
    max_weight_version: int
    def __init__(self, samples: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., seconds: _Optional[float] = ..., min_weight_version: _Optional[int] = ..., max_weight_version: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt_ids", "prompt_text", "sampling", "session_id", "request_id")
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    prompt_text: str
    sampling: SamplingParams
    session_id: str
    request_id: str
    def __init__(self, prompt_ids: _Optional[_Iterable[int]] = ..., prompt_text: _Optional[str] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., session_id: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class GenerateChunk(_message.Message):
    __slots__ = ("token_ids", "logprobs", "weight_versions", "finish_reason", "text")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    weight_versions: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: _tensor_pb2.FinishReason
    text: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., weight_versions: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[_tensor_pb2.FinishReason, str]] = ..., text: _Optional[str] = ...) -> None: ...

class UpdateWeightsFromDiskRequest(_message.Message):
    __slots__ = ("weights", "pause_mode", "flush_cache", "checksum_names")
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    PAUSE_MODE_FIELD_NUMBER: _ClassVar[int]
    FLUSH_CACHE_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_NAMES_FIELD_NUMBER: _ClassVar[int]
    weights: _weights_pb2.DiskWeights
    pause_mode: _weights_pb2.PauseMode
    flush_cache: bool
    checksum_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, weights: _Optional[_Union[_weights_pb2.DiskWeights, _Mapping]] = ..., pause_mode: _Optional[_Union[_weights_pb2.PauseMode, str]] = ..., flush_cache: _Optional[bool] = ..., checksum_names: _Optional[_Iterable[str]] = ...) -> None: ...

class UpdateWeightsResponse(_message.Message):
    __slots__ = ("version", "seconds", "bytes", "pause_seconds", "checksums")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    PAUSE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    version: int
    seconds: float
    bytes: int
    pause_seconds: float
    checksums: _weights_pb2.WeightChecksums
    def __init__(self, version: _Optional[int] = ..., seconds: _Optional[float] = ..., bytes: _Optional[int] = ..., pause_seconds: _Optional[float] = ..., checksums: _Optional[_Union[_weights_pb2.WeightChecksums, _Mapping]] = ...) -> None: ...

class InitWeightUpdateGroupRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: _weights_pb2.CollectiveGroup
    def __init__(self, group: _Optional[_Union[_weights_pb2.CollectiveGroup, _Mapping]] = ...) -> None: ...

class InitWeightUpdateGroupResponse(_message.Message):
    __slots__ = ("rank",)
    RANK_FIELD_NUMBER: _ClassVar[int]
    rank: int
    def __init__(self, rank: _Optional[int] = ...) -> None: ...

class UpdateWeightsFromDistributedRequest(_message.Message):
    __slots__ = ("group_name", "version", "pause_mode", "flush_cache", "timeout_seconds", "checksum_names")
    GROUP_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PAUSE_MODE_FIELD_NUMBER: _ClassVar[int]
    FLUSH_CACHE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_NAMES_FIELD_NUMBER: _ClassVar[int]
    group_name: str
    version: int
    pause_mode: _weights_pb2.PauseMode
    flush_cache: bool
    timeout_seconds: float
    checksum_names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group_name: _Optional[str] = ..., version: _Optional[int] = ..., pause_mode: _Optional[_Union[_weights_pb2.PauseMode, str]] = ..., flush_cache: _Optional[bool] = ..., timeout_seconds: _Optional[float] = ..., checksum_names: _Optional[_Iterable[str]] = ...) -> None: ...

class DestroyWeightUpdateGroupRequest(_message.Message):
    __slots__ = ("group_name",)
    GROUP_NAME_FIELD_NUMBER: _ClassVar[int]
    group_name: str
    def __init__(self, group_name: _Optional[str] = ...) -> None: ...

class DestroyWeightUpdateGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ("mode",)
    MODE_FIELD_NUMBER: _ClassVar[int]
    mode: _weights_pb2.PauseMode
    def __init__(self, mode: _Optional[_Union[_weights_pb2.PauseMode, str]] = ...) -> None: ...

class PauseResponse(_message.Message):
    __slots__ = ("aborted_requests",)
    ABORTED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    aborted_requests: int
    def __init__(self, aborted_requests: _Optional[int] = ...) -> None: ...

class ContinueRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ContinueResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FlushCacheRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FlushCacheResponse(_message.Message):
    __slots__ = ("flushed",)
    FLUSHED_FIELD_NUMBER: _ClassVar[int]
    flushed: bool
    def __init__(self, flushed: _Optional[bool] = ...) -> None: ...

class GetWeightChecksumsRequest(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RolloutStatus(_message.Message):
    __slots__ = ("replica_id", "engine", "model_path", "weight_version", "state", "queue_depth", "running_requests", "tokens_per_second", "capacity", "generated_tokens", "weight_ranks", "device")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_DEPTH_FIELD_NUMBER: _ClassVar[int]
    RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_RANKS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    engine: str
    model_path: str
    weight_version: int
    state: ReplicaState
    queue_depth: int
    running_requests: int
    tokens_per_second: float
    capacity: int
    generated_tokens: int
    weight_ranks: int
    device: str
    def __init__(self, replica_id: _Optional[str] = ..., engine: _Optional[str] = ..., model_path: _Optional[str] = ..., weight_version: _Optional[int] = ..., state: _Optional[_Union[ReplicaState, str]] = ..., queue_depth: _Optional[int] = ..., running_requests: _Optional[int] = ..., tokens_per_second: _Optional[float] = ..., capacity: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., weight_ranks: _Optional[int] = ..., device: _Optional[str] = ...) -> None: ...

class MemoryRequest(_message.Message):
    __slots__ = ("tags",)
    TAGS_FIELD_NUMBER: _ClassVar[int]
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tags: _Optional[_Iterable[str]] = ...) -> None: ...

class MemoryResponse(_message.Message):
    __slots__ = ("released", "resident_bytes_before", "resident_bytes_after", "seconds")
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BYTES_BEFORE_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BYTES_AFTER_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    released: _containers.RepeatedScalarFieldContainer[str]
    resident_bytes_before: int
    resident_bytes_after: int
    seconds: float
    def __init__(self, released: _Optional[_Iterable[str]] = ..., resident_bytes_before: _Optional[int] = ..., resident_bytes_after: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...
