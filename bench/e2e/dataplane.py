"""What one service step moves, for bench/e2e/run.py: RPCs, bytes read from the data buffer against the
bytes the nodes' declared inputs need, and the scheduler process's own bulk bytes.

- RPCs: every SERVER span the services and the scheduler export inside the step's window (job events).
- Read bytes: the payload bytes of the data buffer's GetBatch / GetSmallBatch spans in the window (meshrl.bytes).
- Needed bytes: for every node that declares `inputs:`, the bytes of those columns in the nearest upstream
  batch that holds each (ragged columns count their values; rows of a range count once). Measured by a
  probe that reads the step's batches just before the scheduler deletes them; its seconds are taken out
  of the step time and its spans out of the counts.
- Scheduler bulk bytes: the bytes of the data buffer calls (get and put) made by the scheduler process (the
  calls whose parent span no service exported).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshrl.common.codec import Ragged

BYTES = "meshrl.bytes"
GETS = ("DataBuffer/GetBatch", "DataBuffer/GetSmallBatch", "DataBuffer/GetSmallBatches", "DataBuffer/LocateBatch")
BULK = (*GETS, "DataBuffer/PutBatch", "DataBuffer/PutSmallBatch", "DataBuffer/CommitDirectPut")


@dataclass
class StepProbe:
    """Column bytes of each node's batch per step, read just before the scheduler deletes the step."""

    nodes: list[Any]
    sizes: dict[int, dict[str, dict[str, int]]] = field(default_factory=dict)  # step -> node -> column -> bytes
    windows: list[tuple[float, float]] = field(default_factory=list)  # wall-clock intervals of the probe
    seconds: dict[int, float] = field(default_factory=dict)

    def install(self, buffer: Any, job_id: str) -> None:
        """Wraps the client's step clean-up (DeleteStep, or main's ListBatches + DeleteBatch loop)."""
        real_list, real_get = buffer.list, buffer.get

        def probe(step: int) -> None:
            if step in self.sizes:
                return
            t0, w0 = time.perf_counter(), time.time()
            by_node: dict[str, dict[str, int]] = {}
            for key in real_list(job_id, step):
                for name, col in real_get(key).columns.items():
                    nbytes = col.values.nbytes if isinstance(col, Ragged) else col.nbytes
                    cols = by_node.setdefault(key.node_id, {})
                    cols[name] = cols.get(name, 0) + nbytes  # shards of one node add up
            self.sizes[step] = by_node
            self.windows.append((w0, time.time()))
            self.seconds[step] = time.perf_counter() - t0

        def listing(job: str, step: int = -1, **kwargs: Any):
            if job == job_id and step >= 0:
                probe(step)
            return real_list(job, step, **kwargs)

        buffer.list = listing
        if hasattr(buffer, "delete_step"):
            real_delete_step = buffer.delete_step

            def delete_step(job: str, step: int, **kwargs: Any):
                if job == job_id:
                    probe(step)
                return real_delete_step(job, step, **kwargs)

            buffer.delete_step = delete_step

    def covers(self, t: float) -> bool:
        """`t` (wall-clock seconds) falls in one of the probe's own reads."""
        return any(a - 1e-3 <= t <= b + 1e-3 for a, b in self.windows)

    def needed(self, step: int) -> int:
        """Bytes of the declared inputs of every node, each from the nearest upstream batch holding it."""
        sizes = self.sizes.get(step, {})
        deps = {n.node_id: list(n.dependencies) for n in self.nodes}
        total = 0
        for n in self.nodes:
            inputs = n.config.get("inputs") or []
            for col in inputs:
                frontier, seen = list(deps[n.node_id]), set()
                while frontier:
                    d = frontier.pop(0)
                    if d in seen:
                        continue
                    seen.add(d)
                    if col in sizes.get(d, {}):
                        total += sizes[d][col]
                        break
                    frontier += deps[d]
        return total


def read_spans(traces: Path) -> list[dict]:
    spans = []
    for path in sorted(traces.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            d = json.loads(line)
            d["instance"] = path.stem
            spans.append(d)
    return spans


def step_traffic(spans: list[dict], windows: Mapping[int, tuple[float, float]], probe: StepProbe) -> dict[int, dict]:
    """Per step: rpcs, read_bytes, scheduler_bulk_bytes (outside the probe's own reads)."""
    # The scheduler's calls: data-buffer spans whose parent is no span the services exported (the bench's
    # scheduler exports none; its client spans, if it did, are listed as the scheduler's too).
    service_ids = {s["span_id"] for s in spans if not s["instance"].startswith("scheduler")}

    out = {}
    for step, (start, end) in windows.items():
        inside = [s for s in spans if start - 1e-3 <= s["start_ns"] / 1e9 and s["end_ns"] / 1e9 <= end + 1e-3]
        inside = [s for s in inside if not probe.covers(s["start_ns"] / 1e9)]
        server = [s for s in inside if s["kind"] == "SERVER"]
        buffer = [s for s in server if s["instance"].startswith("databuffer")]

        def nbytes(s: dict) -> int:
            return int(s.get("attributes", {}).get(BYTES, 0))

        out[step] = {
            "rpcs": len(server),
            "buffer_rpcs": len(buffer),
            "read_bytes": sum(nbytes(s) for s in buffer if s["name"].endswith(GETS)),
            "scheduler_bulk_bytes": sum(
                nbytes(s) for s in buffer if s["name"].endswith(BULK) and s.get("parent_span_id") not in service_ids
            ),
            "needed_bytes": probe.needed(step),
        }
    return out


def print_traffic(traffic: dict[int, dict], steps: list[int]) -> dict[str, float]:
    import statistics

    rows = [traffic[s] for s in steps if s in traffic]
    if not rows:
        print("\ndata plane: no spans (run with --telemetry file)")
        return {}
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    ratio = med["read_bytes"] / med["needed_bytes"] if med["needed_bytes"] else float("nan")
    print(
        "\ndata plane per step (medians): RPCs (server spans, every service) "
        f"{med['rpcs']:.0f}, of them data buffer {med['buffer_rpcs']:.0f}"
    )
    print(
        f"  bytes read from the buffer {med['read_bytes']:.0f} / bytes the declared inputs need "
        f"{med['needed_bytes']:.0f} = {ratio:.2f}   target <= 1.2"
    )
    print(f"  scheduler's own bulk bytes (its gets + puts) {med['scheduler_bulk_bytes']:.0f}")
    return {**med, "read_over_needed": ratio}
