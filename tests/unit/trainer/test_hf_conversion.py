"""HF config -> megatron-core model, weight import/export, buckets and checksums."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from meshrl.common.errors import InvalidArgument, NotFound
from meshrl.common.weights import sample_names, tensor_checksums
from meshrl.trainer.export import iter_hf_buckets, weight_checksums
from meshrl.trainer.hf_config import read_hf_config, spec_from_config
from meshrl.trainer.hf_weights import iter_hf_tensors, load_hf_weights, read_hf_tensors
from meshrl.trainer.model import build_gpt_model, ensure_parallel_state


@pytest.fixture(scope="module", autouse=True)
def _parallel_state():
    ensure_parallel_state()


def _megatron(model_dir, value_head=False):
    spec = read_hf_config(model_dir)
    model = build_gpt_model(spec, value_head=value_head)
    load_hf_weights(model, model_dir, spec, value_head=value_head)
    return spec, model.eval()


@pytest.mark.parametrize("which", ["qwen2_dir", "llama_dir"])
def test_logprobs_match_transformers(which, request):
    model_dir = request.getfixturevalue(which)
    spec, model = _megatron(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.randint(0, spec.vocab_size, (3, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = torch.log_softmax(model(ids, None, None).float(), -1)
        theirs = torch.log_softmax(hf(ids).logits.float(), -1)
    labels = ids[:, 1:]
    ours_tok = ours[:, :-1].gather(-1, labels[..., None])
    theirs_tok = theirs[:, :-1].gather(-1, labels[..., None])
    assert (ours_tok - theirs_tok).abs().max().item() <= 1e-4
    assert (ours - theirs).abs().max().item() <= 1e-4
    assert ours.std() > 0.1  # not a degenerate near-uniform model


@pytest.mark.parametrize("which", ["qwen2_dir", "llama_dir"])
def test_import_export_is_bit_exact(which, request):
    model_dir = request.getfixturevalue(which)
    spec, model = _megatron(model_dir)
    original = read_hf_tensors(model_dir)
    exported = dict(iter_hf_tensors(model, spec))
    assert set(exported) == set(original)
    for name, tensor in exported.items():
        assert tensor.dtype == original[name].dtype and torch.equal(tensor, original[name]), name


def test_rope_theta_from_both_layouts():
    base = {"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "num_attention_heads": 4}
    base |= {"num_hidden_layers": 1, "vocab_size": 10, "intermediate_size": 64}
    assert spec_from_config(base | {"rope_theta": 1234.0}).rope_theta == 1234.0
    v5 = base | {"rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}
    assert spec_from_config(v5).rope_theta == 5e5
    scaled = base | {"rope_theta": 5e5, "rope_scaling": {"rope_type": "llama3", "factor": 32.0}}
    assert spec_from_config(scaled).rope_scaling_factor == 32.0
    with pytest.raises(InvalidArgument, match="RoPE type 'yarn'"):
        spec_from_config(base | {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(InvalidArgument, match="lacks the field 'vocab_size'"):
        spec_from_config({k: v for k, v in base.items() if k != "vocab_size"})


def test_unknown_architecture_is_refused(tmp_path, qwen2_dir):
    shutil.copytree(qwen2_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidArgument, match="'GPT2LMHeadModel'.*not supported"):
        read_hf_config(tmp_path / "m")
    with pytest.raises(NotFound, match="no config.json"):
        read_hf_config(tmp_path)


def test_missing_and_misshaped_tensors_are_named(tmp_path, qwen2_dir):
    spec = read_hf_config(qwen2_dir)
    model = build_gpt_model(spec)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    tensors = read_hf_tensors(qwen2_dir)
    shutil.copy(qwen2_dir / "config.json", tmp_path / "config.json")

    missing = {k: v for k, v in tensors.items() if k != "model.layers.1.mlp.up_proj.weight"}
    save_file(missing, tmp_path / "model.safetensors")
    with pytest.raises(InvalidArgument, match="'model.layers.1.mlp.up_proj.weight'"):
        load_hf_weights(model, tmp_path, spec)

    bad = dict(tensors)
    bad["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(8, spec.hidden_size)
    save_file(bad, tmp_path / "model.safetensors")
    with pytest.raises(InvalidArgument, match=r"'model.layers.0.self_attn.k_proj.weight' has shape \(8, 32\)"):
        load_hf_weights(model, tmp_path, spec)

    extra = dict(tensors) | {"model.layers.0.self_attn.q_norm.weight": torch.ones(8)}
    save_file(extra, tmp_path / "model.safetensors")
    with pytest.raises(InvalidArgument, match="unexpected tensor 'model.layers.0.self_attn.q_norm.weight'"):
        load_hf_weights(model, tmp_path, spec)
    for name, param in model.named_parameters():  # refused loads leave the model untouched
        assert torch.equal(param, before[name]), name


def test_critic_keeps_body_and_gets_value_head(qwen2_dir):
    spec, critic = _megatron(qwen2_dir, value_head=True)
    ids = torch.randint(0, spec.vocab_size, (2, 5))
    with torch.no_grad():
        assert critic(ids, None, None).shape == (2, 5, 1)
    names = [n for n, _ in iter_hf_tensors(critic, spec, value_head=True)]
    assert names[-1] == "score.weight" and "lm_head.weight" not in names
    tensors = read_hf_tensors(qwen2_dir)
    exported = dict(iter_hf_tensors(critic, spec, value_head=True))
    assert torch.equal(
        exported["model.layers.1.self_attn.q_proj.bias"], tensors["model.layers.1.self_attn.q_proj.bias"]
    )


def test_buckets_respect_the_size_bound(llama_dir):
    spec, model = _megatron(llama_dir)
    total = sum(t.numel() * t.element_size() for _, t in iter_hf_tensors(model, spec))
    bound = 40_000
    buckets = list(iter_hf_buckets(model, spec, bound))
    assert len(buckets) > 1
    flat = [name for bucket in buckets for name, _ in bucket]
    assert flat == [name for name, _ in iter_hf_tensors(model, spec)]
    for bucket in buckets:
        size = sum(t.numel() * t.element_size() for _, t in bucket)
        assert size <= bound or len(bucket) == 1
    assert sum(t.numel() * t.element_size() for b in buckets for _, t in b) == total
    with pytest.raises(InvalidArgument):
        next(iter_hf_buckets(model, spec, 0))


def test_checksums_sample_and_detect_changes(llama_dir):
    spec, model = _megatron(llama_dir)
    names = [n for n, _ in iter_hf_tensors(model, spec)]
    first = weight_checksums(model, spec)
    assert set(first) == set(sample_names(names)) and len(first) == 8  # the weight plane's fixed sample
    assert weight_checksums(model, spec) == first
    # the same hash a rollout replica computes over its HF tensors
    exported = {n: t.clone() for n, t in iter_hf_tensors(model, spec)}  # copies: the export shares storage
    assert first == tensor_checksums(exported, names=list(first))
    with torch.no_grad():
        model.decoder.final_layernorm.weight.add_(1e-3)
    second = weight_checksums(model, spec, ["model.norm.weight", "model.embed_tokens.weight"])
    assert (
        second["model.embed_tokens.weight"]
        == tensor_checksums(exported, ["model.embed_tokens.weight"])["model.embed_tokens.weight"]
    )
    assert second["model.norm.weight"] != tensor_checksums(exported, ["model.norm.weight"])["model.norm.weight"]
    with pytest.raises(NotFound, match="'nope'"):
        weight_checksums(model, spec, ["nope"])
