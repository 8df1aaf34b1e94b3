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

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_ACTOR: _ClassVar[Role]
    ROLE_REFERENCE: _ClassVar[Role]
    ROLE_CRITIC: _ClassVar[Role]
    ROLE_REWARD: _ClassVar[Role]

class DecayStyle(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECAY_STYLE_UNSPECIFIED: _ClassVar[DecayStyle]
    DECAY_STYLE_CONSTANT: _ClassVar[DecayStyle]
    DECAY_STYLE_LINEAR: _ClassVar[DecayStyle]
    DECAY_STYLE_COSINE: _ClassVar[DecayStyle]

class ImportanceLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IMPORTANCE_LEVEL_UNSPECIFIED: _ClassVar[ImportanceLevel]
    IMPORTANCE_LEVEL_TOKEN: _ClassVar[ImportanceLevel]
    IMPORTANCE_LEVEL_SEQUENCE: _ClassVar[ImportanceLevel]

class OldLogProbs(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OLD_LOG_PROBS_UNSPECIFIED: _ClassVar[OldLogProbs]
    OLD_LOG_PROBS_RECOMPUTE: _ClassVar[OldLogProbs]
    OLD_LOG_PROBS_ROLLOUT: _ClassVar[OldLogProbs]
    OLD_LOG_PROBS_IN_TRAIN: _ClassVar[OldLogProbs]
    OLD_LOG_PROBS_INTERPOLATED: _ClassVar[OldLogProbs]

class PolicyLoss(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POLICY_LOSS_UNSPECIFIED: _ClassVar[PolicyLoss]
    POLICY_LOSS_PPO: _ClassVar[PolicyLoss]
    POLICY_LOSS_GSPO: _ClassVar[PolicyLoss]
    POLICY_LOSS_SFT: _ClassVar[PolicyLoss]
    POLICY_LOSS_VALUE: _ClassVar[PolicyLoss]

class LossAggregation(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOSS_AGGREGATION_UNSPECIFIED: _ClassVar[LossAggregation]
    LOSS_AGGREGATION_TOKEN_MEAN: _ClassVar[LossAggregation]
    LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM: _ClassVar[LossAggregation]
    LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN: _ClassVar[LossAggregation]

class KlEstimator(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    KL_ESTIMATOR_UNSPECIFIED: _ClassVar[KlEstimator]
    KL_ESTIMATOR_K1: _ClassVar[KlEstimator]
    KL_ESTIMATOR_K2: _ClassVar[KlEstimator]
    KL_ESTIMATOR_K3: _ClassVar[KlEstimator]
ROLE_UNSPECIFIED: Role
ROLE_ACTOR: Role
ROLE_REFERENCE: Role
ROLE_CRITIC: Role
ROLE_REWARD: Role
DECAY_STYLE_UNSPECIFIED: DecayStyle
DECAY_STYLE_CONSTANT: DecayStyle
DECAY_STYLE_LINEAR: DecayStyle
DECAY_STYLE_COSINE: DecayStyle
IMPORTANCE_LEVEL_UNSPECIFIED: ImportanceLevel
IMPORTANCE_LEVEL_TOKEN: ImportanceLevel
IMPORTANCE_LEVEL_SEQUENCE: ImportanceLevel
OLD_LOG_PROBS_UNSPECIFIED: OldLogProbs
OLD_LOG_PROBS_RECOMPUTE: OldLogProbs
OLD_LOG_PROBS_ROLLOUT: OldLogProbs
OLD_LOG_PROBS_IN_TRAIN: OldLogProbs
OLD_LOG_PROBS_INTERPOLATED: OldLogProbs
POLICY_LOSS_UNSPECIFIED: PolicyLoss
POLICY_LOSS_PPO: PolicyLoss
POLICY_LOSS_GSPO: PolicyLoss
POLICY_LOSS_SFT: PolicyLoss
POLICY_LOSS_VALUE: PolicyLoss
LOSS_AGGREGATION_UNSPECIFIED: LossAggregation
LOSS_AGGREGATION_TOKEN_MEAN: LossAggregation
LOSS_AGGREGATION_SEQ_MEAN_TOKEN_SUM: LossAggregation
LOSS_AGGREGATION_SEQ_MEAN_TOKEN_MEAN: LossAggregation
KL_ESTIMATOR_UNSPECIFIED: KlEstimator
KL_ESTIMATOR_K1: KlEstimator
KL_ESTIMATOR_K2: KlEstimator
KL_ESTIMATOR_K3: KlEstimator

class OptimizerConfig(_message.Message):
    __slots__ = ("lr", "min_lr", "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad", "warmup_steps", "decay_steps", "decay_style", "name", "distributed")
    LR_FIELD_NUMBER: _ClassVar[int]
    MIN_LR_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_DECAY_FIELD_NUMBER: _ClassVar[int]
    ADAM_BETA1_FIELD_NUMBER: _ClassVar[int]
    ADAM_BETA2_FIELD_NUMBER: _ClassVar[int]
    ADAM_EPS_FIELD_NUMBER: _ClassVar[int]
    CLIP_GRAD_FIELD_NUMBER: _ClassVar[int]
    WARMUP_STEPS_FIELD_NUMBER: _ClassVar[int]
    DECAY_STEPS_FIELD_NUMBER: _ClassVar[int]
    DECAY_STYLE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DISTRIBUTED_FIELD_NUMBER: _ClassVar[int]
    lr: float
    min_lr: float
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    clip_grad: float
    warmup_steps: int
    decay_steps: int
    decay_style: DecayStyle
    name: str
    distributed: bool
    def __init__(self, lr: _Optional[float] = ..., min_lr: _Optional[float] = ..., weight_decay: _Optional[float] = ..., adam_beta1: _Optional[float] = ..., adam_beta2: _Optional[float] = ..., adam_eps: _Optional[float] = ..., clip_grad: _Optional[float] = ..., warmup_steps: _Optional[int] = ..., decay_steps: _Optional[int] = ..., decay_style: _Optional[_Union[DecayStyle, str]] = ..., name: _Optional[str] = ..., distributed: _Optional[bool] = ...) -> None: ...

class ParallelConfig(_message.Message):
    __slots__ = ("tensor_parallel", "pipeline_parallel", "data_parallel")
    TENSOR_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    DATA_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    tensor_parallel: int
    pipeline_parallel: int
    data_parallel: int
    def __init__(self, tensor_parallel: _Optional[int] = ..., pipeline_parallel: _Optional[int] = ..., data_parallel: _Optional[int] = ...) -> None: ...

class LoadModelRequest(_message.Message):
    __slots__ = ("role", "model_path", "dtype", "optimizer", "parallel", "seed", "gradient_checkpointing", "copy_from")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    GRADIENT_CHECKPOINTING_FIELD_NUMBER: _ClassVar[int]
    COPY_FROM_FIELD_NUMBER: _ClassVar[int]
    role: Role
    model_path: str
    dtype: _tensor_pb2.DType
    optimizer: OptimizerConfig
    parallel: ParallelConfig
    seed: int
    gradient_checkpointing: bool
    copy_from: Role
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., model_path: _Optional[str] = ..., dtype: _Optional[_Union[_tensor_pb2.DType, str]] = ..., optimizer: _Optional[_Union[OptimizerConfig, _Mapping]] = ..., parallel: _Optional[_Union[ParallelConfig, _Mapping]] = ..., seed: _Optional[int] = ..., gradient_checkpointing: _Optional[bool] = ..., copy_from: _Optional[_Union[Role, str]] = ...) -> None: ...

class LoadModelResponse(_message.Message):
    __slots__ = ("role", "num_parameters", "architecture", "vocab_size")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    role: Role
    num_parameters: int
    architecture: str
    vocab_size: int
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., num_parameters: _Optional[int] = ..., architecture: _Optional[str] = ..., vocab_size: _Optional[int] = ...) -> None: ...

class ComputeLogProbsRequest(_message.Message):
    __slots__ = ("role", "inputs", "output", "with_entropy", "temperature", "micro_batch_tokens", "output_name", "columns", "weight_version", "more_passes")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    WITH_ENTROPY_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_NAME_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    MORE_PASSES_FIELD_NUMBER: _ClassVar[int]
    role: Role
    inputs: _containers.RepeatedCompositeFieldContainer[_keys_pb2.BatchKey]
    output: _keys_pb2.BatchKey
    with_entropy: bool
    temperature: float
    micro_batch_tokens: int
    output_name: str
    columns: _containers.RepeatedScalarFieldContainer[str]
    weight_version: int
    more_passes: _containers.RepeatedCompositeFieldContainer[LogProbPass]
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., inputs: _Optional[_Iterable[_Union[_keys_pb2.BatchKey, _Mapping]]] = ..., output: _Optional[_Union[_keys_pb2.BatchKey, _Mapping]] = ..., with_entropy: _Optional[bool] = ..., temperature: _Optional[float] = ..., micro_batch_tokens: _Optional[int] = ..., output_name: _Optional[str] = ..., columns: _Optional[_Iterable[str]] = ..., weight_version: _Optional[int] = ..., more_passes: _Optional[_Iterable[_Union[LogProbPass, _Mapping]]] = ...) -> None: ...

class LogProbPass(_message.Message):
    __slots__ = ("role", "output", "with_entropy", "output_name", "weight_version")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    WITH_ENTROPY_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    role: Role
    output: _keys_pb2.BatchKey
    with_entropy: bool
    output_name: str
    weight_version: int
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., output: _Optional[_Union[_keys_pb2.BatchKey, _Mapping]] = ..., with_entropy: _Optional[bool] = ..., output_name: _Optional[str] = ..., weight_version: _Optional[int] = ...) -> None: ...

class ComputeValuesRequest(_message.Message):
    __slots__ = ("inputs", "output", "micro_batch_tokens", "columns")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[_keys_pb2.BatchKey]
    output: _keys_pb2.BatchKey
    micro_batch_tokens: int
    columns: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, inputs: _Optional[_Iterable[_Union[_keys_pb2.BatchKey, _Mapping]]] = ..., output: _Optional[_Union[_keys_pb2.BatchKey, _Mapping]] = ..., micro_batch_tokens: _Optional[int] = ..., columns: _Optional[_Iterable[str]] = ...) -> None: ...

class ComputeScoresRequest(_message.Message):
    __slots__ = ("role", "inputs", "output", "micro_batch_tokens", "output_name", "columns")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_NAME_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    role: Role
    inputs: _containers.RepeatedCompositeFieldContainer[_keys_pb2.BatchKey]
    output: _keys_pb2.BatchKey
    micro_batch_tokens: int
    output_name: str
    columns: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., inputs: _Optional[_Iterable[_Union[_keys_pb2.BatchKey, _Mapping]]] = ..., output: _Optional[_Union[_keys_pb2.BatchKey, _Mapping]] = ..., micro_batch_tokens: _Optional[int] = ..., output_name: _Optional[str] = ..., columns: _Optional[_Iterable[str]] = ...) -> None: ...

class ComputeResponse(_message.Message):
    __slots__ = ("tokens", "micro_batches", "metrics", "passes")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCHES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    PASSES_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    micro_batches: int
    metrics: _containers.ScalarMap[str, float]
    passes: _containers.RepeatedCompositeFieldContainer[PassResult]
    def __init__(self, tokens: _Optional[int] = ..., micro_batches: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., passes: _Optional[_Iterable[_Union[PassResult, _Mapping]]] = ...) -> None: ...

class PassResult(_message.Message):
    __slots__ = ("tokens", "micro_batches", "metrics")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCHES_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    micro_batches: int
    metrics: _containers.ScalarMap[str, float]
    def __init__(self, tokens: _Optional[int] = ..., micro_batches: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ...) -> None: ...

class LossConfig(_message.Message):
    __slots__ = ("policy_loss", "clip_low", "clip_high", "dual_clip", "aggregation", "kl_coef", "kl_estimator", "entropy_coef", "tis_cap", "value_clip", "mis_cap", "old_logprobs", "lag_lr_scale", "is_level")
    POLICY_LOSS_FIELD_NUMBER: _ClassVar[int]
    CLIP_LOW_FIELD_NUMBER: _ClassVar[int]
    CLIP_HIGH_FIELD_NUMBER: _ClassVar[int]
    DUAL_CLIP_FIELD_NUMBER: _ClassVar[int]
    AGGREGATION_FIELD_NUMBER: _ClassVar[int]
    KL_COEF_FIELD_NUMBER: _ClassVar[int]
    KL_ESTIMATOR_FIELD_NUMBER: _ClassVar[int]
    ENTROPY_COEF_FIELD_NUMBER: _ClassVar[int]
    TIS_CAP_FIELD_NUMBER: _ClassVar[int]
    VALUE_CLIP_FIELD_NUMBER: _ClassVar[int]
    MIS_CAP_FIELD_NUMBER: _ClassVar[int]
    OLD_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LAG_LR_SCALE_FIELD_NUMBER: _ClassVar[int]
    IS_LEVEL_FIELD_NUMBER: _ClassVar[int]
    policy_loss: PolicyLoss
    clip_low: float
    clip_high: float
    dual_clip: float
    aggregation: LossAggregation
    kl_coef: float
    kl_estimator: KlEstimator
    entropy_coef: float
    tis_cap: float
    value_clip: float
    mis_cap: float
    old_logprobs: OldLogProbs
    lag_lr_scale: float
    is_level: ImportanceLevel
    def __init__(self, policy_loss: _Optional[_Union[PolicyLoss, str]] = ..., clip_low: _Optional[float] = ..., clip_high: _Optional[float] = ..., dual_clip: _Optional[float] = ..., aggregation: _Optional[_Union[LossAggregation, str]] = ..., kl_coef: _Optional[float] = ..., kl_estimator: _Optional[_Union[KlEstimator, str]] = ..., entropy_coef: _Optional[float] = ..., tis_cap: _Optional[float] = ..., value_clip: _Optional[float] = ..., mis_cap: _Optional[float] = ..., old_logprobs: _Optional[_Union[OldLogProbs, str]] = ..., lag_lr_scale: _Optional[float] = ..., is_level: _Optional[_Union[ImportanceLevel, str]] = ...) -> None: ...

class TrainStepRequest(_message.Message):
    __slots__ = ("role", "inputs", "loss", "micro_batch_tokens", "mini_batches", "global_step", "lr_override", "columns", "weight_version", "step_lrs", "temperature")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    MICRO_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MINI_BATCHES_FIELD_NUMBER: _ClassVar[int]
    GLOBAL_STEP_FIELD_NUMBER: _ClassVar[int]
    LR_OVERRIDE_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    STEP_LRS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    role: Role
    inputs: _containers.RepeatedCompositeFieldContainer[_keys_pb2.BatchKey]
    loss: LossConfig
    micro_batch_tokens: int
    mini_batches: int
    global_step: int
    lr_override: float
    columns: _containers.RepeatedScalarFieldContainer[str]
    weight_version: int
    step_lrs: _containers.RepeatedScalarFieldContainer[float]
    temperature: float
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., inputs: _Optional[_Iterable[_Union[_keys_pb2.BatchKey, _Mapping]]] = ..., loss: _Optional[_Union[LossConfig, _Mapping]] = ..., micro_batch_tokens: _Optional[int] = ..., mini_batches: _Optional[int] = ..., global_step: _Optional[int] = ..., lr_override: _Optional[float] = ..., columns: _Optional[_Iterable[str]] = ..., weight_version: _Optional[int] = ..., step_lrs: _Optional[_Iterable[float]] = ..., temperature: _Optional[float] = ...) -> None: ...

class TrainStepResponse(_message.Message):
    __slots__ = ("metrics", "tokens", "optimizer_steps", "step_losses")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    METRICS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    OPTIMIZER_STEPS_FIELD_NUMBER: _ClassVar[int]
    STEP_LOSSES_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.ScalarMap[str, float]
    tokens: int
    optimizer_steps: int
    step_losses: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, metrics: _Optional[_Mapping[str, float]] = ..., tokens: _Optional[int] = ..., optimizer_steps: _Optional[int] = ..., step_losses: _Optional[_Iterable[float]] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ("role", "path", "step", "data_state")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    DATA_STATE_FIELD_NUMBER: _ClassVar[int]
    role: Role
    path: str
    step: int
    data_state: bytes
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., path: _Optional[str] = ..., step: _Optional[int] = ..., data_state: _Optional[bytes] = ...) -> None: ...

class SaveCheckpointResponse(_message.Message):
    __slots__ = ("path", "bytes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    path: str
    bytes: int
    def __init__(self, path: _Optional[str] = ..., bytes: _Optional[int] = ...) -> None: ...

class LoadCheckpointRequest(_message.Message):
    __slots__ = ("role", "path")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    role: Role
    path: str
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., path: _Optional[str] = ...) -> None: ...

class LoadCheckpointResponse(_message.Message):
    __slots__ = ("step", "data_state")
    STEP_FIELD_NUMBER: _ClassVar[int]
    DATA_STATE_FIELD_NUMBER: _ClassVar[int]
    step: int
    data_state: bytes
    def __init__(self, step: _Optional[int] = ..., data_state: _Optional[bytes] = ...) -> None: ...

class InitWeightUpdateGroupRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: _weights_pb2.CollectiveGroup
    def __init__(self, group: _Optional[_Union[_weights_pb2.CollectiveGroup, _Mapping]] = ...) -> None: ...

class InitWeightUpdateGroupResponse(_message.Message):
    __slots__ = ("world_size",)
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    world_size: int
    def __init__(self, world_size: _Optional[int] = ...) -> None: ...

class DestroyWeightUpdateGroupRequest(_message.Message):
    __slots__ = ("group_name",)
    GROUP_NAME_FIELD_NUMBER: _ClassVar[int]
    group_name: str
    def __init__(self, group_name: _Optional[str] = ...) -> None: ...

class DestroyWeightUpdateGroupResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PublishWeightsRequest(_message.Message):
    __slots__ = ("role", "transport", "version", "disk_root", "keep_last", "bucket_bytes", "group_name", "timeout_seconds", "delta", "max_delta_fraction")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DISK_ROOT_FIELD_NUMBER: _ClassVar[int]
    KEEP_LAST_FIELD_NUMBER: _ClassVar[int]
    BUCKET_BYTES_FIELD_NUMBER: _ClassVar[int]
    GROUP_NAME_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    MAX_DELTA_FRACTION_FIELD_NUMBER: _ClassVar[int]
    role: Role
    transport: _weights_pb2.WeightTransport
    version: int
    disk_root: str
    keep_last: int
    bucket_bytes: int
    group_name: str
    timeout_seconds: float
    delta: bool
    max_delta_fraction: float
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., transport: _Optional[_Union[_weights_pb2.WeightTransport, str]] = ..., version: _Optional[int] = ..., disk_root: _Optional[str] = ..., keep_last: _Optional[int] = ..., bucket_bytes: _Optional[int] = ..., group_name: _Optional[str] = ..., timeout_seconds: _Optional[float] = ..., delta: _Optional[bool] = ..., max_delta_fraction: _Optional[float] = ...) -> None: ...

class PublishWeightsResponse(_message.Message):
    __slots__ = ("version", "bytes", "buckets", "disk", "checksums", "seconds", "backend")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    version: int
    bytes: int
    buckets: int
    disk: _weights_pb2.DiskWeights
    checksums: _weights_pb2.WeightChecksums
    seconds: float
    backend: _weights_pb2.CommBackend
    def __init__(self, version: _Optional[int] = ..., bytes: _Optional[int] = ..., buckets: _Optional[int] = ..., disk: _Optional[_Union[_weights_pb2.DiskWeights, _Mapping]] = ..., checksums: _Optional[_Union[_weights_pb2.WeightChecksums, _Mapping]] = ..., seconds: _Optional[float] = ..., backend: _Optional[_Union[_weights_pb2.CommBackend, str]] = ...) -> None: ...

class GetWeightChecksumsRequest(_message.Message):
    __slots__ = ("role",)
    ROLE_FIELD_NUMBER: _ClassVar[int]
    role: Role
    def __init__(self, role: _Optional[_Union[Role, str]] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RoleStatus(_message.Message):
    __slots__ = ("role", "model_path", "num_parameters", "train_steps", "weight_version")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    TRAIN_STEPS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_VERSION_FIELD_NUMBER: _ClassVar[int]
    role: Role
    model_path: str
    num_parameters: int
    train_steps: int
    weight_version: int
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., model_path: _Optional[str] = ..., num_parameters: _Optional[int] = ..., train_steps: _Optional[int] = ..., weight_version: _Optional[int] = ...) -> None: ...

class TrainerStatus(_message.Message):
    __slots__ = ("roles", "device", "data_parallel_size", "metrics", "tensor_parallel_size", "pipeline_parallel_size")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ROLES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DATA_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    roles: _containers.RepeatedCompositeFieldContainer[RoleStatus]
    device: str
    data_parallel_size: int
    metrics: _containers.ScalarMap[str, float]
    tensor_parallel_size: int
    pipeline_parallel_size: int
    def __init__(self, roles: _Optional[_Iterable[_Union[RoleStatus, _Mapping]]] = ..., device: _Optional[str] = ..., data_parallel_size: _Optional[int] = ..., metrics: _Optional[_Mapping[str, float]] = ..., tensor_parallel_size: _Optional[int] = ..., pipeline_parallel_size: _Optional[int] = ...) -> None: ...

class OffloadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class OffloadResponse(_message.Message):
    __slots__ = ("bytes", "seconds", "device")
    BYTES_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    seconds: float
    device: str
    def __init__(self, bytes: _Optional[int] = ..., seconds: _Optional[float] = ..., device: _Optional[str] = ...) -> None: ...
