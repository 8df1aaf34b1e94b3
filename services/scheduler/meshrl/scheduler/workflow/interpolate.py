"""References from a workflow file to the job's global config: `${config.path.to.key}` and
`${config.path.to.key:-default}`.

Called by the workflow loader before the nodes are type-checked, so a substituted value is checked like a
literal one. Rules:
  - a value that is exactly one reference takes the referenced value with its type (an int stays an int,
    a mapping stays a mapping); a reference inside a longer string is replaced by its text;
  - `:-default` is used when the path is missing; the default is read as a YAML scalar (`8`, `true`, `0.2`);
  - path parts are mapping keys or list indices (`${config.models.0.name}`);
  - `$${` writes a literal `${`;
  - the values substituted into one workflow are bounded in total size (a small file cannot copy a large
    config value a million times).
Why not OmegaConf's interpolation: a workflow is untrusted input, and these rules (typed whole-value
substitution, YAML-scalar defaults, the size bound, a Problem naming the node and field) are checked here in one
pass; OmegaConf resolves lazily and without a bound, and its built-in `oc.env` resolver would let a workflow
file read the scheduler's environment (its secrets).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from meshrl.common.bounded_yaml import DEFAULT_LIMITS, YamlLimitError, load_bounded
from meshrl.scheduler.workflow.errors import Problem

_ANY_REF = re.compile(r"\$\$\{|\$\{([^}]*)\}")
_CONFIG_REF = re.compile(r"^config\.([A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+)*)(?::-(.*))?$", re.DOTALL)
_MISSING = object()


def config_to_mapping(config: Any) -> Mapping[str, Any]:
    """Accepts a mapping, a pydantic model or None and returns a plain mapping to resolve against."""
    if config is None:
        return {}
    if hasattr(config, "model_dump"):
        return config.model_dump()
    if isinstance(config, Mapping):
        return config
    raise TypeError(f"the global config must be a mapping or a pydantic model, got {type(config).__name__}")


def lookup(config: Mapping[str, Any], path: str) -> Any:
    """Follows a dotted path through mappings and lists; returns the sentinel `_MISSING` when absent."""
    current: Any = config
    for part in path.split("."):
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        elif isinstance(current, list | tuple) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return _MISSING
    return current


def _size(value: Any, limit: int) -> int:
    """Nodes plus string characters of a plain value, counted up to `limit` (stops early past it)."""
    total, stack = 0, [value]
    while stack and total <= limit:
        item = stack.pop()
        total += 1 + (len(item) if isinstance(item, str) else 0)
        if isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return total


class _Resolver:
    def __init__(self, config: Mapping[str, Any], budget: int = DEFAULT_LIMITS.max_expanded) -> None:
        self.config = config
        self.problems: list[Problem] = []
        self.budget = budget

    def _spend(self, value: Any, path: str) -> None:
        self.budget -= _size(value, self.budget)
        if self.budget < 0:
            raise YamlLimitError(
                f"the workflow's ${{config...}} references copy more than {DEFAULT_LIMITS.max_expanded} nodes and "
                f"characters (last: config.{path}). Fix: reference large config values fewer times"
            )

    def _problem(self, where: str, node_id: str | None, message: str, fix: str) -> None:
        self.problems.append(Problem(f"{message} (at {where})", fix, node_id=node_id, field=where))

    def _resolve_ref(self, body: str, where: str, node_id: str | None) -> Any:
        match = _CONFIG_REF.match(body.strip())
        if match is None:
            self._problem(
                where,
                node_id,
                f"'${{{body}}}' is not a config reference",
                "write ${config.dotted.path} or ${config.dotted.path:-default}, or $${...} for a literal",
            )
            return _MISSING
        path, default = match.group(1), match.group(2)
        value = lookup(self.config, path)
        if value is not _MISSING:
            self._spend(value, path)
            return copy.deepcopy(value)
        if default is not None:
            return load_bounded(default, source="a ${...:-default}") if default.strip() else ""
        self._problem(
            where,
            node_id,
            f"'${{config.{path}}}' is not set in the global config",
            f"set '{path}' in the job config, or give a default: ${{config.{path}:-VALUE}}",
        )
        return _MISSING

    def string(self, text: str, where: str, node_id: str | None) -> Any:
        matches = list(_ANY_REF.finditer(text))
        if not matches:
            return text
        if len(matches) == 1 and matches[0].group(0) != "$${" and matches[0].span() == (0, len(text)):
            value = self._resolve_ref(matches[0].group(1), where, node_id)
            return text if value is _MISSING else value
        out: list[str] = []
        last = 0
        for m in matches:
            out.append(text[last : m.start()])
            if m.group(0) == "$${":
                out.append("${")
            else:
                value = self._resolve_ref(m.group(1), where, node_id)
                out.append(m.group(0) if value is _MISSING else str(value))
            last = m.end()
        out.append(text[last:])
        return "".join(out)

    def walk(self, value: Any, where: str, node_id: str | None) -> Any:
        if isinstance(value, str):
            return self.string(value, where, node_id)
        if isinstance(value, Mapping):
            return {k: self.walk(v, f"{where}.{k}", node_id) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.walk(v, f"{where}[{i}]", node_id) for i, v in enumerate(value)]
        return value


def resolve_references(raw: Mapping[str, Any], config: Any) -> tuple[dict[str, Any], list[Problem]]:
    """Returns a copy of the parsed workflow with every `${config...}` resolved, and the problems found.

    Problems inside `nodes[i]` name that node (by its `node_id`, or `#i` when it has none).
    """
    resolver = _Resolver(config_to_mapping(config))
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "nodes" and isinstance(value, list):
            nodes = []
            for i, node in enumerate(value):
                node_id = _raw_node_id(node, i)
                nodes.append(resolver.walk(node, f"nodes[{i}]", node_id))
            out[key] = nodes
        else:
            out[key] = resolver.walk(value, str(key), None)
    return out, resolver.problems


def _raw_node_id(node: Any, index: int) -> str:
    if isinstance(node, Mapping) and isinstance(node.get("node_id"), str):
        return node["node_id"]
    return f"#{index}"
