"""Runs a Hugging Face causal LM for the transformers engine: prefill one prompt, decode a batch.

Owned by `TransformersEngine`; only its batcher thread calls `prefill` / `decode`, so the model
is never used by two threads at once. Weight updates go through `named_parameters` and copy
into the existing tensors (no re-allocation), so the KV batch and every reference stay valid.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.cache_utils import DynamicCache

from meshrl.common.errors import ConfigError, InvalidArgument
from meshrl.rollout.kv_batch import KVBatch, SeqKV

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _out_cache(out) -> DynamicCache:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _as_list(value) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


class HFModelRunner:
    """The model, its tokenizer and the two forward passes the batcher needs."""

    def __init__(
        self,
        model_path: str,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        attn_implementation: str = "sdpa",
        context_length: int | None = None,
        num_threads: int | None = None,
    ) -> None:
        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise ConfigError(
                "engine.model_path",
                model_path,
                "is not a Hugging Face model folder (no config.json)",
                "point it at a folder written by save_pretrained (e.g. `python -m meshrl.trainer.model_builder DIR`)",
            )
        if dtype not in DTYPES:
            raise ConfigError("engine.dtype", dtype, "is not supported", f"use one of {sorted(DTYPES)}")
        if num_threads:
            torch.set_num_threads(num_threads)
        self.model_path = str(path)
        self.device = torch.device(device)
        self.config = AutoConfig.from_pretrained(path)
        _check_full_attention(self.config, model_path)
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[dtype], attn_implementation=attn_implementation
        ).to(self.device)
        self.model.eval()
        # transformers >= 5.2x names the cache argument `cache`; earlier versions `past_key_values`.
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.tokenizer = AutoTokenizer.from_pretrained(path) if (path / "tokenizer_config.json").is_file() else None
        self.context_length = _context_length(self.config, context_length)
        self.vocab_size = int(self.config.vocab_size)
        self.eos_token_ids = _eos_ids(self.config, path)

    @torch.inference_mode()
    def prefill(self, token_ids: Sequence[int], prefix: SeqKV | None = None) -> tuple[SeqKV, torch.Tensor]:
        """Runs the prompt (after a cached `prefix` of it, if given); returns its cache and last logits [V] fp32."""
        start = prefix[0][0].shape[2] if prefix else 0
        suffix = list(token_ids)[start:]
        if not suffix:
            raise InvalidArgument("prefill needs at least one token beyond the cached prefix")
        ids = torch.tensor([suffix], dtype=torch.long, device=self.device)
        positions = torch.arange(start, start + len(suffix), device=self.device)[None]
        cache = DynamicCache(ddp_cache_data=prefix) if prefix else DynamicCache()
        out = self.model(
            input_ids=ids, position_ids=positions, use_cache=True, logits_to_keep=1, **{self._cache_kw: cache}
        )
        kv = [(layer.keys, layer.values) for layer in _out_cache(out).layers]
        return kv, out.logits[0, -1].float()

    @torch.inference_mode()
    def prefill_many(self, prompts: Sequence[Sequence[int]]) -> list[tuple[SeqKV, torch.Tensor]]:
        """Runs several prompts in one left-padded forward; per prompt its unpadded cache and last logits."""
        if len(prompts) == 1:
            return [self.prefill(prompts[0])]
        width = max(len(p) for p in prompts)
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        mask = torch.zeros(len(prompts), width, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[i, width - len(p) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: DynamicCache()},
        )
        layers = _out_cache(out).layers
        results = []
        for i, p in enumerate(prompts):
            start = width - len(p)
            kv = [(layer.keys[i : i + 1, :, start:, :], layer.values[i : i + 1, :, start:, :]) for layer in layers]
            results.append((kv, out.logits[i, -1].float()))
        return results

    @torch.inference_mode()
    def decode(self, batch: KVBatch, tokens: torch.Tensor) -> torch.Tensor:
        """Feeds one token per row ([B] long); grows the batch cache by one column; returns logits [B, V] fp32."""
        out = self.model(
            input_ids=tokens.to(self.device)[:, None],
            attention_mask=batch.step_mask(),
            position_ids=batch.positions(),
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_kw: batch.cache},
        )
        batch.cache = _out_cache(out)
        batch.advance()
        return out.logits[:, -1].float()

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter under its Hugging Face checkpoint name; a tied lm_head appears once (as the
        embedding), as in the checkpoint and the trainer's export."""
        return {name: p.data for name, p in self.model.named_parameters()}


def _check_full_attention(config, model_path: str) -> None:
    layer_types = getattr(config, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        raise ConfigError(
            "engine.model_path",
            model_path,
            f"has layer types {sorted(set(layer_types))}",
            "the transformers engine batches full-attention models only; use the sglang or vllm engine",
        )


def _context_length(config, wanted: int | None) -> int:
    """`wanted` (at most the model's max_position_embeddings), else the model's own limit."""
    limit = int(getattr(config, "max_position_embeddings", 0) or 0)
    if wanted is not None:
        if limit and wanted > limit:
            raise ConfigError(
                "engine.context_length",
                wanted,
                f"exceeds the model's max_position_embeddings {limit}",
                f"use at most {limit} (or leave it unset)",
            )
        limit = wanted
    if limit <= 1:
        raise ConfigError("engine.context_length", limit, "must be > 1", "set engine.context_length")
    return limit


def _eos_ids(config, path: Path) -> frozenset[int]:
    """End-of-sequence ids of the model config and of its generation_config.json, when there is one."""
    eos = _as_list(getattr(config, "eos_token_id", None))
    try:
        eos += _as_list(GenerationConfig.from_pretrained(path).eos_token_id)
    except OSError:
        pass
    return frozenset(eos)
