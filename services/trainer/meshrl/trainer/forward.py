"""Forward passes of a megatron-core GPTModel over one MicroBatch: response-token log-probs, entropy, values.

The output at sequence position len(prompt) + t - 1 scores response token t (see `batching`).
Called by `meshrl.trainer.core` for log-prob / value inference and inside train steps.
"""

from __future__ import annotations

import torch

from meshrl.trainer.batching import MicroBatch


def _response_positions(output: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """Selects the outputs [b, L, D] at the positions that score each response token -> [b, R, D]."""
    index = mb.gather_index[..., None].expand(-1, -1, output.shape[-1])
    return output.gather(1, index)


def forward_logprobs(
    model: torch.nn.Module,
    mb: MicroBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-response-token log-probs float32 [b, R] (and entropy [b, R] when asked); padding positions are 0.

    Logits are divided by `temperature` first, matching a rollout engine that sampled at that temperature.
    entropy_grad=False computes the entropy outside autograd (for metrics only, saving memory).
    """
    logits = model(mb.input_ids, mb.position_ids, None)
    selected = _response_positions(logits, mb).float()
    if temperature != 1.0:
        selected = selected / temperature
    logp_all = torch.log_softmax(selected, dim=-1)
    logprobs = logp_all.gather(-1, mb.response_ids[..., None]).squeeze(-1) * mb.mask
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = -(logp_all.exp() * logp_all).sum(-1) * mb.mask
    return logprobs, entropy


def forward_values(model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
    """Critic values float32 [b, R]: V of the state before each response token; padding positions are 0."""
    values = model(mb.input_ids, mb.position_ids, None)  # [b, L, 1]
    return _response_positions(values, mb).float().squeeze(-1) * mb.mask
