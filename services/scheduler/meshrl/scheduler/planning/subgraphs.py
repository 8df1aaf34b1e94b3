"""Splitting a task graph into irreducible subgraphs (siiRL's TaskLoader, improved), and why each split exists.

Called by the planner. siiRL discovers two shapes of parallel paths and splits on them until nothing splits:
  - fan-out: a node whose children lead to pairwise disjoint sets of exits (e.g. PPO's advantage feeding
    actor_train and critic_train);
  - reconverging paths: branches that leave one node and meet again downstream (e.g. GRPO's reward,
    old-log-prob and ref-log-prob branches meeting at actor_train).
A graph on which neither rule applies is a single chain, so the fixed point of those rules is the graph's
decomposition into maximal chains; this module computes it directly, in one pass.

Improvements over siiRL: any node may feed any number of nodes; nodes are never duplicated across subgraphs
(siiRL copies the shared upstream into every branch and so runs it once per branch) — each node runs once
per step and its output reaches every consumer through the data buffer; each split is reported with its
reason (`SplitPoint`) so a plan can say why its subgraphs are what they are.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from meshrl.scheduler.workflow.taskgraph import TaskGraph


class SplitKind(str, enum.Enum):
    FAN_OUT = "fan_out"  # a fork whose branches end in disjoint exits
    DIVERGE = "diverge"  # a fork whose branches meet again downstream
    RECONVERGE = "reconverge"  # a node where several paths meet

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class SplitPoint:
    """Where and why the graph splits. `branches` are the children of a fork (or the parents of a join);
    `meets` are where a DIVERGE's branches meet first; `exits` (FAN_OUT) are each branch's exits."""

    kind: SplitKind
    node_id: str
    branches: tuple[str, ...]
    meets: tuple[str, ...] = ()
    exits: tuple[tuple[str, ...], ...] = ()

    def describe(self) -> str:
        if self.kind == SplitKind.FAN_OUT:
            parts = "; ".join(f"{b} -> {{{', '.join(e)}}}" for b, e in zip(self.branches, self.exits, strict=True))
            return f"'{self.node_id}' fans out to disjoint exits: {parts}"
        if self.kind == SplitKind.DIVERGE:
            return f"paths from '{self.node_id}' ({', '.join(self.branches)}) reconverge at {', '.join(self.meets)}"
        return f"'{self.node_id}' joins {', '.join(self.branches)}"


@dataclass(frozen=True)
class Subgraph:
    """A maximal chain of nodes: each node after the first has exactly one dependency, the previous node,
    which feeds nothing else. `upstream` / `downstream` are the subgraphs it reads from / feeds."""

    subgraph_id: str
    node_ids: tuple[str, ...]
    upstream: tuple[str, ...]
    downstream: tuple[str, ...]

    @property
    def head(self) -> str:
        return self.node_ids[0]

    @property
    def tail(self) -> str:
        return self.node_ids[-1]


@dataclass(frozen=True)
class Split:
    """The irreducible subgraphs of a graph (in topological order of their heads) and the split points."""

    graph: TaskGraph
    subgraphs: tuple[Subgraph, ...]
    points: tuple[SplitPoint, ...]

    @cached_property
    def _by_node(self) -> Mapping[str, str]:
        return {nid: sg.subgraph_id for sg in self.subgraphs for nid in sg.node_ids}

    def subgraph(self, subgraph_id: str) -> Subgraph:
        for sg in self.subgraphs:
            if sg.subgraph_id == subgraph_id:
                return sg
        raise KeyError(subgraph_id)

    def subgraph_of(self, node_id: str) -> Subgraph:
        return self.subgraph(self._by_node[node_id])

    def chains(self) -> list[tuple[str, ...]]:
        """The node ids of every subgraph (handy for comparisons)."""
        return [sg.node_ids for sg in self.subgraphs]

    def concurrent(self, a: str, b: str) -> bool:
        """True when subgraphs `a` and `b` may run at the same time (neither feeds the other, even indirectly)."""
        head_a, head_b = self.subgraph(a).head, self.subgraph(b).head
        return a != b and head_b not in self.graph.descendants(head_a) and head_a not in self.graph.descendants(head_b)


def _chains(graph: TaskGraph) -> list[list[str]]:
    chains: list[list[str]] = []
    chain_of: dict[str, int] = {}
    for nid in graph.topological_order:
        parents = graph.parents[nid]
        if len(parents) == 1 and len(graph.children[parents[0]]) == 1:
            index = chain_of[parents[0]]
            chains[index].append(nid)
        else:
            index = len(chains)
            chains.append([nid])
        chain_of[nid] = index
    return chains


def _fork_points(graph: TaskGraph, fork: str) -> list[SplitPoint]:
    children = graph.children[fork]
    exits = {c: graph.reachable_exits(c) for c in children}
    # children whose exit sets overlap belong to one cluster (their paths reconverge somewhere)
    clusters: list[list[str]] = []
    for c in children:
        touching = [cl for cl in clusters if any(exits[c] & exits[o] for o in cl)]
        merged = [c] + [o for cl in touching for o in cl]
        clusters = [cl for cl in clusters if cl not in touching] + [merged]
    position = {c: i for i, c in enumerate(children)}
    clusters = sorted((sorted(cl, key=position.__getitem__) for cl in clusters), key=lambda cl: position[cl[0]])
    points: list[SplitPoint] = []
    if len(clusters) > 1:
        points.append(
            SplitPoint(
                SplitKind.FAN_OUT,
                fork,
                tuple(children),
                exits=tuple(tuple(e for e in graph.order if e in exits[c]) for c in children),
            )
        )
    for cl in clusters:
        if len(cl) < 2:
            continue
        reach = {c: graph.descendants(c) | {c} for c in cl}
        first: set[str] = set()  # for each pair of branches, the nodes where they first meet
        for i, a in enumerate(cl):
            for b in cl[i + 1 :]:
                both = reach[a] & reach[b]
                first |= {n for n in both if not set(graph.parents[n]) & both}
        meets = tuple(n for n in graph.topological_order if n in first)
        points.append(SplitPoint(SplitKind.DIVERGE, fork, tuple(cl), meets=meets))
    return points


def split_irreducible(graph: TaskGraph) -> Split:
    """Splits `graph` into its irreducible subgraphs ("s0", "s1", ... in topological order of their heads)."""
    chains = _chains(graph)
    ids = {nid: f"s{i}" for i, chain in enumerate(chains) for nid in chain}
    subgraphs = []
    for i, chain in enumerate(chains):
        up = dict.fromkeys(ids[p] for p in graph.parents[chain[0]])
        down = dict.fromkeys(ids[c] for c in graph.children[chain[-1]])
        subgraphs.append(Subgraph(f"s{i}", tuple(chain), tuple(up), tuple(down)))
    points: list[SplitPoint] = []
    for nid in graph.topological_order:
        if len(graph.children[nid]) > 1:
            points.extend(_fork_points(graph, nid))
        if len(graph.parents[nid]) > 1:
            points.append(SplitPoint(SplitKind.RECONVERGE, nid, graph.parents[nid]))
    return Split(graph, tuple(subgraphs), tuple(points))
