"""Converts weights between Hugging Face (Llama/Qwen2) names and megatron-core GPTModel's layout.

Megatron fuses q/k/v into `linear_qkv` laid out per query group ([q heads of the group, k, v] for each
of the num_kv_heads groups) and gate/up into `linear_fc1` ([gate; up]). `load_hf_weights` imports a
safetensors model directory into a model built by `meshrl.trainer.model`; `iter_hf_tensors` exports the
model back to HF names and shapes (used by `meshrl.trainer.export` and checkpoints). Errors name the
tensor that is missing, unexpected or mis-shaped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from meshrl.common.errors import DataLoss, InvalidArgument, NotFound
from meshrl.trainer.hf_config import ModelSpec

VALUE_HEAD = "score.weight"  # HF name of the critic's [1, hidden] value head (as in *ForTokenClassification)
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True)
class Mapping:
    """One Megatron parameter and the HF tensors it is made of."""

    megatron: str
    hf: tuple[str, ...]
    fuse: Callable[[list[torch.Tensor]], torch.Tensor]
    split: Callable[[torch.Tensor], list[torch.Tensor]]


def _identity_fuse(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0]


def _identity_split(tensor: torch.Tensor) -> list[torch.Tensor]:
    return [tensor]


def _qkv_fns(spec: ModelSpec):
    groups, per_group, head_dim = spec.num_kv_heads, spec.heads_per_group, spec.head_dim

    def fuse(parts: list[torch.Tensor]) -> torch.Tensor:
        q, k, v = parts
        rest = q.shape[1:]
        fused = torch.cat(
            [
                q.reshape(groups, per_group * head_dim, *rest),
                k.reshape(groups, head_dim, *rest),
                v.reshape(groups, head_dim, *rest),
            ],
            dim=1,
        )
        return fused.reshape(groups * (per_group + 2) * head_dim, *rest)

    def split(fused: torch.Tensor) -> list[torch.Tensor]:
        rest = fused.shape[1:]
        q, k, v = fused.reshape(groups, (per_group + 2) * head_dim, *rest).split(
            [per_group * head_dim, head_dim, head_dim], dim=1
        )
        return [
            q.reshape(groups * per_group * head_dim, *rest).contiguous(),
            k.reshape(groups * head_dim, *rest).contiguous(),
            v.reshape(groups * head_dim, *rest).contiguous(),
        ]

    return fuse, split


def _fc1_fuse(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts, dim=0)


def _fc1_split(fused: torch.Tensor) -> list[torch.Tensor]:
    return [t.contiguous() for t in fused.chunk(2, dim=0)]


def weight_mappings(spec: ModelSpec, *, value_head: bool = False) -> list[Mapping]:
    """Every parameter of the model built for `spec`, in HF order (embeddings, layers, norm, head)."""
    qkv_fuse, qkv_split = _qkv_fns(spec)
    same = (_identity_fuse, _identity_split)
    maps = [Mapping("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), *same)]
    for i in range(spec.num_layers):
        hf, mg = f"model.layers.{i}.", f"decoder.layers.{i}."
        maps.append(Mapping(mg + "input_layernorm.weight", (hf + "input_layernorm.weight",), *same))
        qkv = tuple(hf + f"self_attn.{p}_proj.weight" for p in "qkv")
        maps.append(Mapping(mg + "self_attention.linear_qkv.weight", qkv, qkv_fuse, qkv_split))
        if spec.qkv_bias:
            qkv_b = tuple(hf + f"self_attn.{p}_proj.bias" for p in "qkv")
            maps.append(Mapping(mg + "self_attention.linear_qkv.bias", qkv_b, qkv_fuse, qkv_split))
        maps.append(Mapping(mg + "self_attention.linear_proj.weight", (hf + "self_attn.o_proj.weight",), *same))
        maps.append(Mapping(mg + "pre_mlp_layernorm.weight", (hf + "post_attention_layernorm.weight",), *same))
        fc1 = (hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight")
        maps.append(Mapping(mg + "mlp.linear_fc1.weight", fc1, _fc1_fuse, _fc1_split))
        maps.append(Mapping(mg + "mlp.linear_fc2.weight", (hf + "mlp.down_proj.weight",), *same))
    maps.append(Mapping("decoder.final_layernorm.weight", ("model.norm.weight",), *same))
    if value_head:
        maps.append(Mapping("output_layer.weight", (VALUE_HEAD,), *same))
    elif not spec.tie_word_embeddings:
        maps.append(Mapping("output_layer.weight", ("lm_head.weight",), *same))
    return maps


def hf_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """Expected HF tensor shapes of a causal LM with `spec`."""
    h, d = spec.hidden_size, spec.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (spec.vocab_size, h), "model.norm.weight": (h,)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (spec.num_heads * d, h),
                p + "self_attn.k_proj.weight": (spec.num_kv_heads * d, h),
                p + "self_attn.v_proj.weight": (spec.num_kv_heads * d, h),
                p + "self_attn.o_proj.weight": (h, spec.num_heads * d),
                p + "mlp.gate_proj.weight": (spec.intermediate_size, h),
                p + "mlp.up_proj.weight": (spec.intermediate_size, h),
                p + "mlp.down_proj.weight": (h, spec.intermediate_size),
            }
        )
        if spec.qkv_bias:
            shapes[p + "self_attn.q_proj.bias"] = (spec.num_heads * d,)
            shapes[p + "self_attn.k_proj.bias"] = (spec.num_kv_heads * d,)
            shapes[p + "self_attn.v_proj.bias"] = (spec.num_kv_heads * d,)
    if not spec.tie_word_embeddings:
        shapes["lm_head.weight"] = (spec.vocab_size, h)
    return shapes


def _weight_files(model_dir: Path) -> dict[str, Path]:
    """HF tensor name -> safetensors file holding it (single file or sharded with an index)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return {name: model_dir / file for name, file in weight_map.items()}
    single = model_dir / "model.safetensors"
    if not single.is_file():
        raise NotFound(
            f"no model.safetensors or model.safetensors.index.json in {str(model_dir)!r}; "
            "the trainer loads safetensors weights only (convert .bin checkpoints first)"
        )
    with safe_open(single, framework="pt") as f:
        return dict.fromkeys(f.keys(), single)


def read_hf_tensors(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a HF safetensors model directory, by name (CPU, stored dtype)."""
    files = _weight_files(Path(model_dir))
    by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    tensors: dict[str, torch.Tensor] = {}
    for file, names in by_file.items():
        try:
            with safe_open(file, framework="pt") as f:
                for name in names:
                    tensors[name] = f.get_tensor(name)
        except (OSError, ValueError, RuntimeError) as err:
            raise DataLoss(f"cannot read weights file {file}: {err}") from err
    return tensors


def check_hf_tensors(tensors: dict[str, torch.Tensor], spec: ModelSpec, *, value_head: bool = False) -> None:
    """Raises InvalidArgument naming the first missing, unexpected or mis-shaped tensor."""
    expected = hf_shapes(spec)
    if value_head:
        expected.pop("lm_head.weight", None)
    missing = [name for name in expected if name not in tensors]
    if missing:
        raise InvalidArgument(
            f"weights lack {len(missing)} tensor(s) the {spec.architecture} config needs, first: {missing[0]!r}; "
            "check that config.json matches the safetensors files"
        )
    for name, tensor in tensors.items():
        if name in expected:
            if tuple(tensor.shape) != expected[name]:
                raise InvalidArgument(
                    f"tensor {name!r} has shape {tuple(tensor.shape)}, but config.json implies {expected[name]}"
                )
        elif name == "lm_head.weight" or name == VALUE_HEAD or name.endswith(_IGNORED_SUFFIXES):
            continue  # a tied model may still store lm_head; a critic ignores it
        else:
            raise InvalidArgument(
                f"unexpected tensor {name!r} in the weights: {spec.architecture} as configured has no such "
                "parameter (is config.json from a different model?)"
            )


def load_hf_tensors(
    model: torch.nn.Module, tensors: dict[str, torch.Tensor], spec: ModelSpec, *, value_head: bool = False
) -> None:
    """Copies HF-named tensors into `model` (fusing qkv and gate/up). A critic keeps its own value head
    unless `tensors` holds one under VALUE_HEAD."""
    check_hf_tensors(tensors, spec, value_head=value_head)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for m in weight_mappings(spec, value_head=value_head):
            if m.hf == (VALUE_HEAD,) and VALUE_HEAD not in tensors:
                continue
            fused = m.fuse([tensors[name] for name in m.hf])
            target = params.get(m.megatron)
            if target is None:
                raise InvalidArgument(f"the built model has no parameter {m.megatron!r} (needed for {m.hf[0]!r})")
            if target.shape != fused.shape:
                raise InvalidArgument(
                    f"tensor {m.megatron!r} built from {list(m.hf)} has shape {tuple(fused.shape)}, "
                    f"the model expects {tuple(target.shape)}"
                )
            target.copy_(fused.to(dtype=target.dtype, device=target.device))


def load_hf_weights(
    model: torch.nn.Module, model_dir: str | Path, spec: ModelSpec, *, value_head: bool = False
) -> None:
    """Imports a HF safetensors model directory into a GPTModel built for `spec`."""
    load_hf_tensors(model, read_hf_tensors(model_dir), spec, value_head=value_head)


def iter_hf_tensors(
    model: torch.nn.Module, spec: ModelSpec, *, value_head: bool = False
) -> Iterator[tuple[str, torch.Tensor]]:
    """Exports `model` as (HF name, tensor) pairs in HF order and shapes; tensors are detached views/copies
    on the model's device and dtype (a tied model yields no lm_head.weight)."""
    params = dict(model.named_parameters())
    for m in weight_mappings(spec, value_head=value_head):
        parts = m.split(params[m.megatron].detach())
        yield from zip(m.hf, parts, strict=True)
