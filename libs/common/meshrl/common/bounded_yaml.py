"""YAML from outside, bounded: text size, alias count, nesting depth and the size the document would have
once its aliases were expanded, all checked on the composed node graph BEFORE any Python object is built.

A "billion laughs" document is small as text and as a node graph (aliases are references), but anything that
walks it (config references, merges, `safe_dump`, an error message's repr) expands it. Callers: the job API's
config and workflow texts (`meshrl.scheduler`), `read_yaml` / `parse_yaml_value` of service configs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from meshrl.common.errors import InvalidArgument


@dataclass(frozen=True)
class YamlLimits:
    max_bytes: int = 4 << 20  # the text itself
    max_aliases: int = 256  # `*name` references in one document
    max_depth: int = 64  # nested mappings / sequences
    max_expanded: int = 2_000_000  # nodes + scalar characters once every alias is expanded


DEFAULT_LIMITS = YamlLimits()


class YamlLimitError(InvalidArgument):
    """The YAML document exceeds a limit; nothing was built from it."""


def _refuse(source: str, what: str, fix: str) -> YamlLimitError:
    return YamlLimitError(f"{source}: {what}. Fix: {fix}")


def _expanded_size(root: yaml.Node, limits: YamlLimits, source: str) -> int:
    """Size of the document with aliases expanded, computed once per node (memoised, no expansion)."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, children_done = stack.pop()
        key = id(node)
        if key in sizes and not children_done:
            continue
        if depth > limits.max_depth:
            raise _refuse(source, f"nesting deeper than {limits.max_depth} levels", "flatten the document")
        if isinstance(node, yaml.ScalarNode):
            sizes[key] = 1 + len(node.value)
            continue
        children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else list(node.value)
        if children_done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            if sizes[key] > limits.max_expanded:
                raise _refuse(
                    source,
                    f"expands past {limits.max_expanded} nodes and characters once its aliases are expanded",
                    "write the values out or use fewer nested aliases",
                )
            continue
        if key in on_path:
            raise _refuse(source, "an alias refers to the node that contains it", "remove the recursive alias")
        on_path.add(key)
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in children if id(c) not in sizes)
    return sizes[id(root)]


def _bounded_loader(base: type[yaml.SafeLoader], limits: YamlLimits, source: str) -> type[yaml.SafeLoader]:
    class Bounded(base):  # type: ignore[valid-type, misc]
        aliases = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                self.aliases += 1
                if self.aliases > limits.max_aliases:
                    raise _refuse(source, f"more than {limits.max_aliases} aliases", "use fewer `*name` references")
            return super().compose_node(parent, index)

    return Bounded


def load_bounded(
    text: str | bytes,
    *,
    loader: type[yaml.SafeLoader] = yaml.SafeLoader,
    limits: YamlLimits = DEFAULT_LIMITS,
    source: str = "YAML",
) -> Any:
    """Parses one YAML document with `loader` (a SafeLoader subclass) after checking `limits`.

    Raises YamlLimitError (INVALID_ARGUMENT) before building anything when a limit is passed, and
    yaml.YAMLError for malformed YAML, as `yaml.load` does.
    """
    size = len(text.encode() if isinstance(text, str) else text)
    if size > limits.max_bytes:
        raise _refuse(source, f"{size} bytes is more than {limits.max_bytes}", "send a smaller document")
    instance = _bounded_loader(loader, limits, source)(text)
    try:
        try:
            node = instance.get_single_node()
        except RecursionError:
            raise _refuse(source, "nesting too deep to parse", "flatten the document") from None
        if node is None:
            return None
        _expanded_size(node, limits, source)
        return instance.construct_document(node)
    finally:
        instance.dispose()
