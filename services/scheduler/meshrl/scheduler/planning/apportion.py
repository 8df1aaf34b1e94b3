"""The cluster's workers and how they are divided: apportioning worker counts to groups (even or
proportional to size) and picking each group's workers so that it spans as few machines as possible.

Called by the planner. A worker is one device (a GPU, or a CPU slot on machines without GPUs); worker
`index` counts machine by machine, device by device, which is also the order of placement-group bundles
sorted by node address and device id (see `placement.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from meshrl.common.errors import InvalidArgument


class PlanError(InvalidArgument):
    """The workflow cannot be planned on this cluster; the message says what to change."""


@dataclass(frozen=True, order=True)
class WorkerSlot:
    """One worker: `index` in cluster order, on machine `node`, device `device` of that machine."""

    index: int
    node: int
    device: int

    def __str__(self) -> str:
        return f"n{self.node}:{self.device}"


@dataclass(frozen=True)
class ClusterSpec:
    """`nodes` machines with `workers_per_node` devices each; `device` is "GPU" or "CPU"."""

    nodes: int
    workers_per_node: int
    device: str = "GPU"

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise PlanError(f"a cluster needs at least one node, got nodes={self.nodes}. Fix: pass --nodes 1 or more")
        if self.workers_per_node < 1:
            raise PlanError(
                f"a node needs at least one worker, got {self.workers_per_node}. "
                "Fix: pass --gpus-per-node (or --cpus-per-node on machines without GPUs) of 1 or more"
            )
        if self.device not in ("GPU", "CPU"):
            raise PlanError(f"device must be GPU or CPU, got {self.device!r}. Fix: use GPU or CPU")

    @property
    def num_workers(self) -> int:
        return self.nodes * self.workers_per_node

    def slot(self, index: int) -> WorkerSlot:
        return WorkerSlot(index, index // self.workers_per_node, index % self.workers_per_node)

    def slots(self) -> tuple[WorkerSlot, ...]:
        return tuple(self.slot(i) for i in range(self.num_workers))


def apportion(
    weights: Mapping[str, float], units: Mapping[str, int], total: int, sizes: Mapping[str, float] | None = None
) -> dict[str, int]:
    """Divides `total` workers among groups in proportion to `weights` (equal weights: an even split).

    Every group gets a positive multiple of its `units[g]` (devices per model replica). Largest-remainder
    rounding: each group first gets its quota rounded down (at least one unit), then the groups furthest
    below their quota get one more unit until the workers run out; ties go to the larger group (`sizes`,
    default `weights`), then to the earlier one in `weights`' order. Workers that fit no group's unit stay idle (the caller reports them).
    """
    groups = list(weights)
    need = sum(units[g] for g in groups)
    if need > total:
        detail = ", ".join(f"{g} {units[g]}" for g in groups)
        raise PlanError(
            f"{len(groups)} worker groups need at least {need} workers ({detail}) but the cluster has {total}. "
            "Fix: add nodes or devices per node, lower tensor_parallel_size, or use --placement colocated"
        )
    weight_sum = sum(max(0.0, w) for w in weights.values())
    share = {g: (max(0.0, weights[g]) / weight_sum if weight_sum > 0 else 1 / len(groups)) for g in groups}
    quota = {g: total * share[g] for g in groups}
    count = {g: max(units[g], math.floor(quota[g] / units[g]) * units[g]) for g in groups}
    position = {g: i for i, g in enumerate(groups)}
    size = sizes if sizes is not None else weights
    while sum(count.values()) > total:  # minimum units pushed us over: take from the most over-served
        shrinkable = [g for g in groups if count[g] > units[g]]
        g = max(shrinkable, key=lambda g: (round(count[g] - quota[g], 9), -size[g], position[g]))
        count[g] -= units[g]
    while True:
        free = total - sum(count.values())
        growable = [g for g in groups if units[g] <= free]
        if not growable:
            return count
        g = max(growable, key=lambda g: (round(quota[g] - count[g], 9), size[g], -position[g]))
        count[g] += units[g]


def assign_workers(
    counts: Mapping[str, int], units: Mapping[str, int], cluster: ClusterSpec, order: Sequence[str]
) -> dict[str, tuple[WorkerSlot, ...]]:
    """Picks each group's workers, groups taken in `order` (largest first), with node cohesion.

    A group that fits on one machine goes to the machine with the fewest free devices that still holds it
    (best fit, keeping whole machines free for larger groups); a larger group takes the machines with the
    most free devices first, whole replicas (`units`) per machine where possible. Devices are taken in
    ascending id; a group's workers are returned in (node, device) order, which is its rank order.
    """
    per_node = cluster.workers_per_node
    free = {n: list(range(per_node)) for n in range(cluster.nodes)}
    out: dict[str, tuple[WorkerSlot, ...]] = {}
    for group in order:
        need, unit, taken = counts[group], units[group], []
        while need > 0:
            fits = [n for n in free if len(free[n]) >= need]
            if fits:
                node = min(fits, key=lambda n: (len(free[n]), n))
                take = need
            else:
                node = max(free, key=lambda n: (len(free[n]), -n))
                available = len(free[node])
                if available == 0:
                    raise PlanError(
                        f"no free worker left for group '{group}' (counts {dict(counts)} exceed the cluster)"
                    )
                take = min(need, (available // unit) * unit or available)
            devices, free[node] = free[node][:take], free[node][take:]
            taken.extend(WorkerSlot(node * per_node + d, node, d) for d in devices)
            need -= take
        out[group] = tuple(sorted(taken))
    return out
