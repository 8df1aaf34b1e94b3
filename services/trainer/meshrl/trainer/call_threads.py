"""How many torch CPU threads one trainer call uses: one for small calls, the process's setting otherwise.

On a CPU host shared with the scheduler, the data buffer and the rollout replicas, a call of a few
hundred tokens on a small model spends more waking and synchronising torch's intra-op threads than they
save: one OpenMP thread descheduled by another process stalls the whole parallel region. Measured on a
2-core host (issue 21, the side-by-side harness's 92k-parameter model, GRPO steps through the services):
at 0.9 GFLOP per train call (64 samples) actor_train took 31.6-33.3 ms on one thread against 34.4-37.6 ms
on two, and the 110-step warm-up (0.5 GFLOP a call) 2.3-2.6 s against 2.9-3.1 s; at 1.8 GFLOP (128
samples) they tied (55-58 against 51-63 ms); at 3.7 GFLOP (256 samples) two threads won (94-107 against
112-114 ms). Alone on the host, two threads win at every size (0.7-0.8x).

A call's work is estimated as FLOPs = k x parameters x sequence tokens (k = 2 for a forward pass, 6 for
forward + backward); below `TrainerConfig.single_thread_below_gflop` it runs on one thread. GPUs and
processes already on one thread are left alone. Used by `meshrl.trainer.core`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

FORWARD = 2  # FLOPs per parameter per token
FORWARD_BACKWARD = 6


def call_flop(parameters: int, tokens: int, per_token: int) -> float:
    """The estimated FLOPs of one pass over `tokens` sequence tokens of a model with `parameters`."""
    return float(per_token) * parameters * tokens


@contextlib.contextmanager
def threads_for(flop: float, below_gflop: float, device: torch.device) -> Iterator[int]:
    """Runs the block on one torch thread when `flop` is below `below_gflop` GFLOP (0: never) on a CPU;
    yields the thread count used and restores the process's setting after."""
    before = torch.get_num_threads()
    if device.type != "cpu" or below_gflop <= 0 or before == 1 or flop >= below_gflop * 1e9:
        yield before
        return
    torch.set_num_threads(1)
    try:
        yield 1
    finally:
        torch.set_num_threads(before)
