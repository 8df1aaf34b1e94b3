"""The vLLM adapter's pieces that need no engine: which HF tensors vLLM loads as one module (an in-place
reload must carry whole modules), holding split modules across buckets, the shape check before any weight
changes, and reading which vLLM build an interpreter holds."""

from __future__ import annotations

import sys

import pytest

from meshrl.common.errors import FailedPrecondition
from meshrl.rollout.vllm_groups import PendingModules, module_of, modules_of
from meshrl.rollout.vllm_install import check_cpu_head_size, installed_build, version_tuple
from meshrl.rollout.vllm_worker import WeightsRefused, check_shapes

L = "model.layers.0."
NAMES = [
    L + "self_attn.q_proj.weight",
    L + "self_attn.q_proj.bias",
    L + "self_attn.k_proj.weight",
    L + "self_attn.k_proj.bias",
    L + "self_attn.v_proj.weight",
    L + "self_attn.v_proj.bias",
    L + "mlp.gate_proj.weight",
    L + "mlp.up_proj.weight",
    L + "mlp.down_proj.weight",
    "model.norm.weight",
]


def test_fused_projections_belong_to_one_module():
    assert module_of(L + "self_attn.k_proj.bias") == L + "self_attn.qkv_proj"
    assert module_of(L + "mlp.up_proj.weight") == L + "mlp.gate_up_proj"
    assert module_of(L + "mlp.down_proj.weight") == L + "mlp.down_proj"
    assert len(modules_of(NAMES)[L + "self_attn.qkv_proj"]) == 6


def test_a_module_is_released_only_when_whole():
    pending = PendingModules(modules_of(NAMES))
    first = pending.add([(n, i) for i, n in enumerate(NAMES[:3])])  # q (weight, bias) and k's weight
    assert first == []
    assert pending.incomplete() == {L + "self_attn.qkv_proj": sorted(NAMES[3:6])}
    second = pending.add([(n, i) for i, n in enumerate(NAMES[3:8], 3)])
    assert [n for n, _ in second] == NAMES[:8]  # qkv made whole, then gate/up (both parts in this bucket)
    assert pending.incomplete() == {}
    assert pending.add([(NAMES[9], 9)]) == [(NAMES[9], 9)]


def test_a_tensor_the_model_lacks_is_refused():
    with pytest.raises(KeyError, match="no tensor named"):
        PendingModules(modules_of(NAMES)).add([("model.layers.7.mlp.up_proj.weight", 0)])
    with pytest.raises(WeightsRefused, match=r"shape \[3\], the served model's is \[64\]"):
        check_shapes({"model.norm.weight": (64,)}, {"model.norm.weight": (3,)})
    with pytest.raises(WeightsRefused, match="no tensors named"):
        check_shapes({"model.norm.weight": (64,)}, {"lm_head.weight": (3, 64)})


def test_versions_compare_by_number():
    assert version_tuple("0.32.0+cpu") == (0, 32, 0) > version_tuple("0.11.2.post2")
    assert version_tuple("0.34.0rc1") >= (0, 32)


def test_an_interpreter_without_vllm_is_refused_with_the_fix():
    with pytest.raises(FailedPrecondition, match="make vllm-env"):
        installed_build(sys.executable)  # the test environment holds no vLLM
    with pytest.raises(FailedPrecondition, match="cannot run"):
        installed_build("/nonexistent/python")


def test_a_head_size_the_cpu_build_cannot_run_is_refused_before_start(model_dir):
    with pytest.raises(FailedPrecondition, match="heads of size 8"):  # hidden 32 over 4 heads
        check_cpu_head_size(str(model_dir))
