from meshrl.api.common.v1 import keys_pb2 as _keys_pb2
from meshrl.api.common.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PutBatchStart(_message.Message):
    __slots__ = ("key", "header", "ttl_seconds", "overwrite")
    KEY_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    key: _keys_pb2.BatchKey
    header: _tensor_pb2.BatchHeader
    ttl_seconds: int
    overwrite: bool
    def __init__(self, key: _Optional[_Union[_keys_pb2.BatchKey, _Mapping]] = ..., header: _Optional[_Union[_tensor_pb2.BatchHeader, _Mapping]] = ..., ttl_seconds: _Optional[int] = ..., overwrite: _Optional[bool] = ...) -> None: ...

class PutBatchRequest(_message.Message):
    __slots__ = ("start", "payload")
    START_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    start: PutBatchStart
    payload: bytes
    def __init__(self, start: _Optional[_Union[PutBatchStart, _Mapping]] = ..., payload: _Optional[bytes] = ...) -> None: ...

class PutSmallBatchRequest(_message.Message):
    __slots__ = ("start", "payload")
    START_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    start: PutBatchStart
    payload: bytes
    def __init__(self, start: _Optional[_Union[PutBatchStart, _Mapping]] = ..., payload: _Optional[bytes] = ...) -> None: ...

class PutBatchResponse(_message.Message):
    __slots__ = ("bytes_written", "chunks")
    BYTES_WRITTEN_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    bytes_written: int
    chunks: int
    def __init__(self, bytes_written: _Optional[int] = ..., chunks: _Optional[int] = ...) -> None: ...

class RowRange(_message.Message):
    __slots__ = ("begin", "end")
    BEGIN_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    begin: int
    end: int
    def __init__(self, begin: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class GetBatchRequest(_message.Message):
    __slots__ = ("key", "wait_seconds", "columns", "missing_ok", "rows", "inline_below")
    KEY_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    MISSING_OK_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    INLINE_BELOW_FIELD_NUMBER: _ClassVar[int]
    key: _keys_pb2.BatchKey
    wait_seconds: float
    columns: _containers.RepeatedScalarFieldContainer[str]
    missing_ok: bool
    rows: RowRange
    inline_below: int
    def __init__(self, key: _Optional[_Union[_keys_pb2.BatchKey, _Mapping]] = ..., wait_seconds: _Optional[float] = ..., columns: _Optional[_Iterable[str]] = ..., missing_ok: _Optional[bool] = ..., rows: _Optional[_Union[RowRange, _Mapping]] = ..., inline_below: _Optional[int] = ...) -> None: ...

class GetBatchResponse(_message.Message):
    __slots__ = ("header", "payload")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    header: _tensor_pb2.BatchHeader
    payload: bytes
    def __init__(self, header: _Optional[_Union[_tensor_pb2.BatchHeader, _Mapping]] = ..., payload: _Optional[bytes] = ...) -> None: ...

class GetSmallBatchResponse(_message.Message):
    __slots__ = ("header", "payload", "too_large")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    TOO_LARGE_FIELD_NUMBER: _ClassVar[int]
    header: _tensor_pb2.BatchHeader
    payload: bytes
    too_large: bool
    def __init__(self, header: _Optional[_Union[_tensor_pb2.BatchHeader, _Mapping]] = ..., payload: _Optional[bytes] = ..., too_large: _Optional[bool] = ...) -> None: ...

class GetSmallBatchesRequest(_message.Message):
    __slots__ = ("gets", "limit_bytes")
    GETS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    gets: _containers.RepeatedCompositeFieldContainer[GetBatchRequest]
    limit_bytes: int
    def __init__(self, gets: _Optional[_Iterable[_Union[GetBatchRequest, _Mapping]]] = ..., limit_bytes: _Optional[int] = ...) -> None: ...

class GetSmallBatchesResponse(_message.Message):
    __slots__ = ("batches",)
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[GetSmallBatchResponse]
    def __init__(self, batches: _Optional[_Iterable[_Union[GetSmallBatchResponse, _Mapping]]] = ...) -> None: ...

class DeleteBatchRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: _keys_pb2.BatchKey
    def __init__(self, key: _Optional[_Union[_keys_pb2.BatchKey, _Mapping]] = ...) -> None: ...

class DeleteBatchResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class DeleteStepRequest(_message.Message):
    __slots__ = ("job_id", "step")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: int
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...

class DeleteStepResponse(_message.Message):
    __slots__ = ("batches_deleted", "job_bytes_before")
    BATCHES_DELETED_FIELD_NUMBER: _ClassVar[int]
    JOB_BYTES_BEFORE_FIELD_NUMBER: _ClassVar[int]
    batches_deleted: int
    job_bytes_before: int
    def __init__(self, batches_deleted: _Optional[int] = ..., job_bytes_before: _Optional[int] = ...) -> None: ...

class ListBatchesRequest(_message.Message):
    __slots__ = ("job_id", "step")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: int
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...

class ListBatchesResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[_keys_pb2.BatchKey]
    def __init__(self, keys: _Optional[_Iterable[_Union[_keys_pb2.BatchKey, _Mapping]]] = ...) -> None: ...

class DeleteJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class DeleteJobResponse(_message.Message):
    __slots__ = ("batches_deleted", "streams_deleted")
    BATCHES_DELETED_FIELD_NUMBER: _ClassVar[int]
    STREAMS_DELETED_FIELD_NUMBER: _ClassVar[int]
    batches_deleted: int
    streams_deleted: int
    def __init__(self, batches_deleted: _Optional[int] = ..., streams_deleted: _Optional[int] = ...) -> None: ...

class SampleGroup(_message.Message):
    __slots__ = ("group_id", "weight_version", "batch")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    weight_version: int
    batch: _tensor_pb2.TensorBatch
    def __init__(self, group_id: _Optional[str] = ..., weight_version: _Optional[int] = ..., batch: _Optional[_Union[_tensor_pb2.TensorBatch, _Mapping]] = ...) -> None: ...

class AppendGroupsRequest(_message.Message):
    __slots__ = ("job_id", "stream", "groups")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    stream: str
    groups: _containers.RepeatedCompositeFieldContainer[SampleGroup]
    def __init__(self, job_id: _Optional[str] = ..., stream: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[SampleGroup, _Mapping]]] = ...) -> None: ...

class AppendGroupsResponse(_message.Message):
    __slots__ = ("entry_ids",)
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    entry_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, entry_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReadGroupsRequest(_message.Message):
    __slots__ = ("job_id", "stream", "consumer_group", "consumer", "max_groups", "block_seconds", "min_weight_version", "claim_idle_seconds")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    MAX_GROUPS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MIN_WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    CLAIM_IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    stream: str
    consumer_group: str
    consumer: str
    max_groups: int
    block_seconds: float
    min_weight_version: int
    claim_idle_seconds: float
    def __init__(self, job_id: _Optional[str] = ..., stream: _Optional[str] = ..., consumer_group: _Optional[str] = ..., consumer: _Optional[str] = ..., max_groups: _Optional[int] = ..., block_seconds: _Optional[float] = ..., min_weight_version: _Optional[int] = ..., claim_idle_seconds: _Optional[float] = ...) -> None: ...

class DeliveredGroup(_message.Message):
    __slots__ = ("entry_id", "group", "delivery_count")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    group: SampleGroup
    delivery_count: int
    def __init__(self, entry_id: _Optional[str] = ..., group: _Optional[_Union[SampleGroup, _Mapping]] = ..., delivery_count: _Optional[int] = ...) -> None: ...

class ReadGroupsResponse(_message.Message):
    __slots__ = ("groups", "dropped_stale")
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[DeliveredGroup]
    dropped_stale: int
    def __init__(self, groups: _Optional[_Iterable[_Union[DeliveredGroup, _Mapping]]] = ..., dropped_stale: _Optional[int] = ...) -> None: ...

class AckGroupsRequest(_message.Message):
    __slots__ = ("job_id", "stream", "consumer_group", "entry_ids")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    ENTRY_IDS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    stream: str
    consumer_group: str
    entry_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, job_id: _Optional[str] = ..., stream: _Optional[str] = ..., consumer_group: _Optional[str] = ..., entry_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AckGroupsResponse(_message.Message):
    __slots__ = ("acked",)
    ACKED_FIELD_NUMBER: _ClassVar[int]
    acked: int
    def __init__(self, acked: _Optional[int] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class StreamStats(_message.Message):
    __slots__ = ("job_id", "stream", "consumer_group", "length", "pending", "lag")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_GROUP_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    stream: str
    consumer_group: str
    length: int
    pending: int
    lag: int
    def __init__(self, job_id: _Optional[str] = ..., stream: _Optional[str] = ..., consumer_group: _Optional[str] = ..., length: _Optional[int] = ..., pending: _Optional[int] = ..., lag: _Optional[int] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("batches", "bytes", "streams", "drops_by_reason", "budget_bytes", "budget_entries", "get_calls", "get_bytes", "get_rows")
    class DropsByReasonEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    DROPS_BY_REASON_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    GET_CALLS_FIELD_NUMBER: _ClassVar[int]
    GET_BYTES_FIELD_NUMBER: _ClassVar[int]
    GET_ROWS_FIELD_NUMBER: _ClassVar[int]
    batches: int
    bytes: int
    streams: _containers.RepeatedCompositeFieldContainer[StreamStats]
    drops_by_reason: _containers.ScalarMap[str, int]
    budget_bytes: int
    budget_entries: int
    get_calls: int
    get_bytes: int
    get_rows: int
    def __init__(self, batches: _Optional[int] = ..., bytes: _Optional[int] = ..., streams: _Optional[_Iterable[_Union[StreamStats, _Mapping]]] = ..., drops_by_reason: _Optional[_Mapping[str, int]] = ..., budget_bytes: _Optional[int] = ..., budget_entries: _Optional[int] = ..., get_calls: _Optional[int] = ..., get_bytes: _Optional[int] = ..., get_rows: _Optional[int] = ...) -> None: ...

class DescribeDirectPathRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeDirectPathResponse(_message.Message):
    __slots__ = ("chunk_key_template", "chunk_bytes", "staging_ttl_ms", "max_batch_bytes", "redis_hint", "zero_rpc")
    CHUNK_KEY_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    STAGING_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_BYTES_FIELD_NUMBER: _ClassVar[int]
    REDIS_HINT_FIELD_NUMBER: _ClassVar[int]
    ZERO_RPC_FIELD_NUMBER: _ClassVar[int]
    chunk_key_template: str
    chunk_bytes: int
    staging_ttl_ms: int
    max_batch_bytes: int
    redis_hint: str
    zero_rpc: ZeroRpcPath
    def __init__(self, chunk_key_template: _Optional[str] = ..., chunk_bytes: _Optional[int] = ..., staging_ttl_ms: _Optional[int] = ..., max_batch_bytes: _Optional[int] = ..., redis_hint: _Optional[str] = ..., zero_rpc: _Optional[_Union[ZeroRpcPath, _Mapping]] = ...) -> None: ...

class ZeroRpcPath(_message.Message):
    __slots__ = ("put_sha", "count_read_sha", "manifest_key_template", "staging_key_template", "job_batches_key_template", "jobs_key", "ledger_keys", "commit_channel", "read_stats_key", "batch_tag_template", "embed_max_bytes", "max_header_bytes", "max_ttl_seconds", "default_ttl_seconds", "overwrite_grace_ms", "ttl_margin_ms", "budget_max_bytes", "budget_max_entries", "value_key_template")
    PUT_SHA_FIELD_NUMBER: _ClassVar[int]
    COUNT_READ_SHA_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_KEY_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    STAGING_KEY_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    JOB_BATCHES_KEY_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    JOBS_KEY_FIELD_NUMBER: _ClassVar[int]
    LEDGER_KEYS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_CHANNEL_FIELD_NUMBER: _ClassVar[int]
    READ_STATS_KEY_FIELD_NUMBER: _ClassVar[int]
    BATCH_TAG_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    EMBED_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_HEADER_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_GRACE_MS_FIELD_NUMBER: _ClassVar[int]
    TTL_MARGIN_MS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_MAX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    VALUE_KEY_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    put_sha: str
    count_read_sha: str
    manifest_key_template: str
    staging_key_template: str
    job_batches_key_template: str
    jobs_key: str
    ledger_keys: _containers.RepeatedScalarFieldContainer[str]
    commit_channel: str
    read_stats_key: str
    batch_tag_template: str
    embed_max_bytes: int
    max_header_bytes: int
    max_ttl_seconds: int
    default_ttl_seconds: int
    overwrite_grace_ms: int
    ttl_margin_ms: int
    budget_max_bytes: int
    budget_max_entries: int
    value_key_template: str
    def __init__(self, put_sha: _Optional[str] = ..., count_read_sha: _Optional[str] = ..., manifest_key_template: _Optional[str] = ..., staging_key_template: _Optional[str] = ..., job_batches_key_template: _Optional[str] = ..., jobs_key: _Optional[str] = ..., ledger_keys: _Optional[_Iterable[str]] = ..., commit_channel: _Optional[str] = ..., read_stats_key: _Optional[str] = ..., batch_tag_template: _Optional[str] = ..., embed_max_bytes: _Optional[int] = ..., max_header_bytes: _Optional[int] = ..., max_ttl_seconds: _Optional[int] = ..., default_ttl_seconds: _Optional[int] = ..., overwrite_grace_ms: _Optional[int] = ..., ttl_margin_ms: _Optional[int] = ..., budget_max_bytes: _Optional[int] = ..., budget_max_entries: _Optional[int] = ..., value_key_template: _Optional[str] = ...) -> None: ...

class CommitDirectPutRequest(_message.Message):
    __slots__ = ("start", "generation", "chunks")
    START_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    start: PutBatchStart
    generation: str
    chunks: int
    def __init__(self, start: _Optional[_Union[PutBatchStart, _Mapping]] = ..., generation: _Optional[str] = ..., chunks: _Optional[int] = ...) -> None: ...

class ValueRange(_message.Message):
    __slots__ = ("key", "first", "last", "whole")
    KEY_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    WHOLE_FIELD_NUMBER: _ClassVar[int]
    key: str
    first: int
    last: int
    whole: bool
    def __init__(self, key: _Optional[str] = ..., first: _Optional[int] = ..., last: _Optional[int] = ..., whole: _Optional[bool] = ...) -> None: ...

class LocateBatchResponse(_message.Message):
    __slots__ = ("header", "ranges", "manifest_key", "generation", "inline", "payload")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RANGES_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_KEY_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    INLINE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    header: _tensor_pb2.BatchHeader
    ranges: _containers.RepeatedCompositeFieldContainer[ValueRange]
    manifest_key: str
    generation: str
    inline: bool
    payload: bytes
    def __init__(self, header: _Optional[_Union[_tensor_pb2.BatchHeader, _Mapping]] = ..., ranges: _Optional[_Iterable[_Union[ValueRange, _Mapping]]] = ..., manifest_key: _Optional[str] = ..., generation: _Optional[str] = ..., inline: _Optional[bool] = ..., payload: _Optional[bytes] = ...) -> None: ...
