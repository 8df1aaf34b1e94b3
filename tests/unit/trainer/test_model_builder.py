"""The small-model builder writes HF directories that transformers loads, with a working chat template."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from meshrl.common.errors import InvalidArgument
from meshrl.trainer.model_builder import IM_END, IM_START, PAD_TOKEN, build_small_model, build_tokenizer


def _ids(encoded) -> list[int]:
    return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


def test_qwen2_dir_loads_with_transformers(qwen2_dir):
    config = json.loads((qwen2_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["tie_word_embeddings"] is True
    tok = AutoTokenizer.from_pretrained(qwen2_dir)
    model = AutoModelForCausalLM.from_pretrained(qwen2_dir)
    assert model.config.vocab_size == len(tok)
    weights = load_file(qwen2_dir / "model.safetensors")
    assert "lm_head.weight" not in weights
    assert weights["model.layers.0.self_attn.q_proj.bias"].abs().sum() > 0  # biases are not left at zero
    ids = torch.tensor([tok("12+34=46").input_ids])
    logits = model(ids).logits
    assert logits.shape == (1, 8, len(tok))
    assert torch.isfinite(logits).all()


def test_tokenizer_round_trips_and_chat_template(qwen2_dir):
    tok = AutoTokenizer.from_pretrained(qwen2_dir)
    text = "What is 12 * (3 + 4)?\nAnswer: 84"
    ids = tok(text).input_ids
    assert tok.decode(ids) == text
    assert len(ids) == len(text)  # one token per character for this alphabet
    assert tok.eos_token == IM_END and tok.pad_token == PAD_TOKEN
    prompt = _ids(tok.apply_chat_template([{"role": "user", "content": "2+2"}], add_generation_prompt=True))
    assert tok.decode(prompt) == f"{IM_START}user\n2+2{IM_END}\n{IM_START}assistant\n"
    assert prompt[0] == tok.convert_tokens_to_ids(IM_START)
    assert tok.convert_tokens_to_ids("user") in prompt  # whole-word role token


def test_llama_dir_is_untied_with_its_theta(llama_dir):
    config = json.loads((llama_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    theta = config.get("rope_theta", config.get("rope_parameters", {}).get("rope_theta"))
    assert theta == 500000.0
    weights = load_file(llama_dir / "model.safetensors")
    assert "lm_head.weight" in weights
    assert not any(name.endswith(".bias") for name in weights)
    AutoModelForCausalLM.from_pretrained(llama_dir)


def test_same_seed_same_weights(tmp_path):
    a = load_file(build_small_model(tmp_path / "a", hidden_size=16, num_layers=1, seed=7) / "model.safetensors")
    b = load_file(build_small_model(tmp_path / "b", hidden_size=16, num_layers=1, seed=7) / "model.safetensors")
    c = load_file(build_small_model(tmp_path / "c", hidden_size=16, num_layers=1, seed=8) / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_bad_arguments_are_refused(tmp_path):
    with pytest.raises(InvalidArgument, match="arch 'gpt2'"):
        build_small_model(tmp_path, arch="gpt2")
    with pytest.raises(InvalidArgument, match="divisible by num_kv_heads"):
        build_small_model(tmp_path, num_heads=4, num_kv_heads=3)
    with pytest.raises(InvalidArgument, match="tokenizer word"):
        build_tokenizer(["two words"])


def test_cli_writes_a_directory(tmp_path):
    out = tmp_path / "cli"
    result = subprocess.run(
        [sys.executable, "-m", "meshrl.trainer.model_builder", str(out), "--arch", "llama", "--hidden-size", "16"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((out / "config.json").read_text())["hidden_size"] == 16
    assert (out / "tokenizer.json").exists() and (out / "generation_config.json").exists()
