"""Writes small, randomly initialised Hugging Face model directories with a real tokenizer.

No weights can be downloaded here, so tests, benchmarks and the embedded default job build
their models with `build_small_model`. The directory holds config.json, model.safetensors,
generation_config.json and a `tokenizers`-backed tokenizer (byte-level BPE: every digit, letter,
arithmetic symbol, space and newline is one token, plus a few whole-word tokens) with ChatML
special tokens and a Jinja chat template, so `AutoModelForCausalLM` / `AutoTokenizer.from_pretrained` load it.

CLI: `python -m meshrl.trainer.model_builder OUT_DIR [--arch qwen2|llama] [--hidden-size 64] ...`
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    Qwen2Config,
    Qwen2Tokenizer,
)

from meshrl.common.errors import InvalidArgument

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

# Whole-word tokens merged by default: the chat roles, so a templated prompt stays short.
DEFAULT_WORDS: tuple[str, ...] = ("system", "user", "assistant")

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

SUPPORTED_ARCHS = ("qwen2", "llama")


def _byte_to_unicode() -> dict[int, str]:
    """The byte-level alphabet: printable bytes map to themselves, the others to code points from 256 upwards."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_tokenizer(words: Iterable[str] | None = None) -> Qwen2Tokenizer:
    """A byte-level BPE tokenizer in Qwen2's pipeline shape: every byte is a token, so any text encodes.

    Ids 0..255 are the bytes (so digits, letters, symbols, space and newline are single tokens); each entry
    of `words` (default DEFAULT_WORDS) becomes one token through a chain of merges; the special tokens
    `<|endoftext|>` (pad), `<|im_start|>`, `<|im_end|>` (eos) come last. Saved with
    tokenizer_class "Qwen2Tokenizer", so AutoTokenizer rebuilds the same pipeline for every architecture.
    """
    byte_map = _byte_to_unicode()
    vocab: dict[str, int] = {byte_map[b]: b for b in range(256)}
    merges: list[tuple[str, str]] = []
    for word in DEFAULT_WORDS if words is None else words:
        if not isinstance(word, str) or not word or any(ch.isspace() or not ch.isalpha() for ch in word):
            raise InvalidArgument(
                f"tokenizer word {word!r} must be a non-empty string of letters (no spaces or digits)"
            )
        symbols = [byte_map[b] for b in word.encode("utf-8")]
        merged = symbols[0]
        for sym in symbols[1:]:
            if merged + sym not in vocab:
                merges.append((merged, sym))
                vocab[merged + sym] = len(vocab)
            merged = merged + sym
    for special in SPECIAL_TOKENS:
        vocab[special] = len(vocab)
    tok = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        unk_token=None,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START, IM_END],
        model_max_length=1 << 20,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _hf_config(
    arch: str,
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    tie_word_embeddings: bool,
    rope_theta: float,
    rms_norm_eps: float,
    pad_id: int,
    eos_ids: list[int],
):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=rms_norm_eps,
        tie_word_embeddings=tie_word_embeddings,
        rope_theta=rope_theta,
        hidden_act="silu",
        pad_token_id=pad_id,
        eos_token_id=eos_ids[0],
        bos_token_id=None,
        attention_dropout=0.0,
    )
    if arch == "qwen2":
        return Qwen2Config(use_sliding_window=False, **common)
    return LlamaConfig(attention_bias=False, mlp_bias=False, head_dim=hidden_size // num_heads, **common)


def _perturb_constants(model: torch.nn.Module, generator: torch.Generator) -> None:
    """HF initialises norms to 1 and biases to 0; perturb them so conversions that drop or swap them are caught."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.add_(0.1 * torch.randn(param.shape, generator=generator))
            elif name.endswith(".bias"):
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))


def build_small_model(
    out_dir: str | Path,
    *,
    arch: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool | None = None,
    rope_theta: float = 10000.0,
    rms_norm_eps: float = 1e-6,
    initializer_range: float = 0.05,
    seed: int = 0,
    vocab: Iterable[str] | None = None,
) -> Path:
    """Writes a fresh HF model directory (config.json, model.safetensors, generation_config.json, tokenizer).

    arch: "qwen2" (qkv bias, tied embeddings by default) or "llama" (no biases, untied by default).
    intermediate_size defaults to 2 * hidden_size (rounded up to a multiple of 8). vocab: extra whole-word
    tokens of the tokenizer (default DEFAULT_WORDS); the model's vocab_size equals len(tokenizer). fp32 weights.
    Returns the directory path. Same arguments and seed give bit-identical weights. (Long by its keyword list
    and this docstring: the body is one straight build, config -> weights -> tokenizer -> files.)
    """
    if arch not in SUPPORTED_ARCHS:
        raise InvalidArgument(f"arch {arch!r} is not supported by the model builder; use one of {SUPPORTED_ARCHS}")
    if hidden_size <= 0 or num_layers <= 0 or num_heads <= 0 or num_kv_heads <= 0:
        raise InvalidArgument("hidden_size, num_layers, num_heads and num_kv_heads must all be positive")
    if hidden_size % num_heads:
        raise InvalidArgument(f"hidden_size {hidden_size} must be divisible by num_heads {num_heads}")
    if num_heads % num_kv_heads:
        raise InvalidArgument(f"num_heads {num_heads} must be divisible by num_kv_heads {num_kv_heads} (GQA groups)")
    if intermediate_size is None:
        intermediate_size = ((2 * hidden_size + 7) // 8) * 8
    if tie_word_embeddings is None:
        tie_word_embeddings = arch == "qwen2"

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    eos_ids = [tokenizer.convert_tokens_to_ids(IM_END), pad_id]
    config = _hf_config(
        arch,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        rope_theta=rope_theta,
        rms_norm_eps=rms_norm_eps,
        pad_id=pad_id,
        eos_ids=eos_ids,
    )
    config.initializer_range = initializer_range
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed + 1)
    _perturb_constants(model, generator)
    model.generation_config = GenerationConfig(
        eos_token_id=eos_ids, pad_token_id=pad_id, bos_token_id=None, do_sample=True, temperature=1.0
    )
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def _main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m meshrl.trainer.model_builder", description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--arch", choices=SUPPORTED_ARCHS, default="qwen2")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--num-kv-heads", type=int, default=2)
    parser.add_argument("--intermediate-size", type=int, default=None)
    parser.add_argument("--max-position-embeddings", type=int, default=512)
    parser.add_argument("--tie-word-embeddings", choices=("true", "false"), default=None)
    parser.add_argument("--rope-theta", type=float, default=10000.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    tie = None if args.tie_word_embeddings is None else args.tie_word_embeddings == "true"
    path = build_small_model(
        args.out_dir,
        arch=args.arch,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_kv_heads=args.num_kv_heads,
        intermediate_size=args.intermediate_size,
        max_position_embeddings=args.max_position_embeddings,
        tie_word_embeddings=tie,
        rope_theta=args.rope_theta,
        seed=args.seed,
    )
    print(path)


if __name__ == "__main__":
    _main()
