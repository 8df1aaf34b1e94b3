"""The task graph of a workflow: who feeds whom, in which order nodes can run, and which may run at once.

Built from a validated `Workflow` (or, by the loader, from raw dependency lists to find cycles). Used by the
splitter and planner, and by the step executor (`topological_order`, `levels`, `ready`). Every ordering is
deterministic: ties are broken by the nodes' order in the workflow file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from meshrl.scheduler.workflow.cycles import find_cycle
from meshrl.scheduler.workflow.model import Node, Workflow

__all__ = ["TaskGraph", "find_cycle"]


@dataclass(frozen=True)
class TaskGraph:
    """An acyclic graph of workflow nodes. `order` is the file order of the node ids."""

    graph_id: str
    nodes: Mapping[str, Node]
    order: tuple[str, ...]
    parents: Mapping[str, tuple[str, ...]] = field(repr=False)
    children: Mapping[str, tuple[str, ...]] = field(repr=False)

    @classmethod
    def from_workflow(cls, workflow: Workflow) -> TaskGraph:
        return cls.from_nodes(workflow.dag_id, workflow.nodes)

    @classmethod
    def from_nodes(cls, graph_id: str, nodes: Iterable[Node]) -> TaskGraph:
        """Builds the graph of `nodes`; dependencies on nodes outside the set are dropped (subgraphs)."""
        by_id = {n.node_id: n for n in nodes}
        order = tuple(by_id)
        parents = {nid: tuple(d for d in by_id[nid].dependencies if d in by_id) for nid in order}
        children: dict[str, list[str]] = {nid: [] for nid in order}
        for nid in order:
            for dep in parents[nid]:
                children[dep].append(nid)
        cycle = find_cycle(parents)
        if cycle is not None:
            raise ValueError(f"graph '{graph_id}' has a cycle: {' -> '.join(cycle)}")
        return cls(graph_id, by_id, order, parents, {k: tuple(v) for k, v in children.items()})

    def __len__(self) -> int:
        return len(self.order)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.nodes

    @property
    def entries(self) -> tuple[str, ...]:
        """Nodes with no dependencies inside the graph."""
        return tuple(n for n in self.order if not self.parents[n])

    @property
    def exits(self) -> tuple[str, ...]:
        """Nodes nothing inside the graph depends on."""
        return tuple(n for n in self.order if not self.children[n])

    @cached_property
    def topological_order(self) -> tuple[str, ...]:
        """Kahn's order; among ready nodes the one earliest in the file goes first."""
        position = {nid: i for i, nid in enumerate(self.order)}
        remaining = {nid: len(self.parents[nid]) for nid in self.order}
        ready = sorted((nid for nid, c in remaining.items() if c == 0), key=position.__getitem__)
        out: list[str] = []
        while ready:
            nid = ready.pop(0)
            out.append(nid)
            for child in self.children[nid]:
                remaining[child] -= 1
                if remaining[child] == 0:
                    ready.append(child)
                    ready.sort(key=position.__getitem__)
        return tuple(out)

    @cached_property
    def depth(self) -> Mapping[str, int]:
        """Length of the longest dependency chain from an entry to each node (entries have depth 0)."""
        depth: dict[str, int] = {}
        for nid in self.topological_order:
            depth[nid] = max((depth[p] + 1 for p in self.parents[nid]), default=0)
        return depth

    def levels(self) -> list[tuple[str, ...]]:
        """Nodes grouped by depth; nodes of one level never depend on each other, so they may run at once."""
        out: dict[int, list[str]] = {}
        for nid in self.topological_order:
            out.setdefault(self.depth[nid], []).append(nid)
        return [tuple(out[d]) for d in sorted(out)]

    def ancestors(self, node_id: str) -> frozenset[str]:
        return self._closure(node_id, self.parents)

    def descendants(self, node_id: str) -> frozenset[str]:
        return self._closure(node_id, self.children)

    def _closure(self, node_id: str, edges: Mapping[str, tuple[str, ...]]) -> frozenset[str]:
        seen: set[str] = set()
        stack = list(edges[node_id])
        while stack:
            nid = stack.pop()
            if nid not in seen:
                seen.add(nid)
                stack.extend(edges[nid])
        return frozenset(seen)

    def reachable_exits(self, node_id: str) -> frozenset[str]:
        """The exits reachable from `node_id` (itself included when it is an exit)."""
        reach = self.descendants(node_id) | {node_id}
        return frozenset(n for n in reach if not self.children[n])

    def ready(self, done: Iterable[str]) -> tuple[str, ...]:
        """Nodes not in `done` whose dependencies are all in `done` (what an executor can start now)."""
        finished = set(done)
        return tuple(
            n for n in self.topological_order if n not in finished and all(p in finished for p in self.parents[n])
        )

    def subgraph(self, graph_id: str, node_ids: Iterable[str]) -> TaskGraph:
        keep = set(node_ids)
        return TaskGraph.from_nodes(graph_id, (self.nodes[n] for n in self.order if n in keep))
