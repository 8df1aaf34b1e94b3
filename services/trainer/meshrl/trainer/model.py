"""Builds megatron-core GPTModels (policy/reference LM, or critic with a scalar value head) from a ModelSpec.

Also owns the process-wide parallel state megatron-core needs (tensor/pipeline parallel = 1; data
parallel = the torch.distributed world). Called by `meshrl.trainer.core` when a role loads a model.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.models.gpt.gpt_model import GPTModel
from megatron.core.transformer.transformer_config import TransformerConfig

from meshrl.common.errors import FailedPrecondition, InvalidArgument
from meshrl.trainer import megatron_compat
from meshrl.trainer.hf_config import ModelSpec

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise InvalidArgument(f"dtype {name!r} is not supported; use one of {sorted(DTYPES)}")
    return DTYPES[name]


def ensure_parallel_state() -> None:
    """Initialises megatron-core's parallel state with TP=PP=1 over the current torch.distributed world.

    With no process group yet, starts a single-process gloo group (in-memory store), so one trainer
    process needs no rendezvous. Several ranks must call `torch.distributed.init_process_group` first.
    """
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)


def transformer_config(
    spec: ModelSpec, dtype: torch.dtype, *, gradient_checkpointing: bool = False
) -> TransformerConfig:
    """The TransformerConfig equivalent to the HF model: RMSNorm, SwiGLU, GQA, qkv bias, no dropout."""
    extra = {}
    if gradient_checkpointing and torch.cuda.is_available():  # on the CPU: megatron_compat.checkpoint_layers
        extra = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    return TransformerConfig(
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
    Weights are random (seeded); load real ones with `meshrl.trainer.hf_weights.load_hf_weights`.
    """
    if not parallel_state.model_parallel_is_initialized():
        raise FailedPrecondition("megatron-core parallel state is not initialised; call ensure_parallel_state() first")
    torch.manual_seed(seed)
    config = transformer_config(spec, dtype, gradient_checkpointing=gradient_checkpointing)
    layer_spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    megatron_compat.patch_layer_spec(layer_spec)
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=spec.vocab_size,
        max_sequence_length=spec.max_position_embeddings,
        pre_process=True,
        post_process=True,
        parallel_output=True,
        share_embeddings_and_output_weights=spec.tie_word_embeddings and not value_head,
        position_embedding_type="rope",
        rotary_base=int(spec.rope_theta) if float(spec.rope_theta).is_integer() else spec.rope_theta,
        rope_scaling=spec.rope_scaling_factor is not None,
        rope_scaling_factor=spec.rope_scaling_factor or 8.0,
    )
    if value_head:
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
