"""Ray placement groups for a job's workers (slime's layout): one bundle per worker, bundles ordered by node
address then device id, and actors pinned to a bundle.

Called by whoever launches services on Ray (the launcher). Worker w of a plan (`planner.py`, machine by
machine, device by device) is bundle `WorkerBundles.locations[w]`. Each bundle's node and GPU ids are
learned by a short-lived probe actor placed in it (placement-group tables give the node, not the GPU).
"""

from __future__ import annotations

import enum
import ipaddress
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from meshrl.common.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from meshrl.scheduler.planning.apportion import ClusterSpec


class BundleStrategy(str, enum.Enum):
    PACK = "PACK"  # as few nodes as possible (best effort)
    SPREAD = "SPREAD"  # across distinct nodes (best effort)
    STRICT_PACK = "STRICT_PACK"  # all on one node, or not at all

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class BundleLocation:
    """Where bundle `bundle_index` landed: the node (id and IP) and the GPU ids Ray gave it."""

    bundle_index: int
    node_id: str
    node_ip: str
    gpu_ids: tuple[int, ...]

    def sort_key(self) -> tuple[Any, ...]:
        try:
            ip: Any = (0, ipaddress.ip_address(self.node_ip))
        except ValueError:
            ip = (1, self.node_ip)
        return (ip, self.node_id, self.gpu_ids, self.bundle_index)


@dataclass(frozen=True)
class WorkerBundles:
    """A ready placement group; `locations[w]` is the bundle of worker w (sorted by node address, device)."""

    placement_group: PlacementGroup
    bundle: Mapping[str, float]
    strategy: BundleStrategy
    locations: tuple[BundleLocation, ...]

    def __len__(self) -> int:
        return len(self.locations)

    def scheduling_strategy(self, worker: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(
            placement_group=self.placement_group,
            placement_group_bundle_index=self.locations[worker].bundle_index,
        )

    def node_ids(self) -> tuple[str, ...]:
        """Distinct nodes in worker order."""
        return tuple(dict.fromkeys(loc.node_id for loc in self.locations))

    def check_layout(self, cluster: ClusterSpec) -> None:
        """Raises FailedPrecondition unless the bundles sit `cluster.workers_per_node` per node, as the plan
        assumed (PACK is best effort: on a busy cluster bundles can land elsewhere)."""
        if len(self.locations) != cluster.num_workers:
            raise FailedPrecondition(
                f"the plan has {cluster.num_workers} workers but the placement group has {len(self.locations)} "
                "bundles. Fix: create one bundle per planned worker"
            )
        for node in range(cluster.nodes):
            chunk = self.locations[node * cluster.workers_per_node : (node + 1) * cluster.workers_per_node]
            if len({loc.node_id for loc in chunk}) != 1:
                raise FailedPrecondition(
                    f"planned node {node} maps to bundles on {len({loc.node_id for loc in chunk})} Ray nodes; the "
                    "placement group did not land node by node. Fix: free the cluster's devices, or use STRICT_PACK "
                    "per node, or plan with the cluster Ray actually has"
                )

    def release(self) -> None:
        """Removes the placement group; the actors placed in it are killed."""
        remove_placement_group(self.placement_group)


@ray.remote(num_cpus=0)
class _BundleProbe:
    def where(self) -> tuple[str, str, list[int]]:
        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), ray.util.get_node_ip_address(), [int(g) for g in ray.get_gpu_ids()]


def detect_cluster(device: str = "GPU") -> ClusterSpec:
    """The alive Ray nodes that have `device` ("GPU" or "CPU") as a ClusterSpec: workers per node is the
    smallest whole count any of them has, so a plan made with it fits every node."""
    counts = [int(n["Resources"].get(device, 0)) for n in ray.nodes() if n.get("Alive")]
    counts = [c for c in counts if c > 0]
    if not counts:
        raise FailedPrecondition(
            f"no alive Ray node has a whole {device}. Fix: start nodes with {device}s, or plan with device=CPU"
        )
    return ClusterSpec(len(counts), min(counts), device)


def worker_bundle(
    cpus: float = 1.0, gpus: float = 0.0, resources: Mapping[str, float] | None = None
) -> dict[str, float]:
    """The resources of one worker's bundle, e.g. {"CPU": 1, "GPU": 1}; zero amounts are left out."""
    bundle = {"CPU": float(cpus), "GPU": float(gpus), **{k: float(v) for k, v in (resources or {}).items()}}
    bad = {k: v for k, v in bundle.items() if v < 0}
    if bad:
        raise InvalidArgument(f"bundle resources must not be negative: {bad}. Fix: give amounts >= 0")
    bundle = {k: v for k, v in bundle.items() if v > 0}
    if not bundle:
        raise InvalidArgument("a bundle needs at least one resource. Fix: give cpus, gpus or resources > 0")
    return bundle


def bundle_shares(bundle: Mapping[str, float], members: int) -> tuple[float, float]:
    """(CPUs, GPUs) each of `members` colocated actors claims from one bundle: an equal share of its CPUs, and
    of its GPUs when Ray can split them (a fractional claim must be below one GPU, so a bundle of 2+ GPUs is
    claimed by none: its members then see every GPU of the bundle through CUDA_VISIBLE_DEVICES and take
    turns by the step loop's order, not by Ray's accounting)."""
    if members < 1:
        raise InvalidArgument(f"a shared bundle needs at least one member, got {members}")
    gpus = bundle.get("GPU", 0.0)
    return bundle.get("CPU", 0.0) / members, gpus / members if gpus <= 1 else 0.0


def _probe(pg: PlacementGroup, bundle: Mapping[str, float], count: int, timeout_s: float) -> list[BundleLocation]:
    gpus = bundle.get("GPU", 0.0)
    probes = [
        _BundleProbe.options(
            num_gpus=gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=i),
        ).remote()
        for i in range(count)
    ]
    try:
        found = ray.get([p.where.remote() for p in probes], timeout=timeout_s)
    finally:
        for p in probes:
            ray.kill(p)
    return [BundleLocation(i, node, ip, tuple(sorted(g))) for i, (node, ip, g) in enumerate(found)]


def create_worker_bundles(
    num_workers: int,
    bundle: Mapping[str, float],
    strategy: BundleStrategy | str = BundleStrategy.PACK,
    *,
    name: str = "",
    timeout_s: float = 60.0,
) -> WorkerBundles:
    """Creates a placement group of `num_workers` identical bundles, waits until it is placed and orders its
    bundles by node address then GPU id. Ray must be initialised.

    Raises ResourceExhausted (and removes the group) when it cannot be placed within `timeout_s`.
    """
    if num_workers < 1:
        raise InvalidArgument(f"num_workers must be at least 1, got {num_workers}. Fix: pass a positive count")
    return create_pinned_bundles(
        [{} for _ in range(num_workers)], bundle, strategy, name=name, timeout_s=timeout_s, ordered=True
    )


def create_pinned_bundles(
    pins: Sequence[Mapping[str, float]],
    bundle: Mapping[str, float],
    strategy: BundleStrategy | str = BundleStrategy.PACK,
    *,
    name: str = "",
    timeout_s: float = 60.0,
    ordered: bool = False,
) -> WorkerBundles:
    """A placement group of one `bundle` per entry of `pins`, bundle i also holding `pins[i]` (e.g. a node's
    own resource, `{"node:10.0.0.2": 0.001}`, which pins it to that node; see `cluster_nodes`). Worker i is
    bundle i, unless `ordered` sorts the workers by node address then GPU id. Ray must be initialised.

    Raises ResourceExhausted (and removes the group) when it cannot be placed within `timeout_s`.
    """
    if not pins:
        raise InvalidArgument("a placement group needs at least one bundle. Fix: pass a positive count")
    try:
        strategy = BundleStrategy(str(strategy))
    except ValueError:
        raise InvalidArgument(
            f"unknown placement strategy {strategy!r}. Fix: use one of {', '.join(s.value for s in BundleStrategy)}"
        ) from None
    bundle = dict(bundle)
    asked = [{**bundle, **pin} for pin in pins]
    pg = placement_group(asked, strategy=strategy.value, name=name)
    start = time.monotonic()
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        shown = f"{len(pins)} x {bundle}" + (f" pinned to {[sorted(p) for p in pins]}" if any(pins) else "")
        raise ResourceExhausted(
            f"a placement group of {shown} ({strategy.value}) could not be placed within "
            f"{timeout_s:g}s; the cluster has {_resources()} in {len(ray.nodes())} node(s). "
            "Fix: ask for fewer or smaller bundles, use PACK instead of STRICT_PACK, or add nodes"
        )
    try:
        locations = _probe(pg, bundle, len(pins), max(1.0, timeout_s - (time.monotonic() - start)))
    except Exception:
        remove_placement_group(pg)
        raise
    if ordered:
        locations = sorted(locations, key=BundleLocation.sort_key)
    return WorkerBundles(pg, bundle, strategy, tuple(locations))


@dataclass(frozen=True)
class ClusterNode:
    """An alive Ray node that has the planned device: its address, id, own resource (`node:<ip>`) and count."""

    address: str
    node_id: str
    resource: str
    devices: int

    def pin(self) -> dict[str, float]:
        """A bundle's share of the node's own resource: the bundle lands on this node."""
        return {self.resource: 0.001}


def cluster_nodes(device: str = "GPU") -> tuple[ClusterNode, ...]:
    """The alive nodes with a whole `device`, ordered by address (then id): plan node i is the i-th one, as
    `detect_cluster` counts them."""
    nodes = []
    for n in ray.nodes():
        count = int(n["Resources"].get(device, 0)) if n.get("Alive") else 0
        if count < 1:
            continue
        own = [k for k in n["Resources"] if k.startswith("node:") and not k.startswith("node:__")]
        resource = f"node:{n['NodeManagerAddress']}"
        nodes.append(ClusterNode(n["NodeManagerAddress"], n["NodeID"], resource if resource in own else own[0], count))
    key = lambda node: (BundleLocation(0, node.node_id, node.address, ()).sort_key(), node.node_id)  # noqa: E731
    return tuple(sorted(nodes, key=key))


def _resources() -> dict[str, float]:
    skip = ("memory", "object_store_memory")
    return {k: v for k, v in ray.cluster_resources().items() if k not in skip and not k.startswith("node:")}


def launch_pinned(actor_class: Any, bundles: WorkerBundles, worker: int, *args: Any, **options: Any) -> Any:
    """Starts `actor_class` (a Ray actor class) in the bundle of `worker`. By default it takes the whole bundle
    (its CPUs, GPUs and custom resources); pass num_cpus / num_gpus / resources in `options` to take part of
    it (e.g. num_gpus=0.5 for two colocated roles). Remaining `options` go to `.options()` (name, runtime_env...)."""
    if not 0 <= worker < len(bundles):
        raise InvalidArgument(f"worker {worker} is outside 0..{len(bundles) - 1}. Fix: pick a planned worker index")
    b = bundles.bundle
    options.setdefault("num_cpus", b.get("CPU", 0.0))
    options.setdefault("num_gpus", b.get("GPU", 0.0))
    custom = {k: v for k, v in b.items() if k not in ("CPU", "GPU")}
    if custom:
        options.setdefault("resources", custom)
    return actor_class.options(scheduling_strategy=bundles.scheduling_strategy(worker), **options).remote(*args)
