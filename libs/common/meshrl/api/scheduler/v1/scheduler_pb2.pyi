from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATE_UNSPECIFIED: _ClassVar[JobState]
    JOB_STATE_PENDING: _ClassVar[JobState]
    JOB_STATE_RUNNING: _ClassVar[JobState]
    JOB_STATE_SUCCEEDED: _ClassVar[JobState]
    JOB_STATE_FAILED: _ClassVar[JobState]
    JOB_STATE_CANCELLED: _ClassVar[JobState]

class NodeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NODE_STATE_UNSPECIFIED: _ClassVar[NodeState]
    NODE_STATE_PENDING: _ClassVar[NodeState]
    NODE_STATE_RUNNING: _ClassVar[NodeState]
    NODE_STATE_COMPLETED: _ClassVar[NodeState]
    NODE_STATE_FAILED: _ClassVar[NodeState]
JOB_STATE_UNSPECIFIED: JobState
JOB_STATE_PENDING: JobState
JOB_STATE_RUNNING: JobState
JOB_STATE_SUCCEEDED: JobState
JOB_STATE_FAILED: JobState
JOB_STATE_CANCELLED: JobState
NODE_STATE_UNSPECIFIED: NodeState
NODE_STATE_PENDING: NodeState
NODE_STATE_RUNNING: NodeState
NODE_STATE_COMPLETED: NodeState
NODE_STATE_FAILED: NodeState

class SubmitJobRequest(_message.Message):
    __slots__ = ("workflow_yaml", "workflow_name", "config_yaml", "overrides", "job_id", "resume_run_dir")
    WORKFLOW_YAML_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIG_YAML_FIELD_NUMBER: _ClassVar[int]
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RESUME_RUN_DIR_FIELD_NUMBER: _ClassVar[int]
    workflow_yaml: str
    workflow_name: str
    config_yaml: str
    overrides: _containers.RepeatedScalarFieldContainer[str]
    job_id: str
    resume_run_dir: str
    def __init__(self, workflow_yaml: _Optional[str] = ..., workflow_name: _Optional[str] = ..., config_yaml: _Optional[str] = ..., overrides: _Optional[_Iterable[str]] = ..., job_id: _Optional[str] = ..., resume_run_dir: _Optional[str] = ...) -> None: ...

class GetJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "state", "step", "total_steps", "run_dir", "error", "created_at", "updated_at", "last_metrics", "workflow", "placements")
    class LastMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    RUN_DIR_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_METRICS_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    PLACEMENTS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    state: JobState
    step: int
    total_steps: int
    run_dir: str
    error: str
    created_at: float
    updated_at: float
    last_metrics: _containers.ScalarMap[str, float]
    workflow: str
    placements: _containers.RepeatedCompositeFieldContainer[Placement]
    def __init__(self, job_id: _Optional[str] = ..., state: _Optional[_Union[JobState, str]] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., run_dir: _Optional[str] = ..., error: _Optional[str] = ..., created_at: _Optional[float] = ..., updated_at: _Optional[float] = ..., last_metrics: _Optional[_Mapping[str, float]] = ..., workflow: _Optional[str] = ..., placements: _Optional[_Iterable[_Union[Placement, _Mapping]]] = ...) -> None: ...

class Placement(_message.Message):
    __slots__ = ("service", "rank", "address", "worker", "node", "bundle", "devices")
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    service: str
    rank: int
    address: str
    worker: str
    node: str
    bundle: int
    devices: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, service: _Optional[str] = ..., rank: _Optional[int] = ..., address: _Optional[str] = ..., worker: _Optional[str] = ..., node: _Optional[str] = ..., bundle: _Optional[int] = ..., devices: _Optional[_Iterable[int]] = ...) -> None: ...

class WatchJobRequest(_message.Message):
    __slots__ = ("job_id", "from_sequence")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    from_sequence: int
    def __init__(self, job_id: _Optional[str] = ..., from_sequence: _Optional[int] = ...) -> None: ...

class NodeEvent(_message.Message):
    __slots__ = ("step", "node_id", "state", "seconds", "error")
    STEP_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    step: int
    node_id: str
    state: NodeState
    seconds: float
    error: str
    def __init__(self, step: _Optional[int] = ..., node_id: _Optional[str] = ..., state: _Optional[_Union[NodeState, str]] = ..., seconds: _Optional[float] = ..., error: _Optional[str] = ...) -> None: ...

class StepMetrics(_message.Message):
    __slots__ = ("step", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    STEP_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    step: int
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, step: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class JobStateChange(_message.Message):
    __slots__ = ("state", "message")
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    state: JobState
    message: str
    def __init__(self, state: _Optional[_Union[JobState, str]] = ..., message: _Optional[str] = ...) -> None: ...

class JobEvent(_message.Message):
    __slots__ = ("sequence", "time", "job_id", "node", "metrics", "state", "log")
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LOG_FIELD_NUMBER: _ClassVar[int]
    sequence: int
    time: float
    job_id: str
    node: NodeEvent
    metrics: StepMetrics
    state: JobStateChange
    log: str
    def __init__(self, sequence: _Optional[int] = ..., time: _Optional[float] = ..., job_id: _Optional[str] = ..., node: _Optional[_Union[NodeEvent, _Mapping]] = ..., metrics: _Optional[_Union[StepMetrics, _Mapping]] = ..., state: _Optional[_Union[JobStateChange, _Mapping]] = ..., log: _Optional[str] = ...) -> None: ...

class CancelJobRequest(_message.Message):
    __slots__ = ("job_id",)
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    def __init__(self, job_id: _Optional[str] = ...) -> None: ...

class ScaleServiceRequest(_message.Message):
    __slots__ = ("job_id", "service", "replicas")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    SERVICE_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    service: str
    replicas: int
    def __init__(self, job_id: _Optional[str] = ..., service: _Optional[str] = ..., replicas: _Optional[int] = ...) -> None: ...

class ScaleServiceResponse(_message.Message):
    __slots__ = ("replicas", "addresses")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    replicas: int
    addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replicas: _Optional[int] = ..., addresses: _Optional[_Iterable[str]] = ...) -> None: ...
