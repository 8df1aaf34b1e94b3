from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class BatchKey(_message.Message):
    __slots__ = ("job_id", "step", "node_id", "shard", "has_shard")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_FIELD_NUMBER: _ClassVar[int]
    HAS_SHARD_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    step: int
    node_id: str
    shard: int
    has_shard: bool
    def __init__(self, job_id: _Optional[str] = ..., step: _Optional[int] = ..., node_id: _Optional[str] = ..., shard: _Optional[int] = ..., has_shard: _Optional[bool] = ...) -> None: ...
