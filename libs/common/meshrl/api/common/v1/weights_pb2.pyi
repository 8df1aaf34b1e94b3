from meshrl.api.common.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WeightTransport(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHT_TRANSPORT_UNSPECIFIED: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_DISK: _ClassVar[WeightTransport]
    WEIGHT_TRANSPORT_DISTRIBUTED: _ClassVar[WeightTransport]

class CommBackend(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMM_BACKEND_UNSPECIFIED: _ClassVar[CommBackend]
    COMM_BACKEND_GLOO: _ClassVar[CommBackend]
    COMM_BACKEND_NCCL: _ClassVar[CommBackend]

class GroupProtocol(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    GROUP_PROTOCOL_UNSPECIFIED: _ClassVar[GroupProtocol]
    GROUP_PROTOCOL_MESHRL: _ClassVar[GroupProtocol]
    GROUP_PROTOCOL_ENGINE: _ClassVar[GroupProtocol]

class PauseMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PAUSE_MODE_UNSPECIFIED: _ClassVar[PauseMode]
    PAUSE_MODE_ABORT: _ClassVar[PauseMode]
    PAUSE_MODE_IN_PLACE: _ClassVar[PauseMode]

class CacheFlushPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CACHE_FLUSH_POLICY_UNSPECIFIED: _ClassVar[CacheFlushPolicy]
    CACHE_FLUSH_POLICY_EVERY_UPDATE: _ClassVar[CacheFlushPolicy]
    CACHE_FLUSH_POLICY_EVERY_N: _ClassVar[CacheFlushPolicy]
    CACHE_FLUSH_POLICY_NEVER: _ClassVar[CacheFlushPolicy]
WEIGHT_TRANSPORT_UNSPECIFIED: WeightTransport
WEIGHT_TRANSPORT_DISK: WeightTransport
WEIGHT_TRANSPORT_DISTRIBUTED: WeightTransport
COMM_BACKEND_UNSPECIFIED: CommBackend
COMM_BACKEND_GLOO: CommBackend
COMM_BACKEND_NCCL: CommBackend
GROUP_PROTOCOL_UNSPECIFIED: GroupProtocol
GROUP_PROTOCOL_MESHRL: GroupProtocol
GROUP_PROTOCOL_ENGINE: GroupProtocol
PAUSE_MODE_UNSPECIFIED: PauseMode
PAUSE_MODE_ABORT: PauseMode
PAUSE_MODE_IN_PLACE: PauseMode
CACHE_FLUSH_POLICY_UNSPECIFIED: CacheFlushPolicy
CACHE_FLUSH_POLICY_EVERY_UPDATE: CacheFlushPolicy
CACHE_FLUSH_POLICY_EVERY_N: CacheFlushPolicy
CACHE_FLUSH_POLICY_NEVER: CacheFlushPolicy

class DiskWeights(_message.Message):
    __slots__ = ("path", "version", "manifest_sha256", "local_staging_dir", "delta", "base_version", "delta_bytes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_SHA256_FIELD_NUMBER: _ClassVar[int]
    LOCAL_STAGING_DIR_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    BASE_VERSION_FIELD_NUMBER: _ClassVar[int]
    DELTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    path: str
    version: int
    manifest_sha256: str
    local_staging_dir: str
    delta: bool
    base_version: int
    delta_bytes: int
    def __init__(self, path: _Optional[str] = ..., version: _Optional[int] = ..., manifest_sha256: _Optional[str] = ..., local_staging_dir: _Optional[str] = ..., delta: _Optional[bool] = ..., base_version: _Optional[int] = ..., delta_bytes: _Optional[int] = ...) -> None: ...

class CollectiveGroup(_message.Message):
    __slots__ = ("master_address", "master_port", "world_size", "rank_offset", "group_name", "backend", "timeout_seconds", "protocol", "sealed")
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_PORT_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    RANK_OFFSET_FIELD_NUMBER: _ClassVar[int]
    GROUP_NAME_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    master_address: str
    master_port: int
    world_size: int
    rank_offset: int
    group_name: str
    backend: CommBackend
    timeout_seconds: float
    protocol: GroupProtocol
    sealed: bool
    def __init__(self, master_address: _Optional[str] = ..., master_port: _Optional[int] = ..., world_size: _Optional[int] = ..., rank_offset: _Optional[int] = ..., group_name: _Optional[str] = ..., backend: _Optional[_Union[CommBackend, str]] = ..., timeout_seconds: _Optional[float] = ..., protocol: _Optional[_Union[GroupProtocol, str]] = ..., sealed: _Optional[bool] = ...) -> None: ...

class WeightBucketMeta(_message.Message):
    __slots__ = ("version", "bucket_index", "num_buckets", "tensors")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BUCKET_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_BUCKETS_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    version: int
    bucket_index: int
    num_buckets: int
    tensors: _containers.RepeatedCompositeFieldContainer[_tensor_pb2.TensorSpec]
    def __init__(self, version: _Optional[int] = ..., bucket_index: _Optional[int] = ..., num_buckets: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[_tensor_pb2.TensorSpec, _Mapping]]] = ...) -> None: ...

class WeightChecksums(_message.Message):
    __slots__ = ("version", "sha256")
    class Sha256Entry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    version: int
    sha256: _containers.ScalarMap[str, str]
    def __init__(self, version: _Optional[int] = ..., sha256: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Metrics(_message.Message):
    __slots__ = ("values",)
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.ScalarMap[str, float]
    def __init__(self, values: _Optional[_Mapping[str, float]] = ...) -> None: ...
