"""Loading a workflow file: YAML (anchors and merge keys work) -> `${config...}` references resolved ->
typed `Workflow` -> every check, each problem naming its node and the fix.

Called by `load_builtin`, the plan CLI and the job API (SubmitJob carries the file's text). Top-level keys
starting with `x-` are ignored so they can hold YAML anchors. All problems are collected and raised together
as one `WorkflowError` (an `InvalidArgument`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic
import yaml

from meshrl.common.bounded_yaml import YamlLimitError, load_bounded
from meshrl.common.errors import short_repr
from meshrl.common.suggest import close_match
from meshrl.scheduler.workflow.checks import workflow_problems
from meshrl.scheduler.workflow.errors import Problem, WorkflowError
from meshrl.scheduler.workflow.executables import default_allowed_modules
from meshrl.scheduler.workflow.interpolate import resolve_references
from meshrl.scheduler.workflow.model import (
    ROLES_BY_TYPE,
    Node,
    NodeRole,
    NodeType,
    Workflow,
)

NODE_FIELDS = tuple(Node.model_fields)
TOP_FIELDS = tuple(Workflow.model_fields)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key written twice in one mapping (merge keys `<<` may still be overridden)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
                seen.add(key)
            except TypeError:
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark, f"found duplicate key '{key}'", key_node.start_mark
                )
        return super().construct_mapping(node, deep=deep)


def load_workflow_file(
    path: str | Path,
    config: Any = None,
    *,
    allowed_modules: Sequence[str] | None = None,
    import_executables: bool = True,
) -> Workflow:
    """Reads and validates the workflow file at `path` (see `load_workflow_data` for the arguments)."""
    p = Path(path)
    if not p.is_file():
        raise WorkflowError(
            [Problem(f"file '{p}' does not exist", "pass the path of a workflow YAML file or a built-in name")],
            source=str(p),
        )
    return load_workflow_text(
        p.read_text(),
        config=config,
        allowed_modules=allowed_modules,
        import_executables=import_executables,
        source=str(p),
    )


def load_workflow_text(
    text: str,
    config: Any = None,
    *,
    allowed_modules: Sequence[str] | None = None,
    import_executables: bool = True,
    source: str = "workflow",
) -> Workflow:
    """Parses YAML text and validates it (see `load_workflow_data`)."""
    try:
        data = load_bounded(text, loader=_StrictLoader, source=source)  # aliases and size checked first
    except YamlLimitError as exc:
        raise WorkflowError([Problem(exc.message, "send a smaller workflow")], source=source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise WorkflowError(
            [
                Problem(
                    f"the file is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}",
                    "fix the YAML syntax there",
                )
            ],
            source=source,
        ) from None
    if not isinstance(data, Mapping):
        raise WorkflowError(
            [Problem("the top level is not a mapping", "write dag_id:, description: and nodes: at the top level")],
            source=source,
        )
    return load_workflow_data(
        data, config=config, allowed_modules=allowed_modules, import_executables=import_executables, source=source
    )


def load_workflow_data(
    data: Mapping[str, Any],
    config: Any = None,
    *,
    allowed_modules: Sequence[str] | None = None,
    import_executables: bool = True,
    source: str = "workflow",
) -> Workflow:
    """Validates a parsed workflow.

    Args:
        data: the parsed YAML mapping.
        config: the job's global config (mapping or pydantic model) that `${config.path}` references read.
        allowed_modules: module prefixes an `executable_ref` may import from ("*": any). Default:
            $MESHRL_ALLOWED_MODULES (comma-separated) or, when unset, meshrl's own modules only.
        import_executables: import every `executable_ref` to prove it exists (the prefix check always runs).
        source: how errors name the file.
    Raises:
        WorkflowError: listing every problem found.
    """
    allowed = tuple(default_allowed_modules() if allowed_modules is None else allowed_modules)
    raw = {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("x-"))}
    resolved, problems = resolve_references(raw, config)
    if problems:
        raise WorkflowError(problems, source=source)
    try:
        workflow = Workflow.model_validate(resolved)
    except pydantic.ValidationError as exc:
        raise WorkflowError(_field_problems(exc, resolved), source=source) from None
    problems = workflow_problems(workflow, allowed, import_executables)
    if problems:
        raise WorkflowError(problems, source=source)
    return workflow


def _field_problems(exc: pydantic.ValidationError, data: Mapping[str, Any]) -> list[Problem]:
    problems = []
    nodes = data.get("nodes") if isinstance(data.get("nodes"), list) else []
    for err in exc.errors():
        loc = list(err["loc"])
        node_id = None
        if len(loc) >= 2 and loc[0] == "nodes" and isinstance(loc[1], int):
            raw = nodes[loc[1]] if loc[1] < len(nodes) else None
            node_id = (
                raw["node_id"] if isinstance(raw, Mapping) and isinstance(raw.get("node_id"), str) else f"#{loc[1]}"
            )
            loc = loc[2:]
        field = ".".join(str(p) for p in loc)
        problems.append(_describe_error(err, field, node_id, nodes))
    return problems


def _describe_error(err: Any, field: str, node_id: str | None, nodes: list[Any]) -> Problem:
    kind, value = err["type"], err.get("input")
    known = NODE_FIELDS if node_id is not None else TOP_FIELDS
    if not field:
        if kind == "model_type":
            return Problem(
                f"a node must be a mapping, got {short_repr(value)}",
                "write the node as node_id: ..., node_type: ...",
                node_id,
            )
        return Problem(err["msg"], "fix the workflow's structure", node_id)
    if kind == "extra_forbidden":
        close = close_match(field, known)
        fix = f"did you mean '{close}'?" if close else f"remove it; allowed fields: {', '.join(known)}"
        if node_id is None:
            fix += " (top-level keys starting with 'x-' may hold YAML anchors)"
        return Problem(f"unknown field '{field}'", fix, node_id, field)
    if kind == "missing":
        fixes = {
            "node_id": "give the node a unique node_id",
            "node_type": "add node_type: one of " + ", ".join(t.value for t in NodeType),
            "node_role": _role_fix(node_id, nodes),
            "dag_id": "add dag_id: NAME at the top of the file",
            "nodes": "add a nodes: list",
        }
        return Problem(f"'{field}' is required", fixes.get(field, f"add {field}"), node_id, field)
    if kind == "enum":
        choices = [t.value for t in NodeType] if field == "node_type" else [r.value for r in NodeRole]
        close = close_match(str(value).upper(), choices)
        fix = f"did you mean '{close}'?" if close else "use one of " + ", ".join(choices)
        return Problem(f"{field} {short_repr(value)} is not a known {field}", fix, node_id, field)
    if kind == "string_pattern_mismatch":
        fix = {
            "executable_ref": "write 'package.module:function', e.g. my_rewards.math:score",
        }.get(field, "use letters, digits, '_' and '-', starting with a letter or '_'")
        return Problem(f"{field} {short_repr(value)} is not well-formed", fix, node_id, field)
    if kind == "too_short" and field == "nodes":
        return Problem("the workflow has no nodes", "add at least a DATA_LOAD or ROLLOUT node", None, field)
    return Problem(f"{field} = {short_repr(value)}: {err['msg']}", "give a value of the expected type", node_id, field)


def _role_fix(node_id: str | None, nodes: list[Any]) -> str:
    for raw in nodes:
        if isinstance(raw, Mapping) and raw.get("node_id") == node_id:
            try:
                roles = ROLES_BY_TYPE[NodeType(raw.get("node_type"))]
            except ValueError:
                break
            return "add node_role: one of " + ", ".join(r.value for r in roles)
    return "add node_role"
