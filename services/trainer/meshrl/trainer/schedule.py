"""Runs micro-batches through Megatron's forward/backward schedules (`get_forward_backward_func`).

PP = 1: Megatron's no-pipelining schedule; PP > 1: 1F1B with shapes sent before each activation (micro-batches
differ in shape). Every rank holds the same list of micro-batches (each reads the whole batch); `head` turns
the model's output on the last stage into (loss, extras): the loss is backpropagated as is (already normalised
by the global token count), the extras are returned per micro-batch, in order, on the last stage only.
Called by `meshrl.trainer.core` (log-probs, values) and `meshrl.trainer.training` (train steps).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from megatron.core.pipeline_parallel import get_forward_backward_func

from meshrl.trainer import megatron_compat
from meshrl.trainer.batching import MicroBatch

Head = Callable[[torch.Tensor, MicroBatch], tuple[torch.Tensor, Any]]


def run_microbatches(
    model: torch.nn.Module, micro_batches: Sequence[MicroBatch], head: Head, *, forward_only: bool
) -> list[Any]:
    """Forward (and, unless forward_only, backward) of every micro-batch; returns head's extras (last stage)."""
    if not micro_batches:
        return []
    extras: list[Any] = []
    one = torch.tensor(1, dtype=torch.int)

    def forward_step(data_iterator, chunk):
        mb = next(data_iterator)
        with megatron_compat.own_code():
            output = chunk(mb.input_ids, mb.position_ids, None)

        def loss_func(out: torch.Tensor):
            with megatron_compat.own_code():
                loss, extra = head(out, mb)
            extras.append(extra)
            return loss, one, {}

        return output, loss_func

    first = micro_batches[0]
    with megatron_compat.cpu_devices():
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micro_batches),
            model=[model],
            num_microbatches=len(micro_batches),
            seq_length=first.input_ids.shape[1],
            micro_batch_size=first.input_ids.shape[0],
            forward_only=forward_only,
        )
    return extras
