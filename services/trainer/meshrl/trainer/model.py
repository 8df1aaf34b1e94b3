"""Builds megatron-core GPTModels (policy/reference LM, or critic with a scalar value head) from a ModelSpec.

Each rank builds its own part: the layers of its pipeline stage (embedding on the first, final norm and output
layer on the last) with tensor-parallel shards of every linear layer and of the (padded) vocabulary.
Called by `meshrl.trainer.core` when a role loads a model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig

from meshrl.common.errors import FailedPrecondition, InvalidArgument
from meshrl.trainer import megatron_compat
from meshrl.trainer.hf_config import ModelSpec
from meshrl.trainer.parallel import Layout, current_layout, init_parallel_state

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise InvalidArgument(f"dtype {name!r} is not supported; use one of {sorted(DTYPES)}")
    return DTYPES[name]


def ensure_parallel_state(tensor_parallel: int = 1, pipeline_parallel: int = 1) -> Layout:
    """Initialises megatron-core's parallel state (see `meshrl.trainer.parallel.init_parallel_state`)."""
    return init_parallel_state(tensor_parallel, pipeline_parallel)


def padded_vocab_size(vocab_size: int, tensor_parallel: int) -> int:
    """The vocabulary rounded up to a multiple of TP; the extra rows are zero and masked out of every softmax."""
    return -(-vocab_size // tensor_parallel) * tensor_parallel


def check_fits_layout(spec: ModelSpec, layout: Layout, *, value_head: bool) -> None:
    """Raises InvalidArgument when the model cannot be split at `layout` (names the field and the fix)."""
    tp, pp = layout.tensor_parallel, layout.pipeline_parallel
    problems = [
        (spec.num_kv_heads % tp, f"num_key_value_heads {spec.num_kv_heads} is not divisible by tensor_parallel {tp}"),
        (spec.num_heads % tp, f"num_attention_heads {spec.num_heads} is not divisible by tensor_parallel {tp}"),
        (spec.intermediate_size % tp, f"intermediate_size {spec.intermediate_size} is not divisible by TP {tp}"),
        (spec.num_layers % pp, f"num_hidden_layers {spec.num_layers} is not divisible by pipeline_parallel {pp}"),
        (value_head and tp > 1, "the critic's scalar value head cannot be split: load the critic at tensor_parallel 1"),
    ]
    for bad, message in problems:
        if bad:
            raise InvalidArgument(f"model cannot be laid out at {layout.describe()}: {message}")


def transformer_config(
    spec: ModelSpec, dtype: torch.dtype, *, gradient_checkpointing: bool = False
) -> TransformerConfig:
    """The TransformerConfig equivalent to the HF model: RMSNorm, SwiGLU, GQA, qkv bias, no dropout."""
    extra = {}
    if gradient_checkpointing and torch.cuda.is_available():  # on the CPU: megatron_compat.checkpoint_layers
        extra = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    layout = current_layout()
    return TransformerConfig(
        tensor_model_parallel_size=layout.tensor_parallel,
        pipeline_model_parallel_size=layout.pipeline_parallel,
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_heads,
        num_query_groups=spec.num_kv_heads,
        kv_channels=spec.head_dim,
        ffn_hidden_size=spec.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=spec.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=spec.qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        use_cpu_initialization=True,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        init_method_std=0.02,
        calculate_per_token_loss=True,  # losses arrive normalised by the global token count: sum, never average
        variable_seq_lengths=True,  # micro-batches differ in shape: pipeline p2p sends shapes first
        moe_token_dispatcher_type="alltoall",  # no MoE; the default ("allgather") refuses variable lengths
        **extra,
    )


def build_gpt_model(
    spec: ModelSpec,
    *,
    dtype: torch.dtype = torch.float32,
    value_head: bool = False,
    seed: int = 0,
    gradient_checkpointing: bool = False,
) -> GPTModel:
    """A freshly initialised GPTModel shaped like `spec`, on CUDA when present, else CPU.

    value_head=False: a causal LM; forward(input_ids [b, s], position_ids [b, s], None) -> logits [b, s, vocab].
    value_head=True: a critic; the output layer is a [1, hidden] projection, so forward returns values [b, s, 1].
    At TP > 1 the logits are this rank's vocabulary shard [b, s, padded_vocab / TP]; a pipeline stage other
    than the last returns hidden states. Weights are random (seeded); load real ones with `meshrl.trainer.sharding`.
    """
    if not parallel_state.model_parallel_is_initialized():
        raise FailedPrecondition("megatron-core parallel state is not initialised; call ensure_parallel_state() first")
    layout = current_layout()
    check_fits_layout(spec, layout, value_head=value_head)
    megatron_compat.seed_ranks(seed)
    config = transformer_config(spec, dtype, gradient_checkpointing=gradient_checkpointing)
    megatron_compat.adjust_config(config)
    layer_spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    megatron_compat.patch_layer_spec(layer_spec)
    with megatron_compat.cpu_devices():  # tied embeddings at PP > 1: an all-reduce of `.cuda()` weights
        model = _gpt_model(spec, config, layer_spec, layout, value_head)
    if value_head and layout.last_stage:
        model.output_layer = tensor_parallel.ColumnParallelLinear(
            spec.hidden_size,
            1,
            config=config,
            init_method=config.init_method,
            bias=False,
            skip_bias_add=False,
            gather_output=False,
            tp_group=parallel_state.get_tensor_model_parallel_group(),
        )
    megatron_compat.patch_model(model)
    if gradient_checkpointing:
        megatron_compat.checkpoint_layers(model)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return model.to(device=device, dtype=dtype)


def _gpt_model(spec: ModelSpec, config: TransformerConfig, layer_spec, layout: Layout, value_head: bool) -> GPTModel:
    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=padded_vocab_size(spec.vocab_size, layout.tensor_parallel),
        max_sequence_length=spec.max_position_embeddings,
        pre_process=layout.first_stage,
        post_process=layout.last_stage,
        parallel_output=True,
        share_embeddings_and_output_weights=spec.tie_word_embeddings and not value_head,
        position_embedding_type="rope",
        rotary_base=int(spec.rope_theta) if float(spec.rope_theta).is_integer() else spec.rope_theta,
        rope_scaling=spec.rope_scaling_factor is not None,
        rope_scaling_factor=spec.rope_scaling_factor or 8.0,
    )
