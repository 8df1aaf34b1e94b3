"""Finding a dependency cycle in a node -> dependencies mapping. Used by the workflow loader (to report the
cycle) and by the task graph (to refuse one)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def find_cycle(dependencies: Mapping[str, Sequence[str]]) -> list[str] | None:
    """Returns one cycle as [a, b, ..., a] (a depends on b ... depends on a), or None for a DAG.

    `dependencies` maps each node to the nodes it depends on; names missing from the mapping are ignored.
    """
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(dependencies, white)
    for start in dependencies:
        if colour[start] != white:
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        path: list[str] = [start]
        colour[start] = grey
        while stack:
            node, i = stack[-1]
            deps = [d for d in dependencies[node] if d in colour]
            if i < len(deps):
                stack[-1] = (node, i + 1)
                nxt = deps[i]
                if colour[nxt] == grey:
                    return path[path.index(nxt) :] + [nxt]
                if colour[nxt] == white:
                    colour[nxt] = grey
                    stack.append((nxt, 0))
                    path.append(nxt)
            else:
                colour[node] = black
                stack.pop()
                path.pop()
    return None
