"""Every CPU shim that lets megatron-core 0.16 run on a host without CUDA, in one place.

1. `SDPAttention`: a core attention that calls torch's scaled_dot_product_attention instead of
   `DotProductAttention`, whose buffer comes from a CUDA-allocated global memory pool.
2. `CPURotaryEmbedding`: `RotaryEmbedding.get_emb` moves `inv_freq` to the current CUDA device;
   this subclass keeps it where it is.
3. `checkpoint_layers`: megatron-core's activation recompute saves CUDA RNG states; on the CPU,
   each TransformerLayer's forward is wrapped in torch.utils.checkpoint instead.
4. `seed_ranks`: on CUDA, `model_parallel_cuda_manual_seed` (Megatron's attention needs its RNG tracker);
   on the CPU, `torch.manual_seed` on every rank.
5. `cpu_devices`: megatron's schedules, p2p, DDP grad buffers and optimizer wrappers allocate on
   `device="cuda"` / `torch.cuda.current_device()` and call `torch.cuda.synchronize()`; inside this scope
   such tensors are made on the CPU and synchronize is a no-op. `own_code` lifts it again around our
   own code inside that scope (the model's forward, the loss head), which pays for it on every op.
6. `adjust_config`: `batch_p2p_sync` (a CUDA synchronize) off.
All apply only when CUDA is absent (`cuda_available()` False); with CUDA, megatron-core's own
modules are used unchanged. Called by `meshrl.trainer.model` (building), `schedule` and `optim`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from megatron.core import tensor_parallel
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.transformer_layer import TransformerLayer
from torch.overrides import TorchFunctionMode


def cuda_available() -> bool:
    return torch.cuda.is_available()


class SDPAttention(DotProductAttention):
    """Causal core attention through F.scaled_dot_product_attention.

    In: query [sq, b, heads, head_dim], key/value [sk, b, kv_heads, head_dim]; an optional Megatron
    boolean mask [b or 1, 1, sq, sk] (True = masked) added to the causal mask. Out: [sq, b, heads * head_dim].
    """

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type=None,
        attention_bias=None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("SDPAttention supports neither packed sequences nor attention bias")
        groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        if groups > 1:
            key = key.repeat_interleave(groups, dim=2)
            value = value.repeat_interleave(groups, dim=2)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, h, s, d]
        dropout = self.config.attention_dropout if self.training else 0.0
        if attention_mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, scale=self.softmax_scale)
        else:
            sq, sk = q.shape[2], k.shape[2]
            causal = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril()
            allowed = causal & ~attention_mask.bool()
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, dropout_p=dropout, scale=self.softmax_scale
            )
        b, h, s, d = out.shape
        return out.permute(2, 0, 1, 3).reshape(s, b, h * d)


class CPURotaryEmbedding(RotaryEmbedding):
    """RotaryEmbedding whose get_emb leaves `inv_freq` on its current device (the CPU)."""

    def get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        if not self.rotary_interleaved:
            emb = torch.cat((freqs, freqs), dim=-1)
        else:
            emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
        return emb[:, None, None, :]  # [s, 1, 1, dim]


def patch_layer_spec(spec) -> None:
    """Shim 1: swap the local spec's core attention for SDPAttention (no-op with CUDA)."""
    if cuda_available():
        return
    spec.submodules.self_attention.submodules.core_attention = SDPAttention


def patch_model(model: torch.nn.Module) -> None:
    """Shim 2: re-class every RotaryEmbedding in `model` as CPURotaryEmbedding (no-op with CUDA)."""
    if cuda_available():
        return
    for module in model.modules():
        if type(module) is RotaryEmbedding:
            module.__class__ = CPURotaryEmbedding


def checkpoint_layers(model: torch.nn.Module) -> None:
    """Shim 3: recompute each TransformerLayer's activations in backward (torch.utils.checkpoint) on the CPU."""
    if cuda_available():
        return
    for module in model.modules():
        if isinstance(module, TransformerLayer):
            inner = module.forward

            @functools.wraps(inner)
            def forward(*args, _inner=inner, **kwargs):
                if not torch.is_grad_enabled():
                    return _inner(*args, **kwargs)
                return torch.utils.checkpoint.checkpoint(_inner, *args, use_reentrant=False, **kwargs)

            module.forward = forward


def seed_ranks(seed: int) -> None:
    """Shim 4: seeds this rank (CUDA: Megatron's model-parallel RNG tracker too, which its attention needs)."""
    torch.manual_seed(seed)
    if cuda_available():
        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, int) and not isinstance(device, bool)


class _CudaToCpu(TorchFunctionMode):
    """Rewrites `device=cuda...` (or a device index) keyword arguments of torch calls to the CPU, and answers
    `tensor.type()` with the CUDA type name (the optimizer's grad clipping asserts 'torch.cuda.FloatTensor');
    `tensor.cuda()` returns the tensor itself."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:  # e.g. the tied-embedding all-reduce across pipeline stages at build time
            return args[0]
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs = {**kwargs, "device": "cpu"}
        out = func(*args, **kwargs)
        if (
            func is torch.Tensor.type
            and len(args) == 1
            and not kwargs
            and out.startswith("torch.")
            and ".cuda." not in out
        ):
            return "torch.cuda." + out[len("torch.") :]
        return out


@contextlib.contextmanager
def cpu_devices() -> Iterator[None]:
    """Shim 5: within this scope megatron's CUDA allocations land on the CPU (no-op with CUDA)."""
    if cuda_available():
        yield
        return
    saved = torch.cuda.current_device, torch.cuda.synchronize
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    try:
        with _CudaToCpu():
            yield
    finally:
        torch.cuda.current_device, torch.cuda.synchronize = saved


@contextlib.contextmanager
def own_code() -> Iterator[None]:
    """Suspends shim 5's mode inside `cpu_devices` for code that allocates nothing on CUDA by name (the model's
    forward, a loss head): the mode costs a Python call per torch op, 1.3-1.7 ms of a 20 ms train step of a
    92k-parameter model on one CPU thread (bench/vs_trl's warm-up, 3 alternations). No-op with CUDA."""
    pop = getattr(torch.overrides, "_pop_mode_temporarily", None)
    current = getattr(torch.overrides, "_get_current_function_mode", lambda: None)
    if pop is None or not isinstance(current(), _CudaToCpu):
        yield
        return
    with pop():
        yield


def adjust_config(config) -> None:
    """Shim 6: a TransformerConfig that does not synchronise CUDA around pipeline p2p (no-op with CUDA)."""
    if not cuda_available():
        config.batch_p2p_sync = False
