"""Reads a Hugging Face model directory's config.json into the trainer's typed model spec.

Supports the Llama and Qwen2 families (RMSNorm, SwiGLU, RoPE, GQA, tied or untied embeddings,
qkv bias for Qwen2) and refuses everything else with an error that names what is unsupported.
Called by `meshrl.trainer.model` (to build the megatron-core model) and `hf_weights` / `export`
(to map tensor names and shapes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshrl.common.errors import InvalidArgument, NotFound

# HF `architectures[0]` -> our family name.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}

# megatron-core's llama3 RoPE scaling hard-codes these; other values cannot be reproduced.
_LLAMA3_ROPE_DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only model, independent of HF or Megatron naming."""

    architecture: str  # HF class name, e.g. "Qwen2ForCausalLM"
    family: str  # "llama" | "qwen2"
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    rope_scaling_factor: float | None = None  # llama3-style scaling factor, None = plain RoPE

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads


def _rope(config: dict[str, Any]) -> tuple[float, float | None]:
    """RoPE theta and llama3 scaling factor from either the legacy or the transformers-5 layout."""
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    theta = config.get("rope_theta", params.get("rope_theta"))
    if theta is None:
        theta = 10000.0
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if rope_type == "default":
        return float(theta), None
    if rope_type == "llama3":
        source = params if params.get("rope_type") == "llama3" else scaling
        for key, expected in _LLAMA3_ROPE_DEFAULTS.items():
            if key in source and float(source[key]) != expected:
                raise InvalidArgument(
                    f"rope scaling '{key}' = {source[key]} is not supported (megatron-core fixes it to {expected}); "
                    "use a model with the standard llama3 RoPE scaling or plain RoPE"
                )
        return float(theta), float(source.get("factor", 8.0))
    raise InvalidArgument(f"RoPE type {rope_type!r} is not supported; supported: 'default', 'llama3'")


def spec_from_config(config: dict[str, Any]) -> ModelSpec:
    """Maps a parsed config.json to a ModelSpec, refusing unsupported architectures and options."""
    archs = config.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise InvalidArgument(
            f"model architecture {arch!r} (model_type {config.get('model_type')!r}) is not supported; "
            f"supported: {sorted(SUPPORTED_ARCHITECTURES)}. Convert the model or use a Llama/Qwen2-family model"
        )
    family = SUPPORTED_ARCHITECTURES[arch]
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise InvalidArgument(f"hidden_act {act!r} is not supported; only SwiGLU ('silu') MLPs are")
    if family == "llama" and (config.get("attention_bias") or config.get("mlp_bias")):
        raise InvalidArgument("Llama models with attention_bias or mlp_bias are not supported; both must be false")
    if family == "qwen2" and config.get("use_sliding_window"):
        raise InvalidArgument("Qwen2 models with use_sliding_window=true are not supported; set it to false")
    try:
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        theta, scaling = _rope(config)
        spec = ModelSpec(
            architecture=arch,
            family=family,
            vocab_size=int(config["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=int(config["intermediate_size"]),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            max_position_embeddings=int(config.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2",
            rope_scaling_factor=scaling,
        )
    except KeyError as err:
        raise InvalidArgument(f"config.json lacks the field {err.args[0]!r} needed to build a {arch}") from None
    if spec.num_heads % spec.num_kv_heads:
        raise InvalidArgument(
            f"num_attention_heads {spec.num_heads} is not a multiple of num_key_value_heads {spec.num_kv_heads}"
        )
    return spec


def read_hf_config(model_dir: str | Path) -> ModelSpec:
    """Reads `<model_dir>/config.json` into a ModelSpec."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise NotFound(f"no config.json in model directory {str(model_dir)!r}; pass a Hugging Face model directory")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise InvalidArgument(f"{path} is not valid JSON: {err}") from None
    return spec_from_config(config)
