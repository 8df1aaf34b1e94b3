"""Where a job's services run now, as `meshrl status` and GetJob show it: each launched process (the data
buffer, the trainer or each rank of a trainer group, each rollout replica) with its address and, where Ray
placed it, the node, bundle and devices; services named by address carry only the address."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def service_of(name: str) -> str:
    """The service a launched instance's name belongs to: "rollout-2" and "rollout@host:port" -> "rollout"."""
    return name.split("@", 1)[0].rsplit("-", 1)[0]


def whereabouts(
    addresses: Mapping[str, str],
    bundles: Mapping[str, tuple[str, Any]],
    ranks: Sequence[Any] = (),
    replicas: Sequence[str] = (),
    workers: Mapping[str, str] | None = None,
) -> list[dict]:
    """One row per instance, in the order the job started them, with the Placement message's fields.
    `addresses`: instance name -> gRPC address; `bundles`: name -> (placement group id, BundleLocation) for
    the instances Ray placed; `ranks`: a trainer group's RankPlacements (they replace the trainer's row);
    `replicas`: the fleet's replica addresses (those that joined through the registry are only there);
    `workers`: name -> the plan worker a launched instance was pinned for."""
    workers = workers or {}
    known = set(addresses.values())
    addresses = {**addresses, **{f"rollout@{a}": a for a in replicas if a not in known}}
    rows = []
    for name, address in addresses.items():
        service = service_of(name)
        if service == "trainer" and ranks:
            rows.extend(
                {
                    "service": "trainer",
                    "rank": r.rank,
                    "address": address if r.rank == 0 else "",
                    "worker": r.worker,
                    "node": r.node_ip,
                    "bundle": r.bundle_index,
                    "devices": list(r.devices),
                }
                for r in ranks
            )
            continue
        row = {
            "service": service,
            "rank": 0,
            "address": address,
            "worker": workers.get(name, ""),
            "node": "",
            "bundle": -1,
        }
        if name in bundles:
            _, location = bundles[name]
            row.update(node=location.node_ip, bundle=location.bundle_index, devices=list(location.gpu_ids))
        rows.append(row)
    return rows


def describe(placements: Sequence[Any]) -> list[str]:
    """Lines for `meshrl status`, from Placement messages: "trainer rank 1  node 127.0.0.3  bundle 1  worker n1:0"."""
    lines = []
    for p in placements:
        parts = [f"{p.service} rank {p.rank}" if p.service == "trainer" and (p.worker or p.rank) else p.service]
        parts += [p.address] if p.address else []
        parts += [f"node {p.node}"] if p.node else []
        parts += [f"bundle {p.bundle}"] if p.bundle >= 0 else []
        parts += [f"worker {p.worker}"] if p.worker else []
        parts += [f"devices {','.join(map(str, p.devices))}"] if p.devices else []
        lines.append("  ".join(parts))
    return lines
