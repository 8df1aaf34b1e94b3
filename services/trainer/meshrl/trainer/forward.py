"""Response-token log-probs, entropy and values from a GPTModel's output over one MicroBatch.

The output at sequence position len(prompt) + t - 1 scores response token t (see `batching`). Logits are
this rank's vocabulary shard: log-softmax and entropy are computed vocab-parallel (max, sum of exp and the
target logit reduced over the tensor-parallel group), so full-vocabulary logits are never gathered; with
TP = 1 the reductions are identities. Vocabulary padding rows (ids >= vocab_size) are masked out.
Called by `meshrl.trainer.schedule` (inside Megatron's forward/backward schedules).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps
from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

from meshrl.trainer.batching import MicroBatch


def _response_positions(output: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """Selects the outputs [b, L, D] at the positions that score each response token -> [b, R, D]."""
    index = mb.gather_index[..., None].expand(-1, -1, output.shape[-1])
    return output.gather(1, index)


def _tp_max(x: torch.Tensor) -> torch.Tensor:
    if ps.get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=ps.get_tensor_model_parallel_group())
    return x


def logprobs_from_logits(
    logits: torch.Tensor,
    mb: MicroBatch,
    *,
    vocab_size: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-response-token log-probs float32 [b, R] (and entropy [b, R] when asked); padding positions are 0.

    logits: this rank's vocabulary shard [b, L, V_local]. Divided by `temperature` first, matching a rollout
    engine that sampled at that temperature. entropy_grad=False computes the entropy outside autograd.
    """
    x = _response_positions(logits, mb).float()
    if temperature != 1.0:
        x = x / temperature
    local = x.shape[-1]
    start = ps.get_tensor_model_parallel_rank() * local
    pad = (torch.arange(start, start + local, device=x.device) >= vocab_size) if start + local > vocab_size else None
    if pad is not None:
        x = x.masked_fill(pad, float("-inf"))
    peak = _tp_max(x.detach().amax(-1))
    exp = (x - peak[..., None]).exp()
    total = reduce_from_tensor_model_parallel_region(exp.sum(-1))
    lse = total.log() + peak
    ids = mb.response_ids - start
    mine = (ids >= 0) & (ids < local)
    target = torch.where(mine, x.gather(-1, ids.clamp(0, local - 1)[..., None]).squeeze(-1), 0.0)
    logprobs = (reduce_from_tensor_model_parallel_region(target) - lse) * mb.mask
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            finite = x if pad is None else x.masked_fill(pad, 0.0)
            mean_logit = reduce_from_tensor_model_parallel_region((exp * finite).sum(-1)) / total
            entropy = (lse - mean_logit) * mb.mask
    return logprobs, entropy


def values_from_output(values: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """Critic values float32 [b, R] from the value head's output [b, L, 1]; padding positions are 0."""
    return _response_positions(values, mb).float().squeeze(-1) * mb.mask
