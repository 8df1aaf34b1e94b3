"""Loading a workflow file: YAML (anchors and merge keys work) -> `${config...}` references resolved ->
typed `Workflow` -> every check, each problem naming its node and the fix.

Called by `load_builtin`, the plan CLI and the job API (SubmitJob carries the file's text). Top-level keys
starting with `x-` are ignored so they can hold YAML anchors. All problems are collected and raised together
as one `WorkflowError` (an `InvalidArgument`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic
import yaml
from meshrl.scheduler.workflow import compute_catalog as cat
from meshrl.scheduler.workflow.cycles import find_cycle
from meshrl.scheduler.workflow.errors import Problem, WorkflowError
from meshrl.scheduler.workflow.executables import check_executable, default_allowed_modules
from meshrl.scheduler.workflow.interpolate import resolve_references
from meshrl.scheduler.workflow.model import (
    ENTRY_TYPES,
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
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
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
    problems = _graph_problems(workflow)
    problems += _node_problems(workflow)
    if not problems:
        problems += _column_problems(workflow)
    problems += _executable_problems(workflow, allowed, import_executables)
    if problems:
        raise WorkflowError(problems, source=source)
    return workflow


def _close(word: str, choices: Sequence[str]) -> str | None:
    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return found[0] if found else None


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
                f"a node must be a mapping, got {value!r}", "write the node as node_id: ..., node_type: ...", node_id
            )
        return Problem(err["msg"], "fix the workflow's structure", node_id)
    if kind == "extra_forbidden":
        close = _close(field, known)
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
        close = _close(str(value).upper(), choices)
        fix = f"did you mean '{close}'?" if close else "use one of " + ", ".join(choices)
        return Problem(f"{field} {value!r} is not a known {field}", fix, node_id, field)
    if kind == "string_pattern_mismatch":
        fix = {
            "executable_ref": "write 'package.module:function', e.g. my_rewards.math:score",
        }.get(field, "use letters, digits, '_' and '-', starting with a letter or '_'")
        return Problem(f"{field} {value!r} is not well-formed", fix, node_id, field)
    if kind == "too_short" and field == "nodes":
        return Problem("the workflow has no nodes", "add at least a DATA_LOAD or ROLLOUT node", None, field)
    return Problem(f"{field} = {value!r}: {err['msg']}", "give a value of the expected type", node_id, field)


def _role_fix(node_id: str | None, nodes: list[Any]) -> str:
    for raw in nodes:
        if isinstance(raw, Mapping) and raw.get("node_id") == node_id:
            try:
                roles = ROLES_BY_TYPE[NodeType(raw.get("node_type"))]
            except ValueError:
                break
            return "add node_role: one of " + ", ".join(r.value for r in roles)
    return "add node_role"


def _graph_problems(wf: Workflow) -> list[Problem]:
    problems: list[Problem] = []
    ids = wf.node_ids
    seen: set[str] = set()
    for nid in ids:
        if nid in seen:
            problems.append(
                Problem("node_id is used by more than one node", "give each node a unique node_id", nid, "node_id")
            )
        seen.add(nid)
    for node in wf.nodes:
        for dep in dict.fromkeys(node.dependencies):
            if dep == node.node_id:
                problems.append(
                    Problem("depends on itself", f"remove '{dep}' from its dependencies", node.node_id, "dependencies")
                )
            elif dep not in seen:
                close = _close(dep, ids)
                fix = f"did you mean '{close}'?" if close else f"add a node '{dep}' or remove it from dependencies"
                problems.append(Problem(f"depends on '{dep}', which is not a node", fix, node.node_id, "dependencies"))
        if len(set(node.dependencies)) != len(node.dependencies):
            problems.append(
                Problem("lists a dependency twice", "list each dependency once", node.node_id, "dependencies")
            )
    if problems:
        return problems
    deps = {n.node_id: n.dependencies for n in wf.nodes}
    cycle = find_cycle(deps)
    if cycle is not None:
        return [
            Problem(
                "is part of a dependency cycle " + " -> ".join(f"'{c}'" for c in cycle),
                "a step must be acyclic: remove one of these dependencies",
                cycle[0],
                "dependencies",
            )
        ]
    return _reachability_problems(wf)


def _reachability_problems(wf: Workflow) -> list[Problem]:
    problems: list[Problem] = []
    roots = [n for n in wf.nodes if not n.dependencies]
    entries = [n.node_id for n in roots if n.node_type in ENTRY_TYPES]
    for n in roots:
        if n.node_type not in ENTRY_TYPES:
            problems.append(
                Problem(
                    f"has no dependencies, but a {n.node_type.value} node needs input from another node",
                    "add the node it reads from to its dependencies (a step starts at DATA_LOAD or ROLLOUT nodes)",
                    n.node_id,
                    "dependencies",
                )
            )
    if not entries:
        problems.append(Problem("has no entry node", "add a DATA_LOAD (or ROLLOUT) node without dependencies"))
        return problems
    children: dict[str, list[str]] = {nid: [] for nid in wf.node_ids}
    for n in wf.nodes:
        for dep in n.dependencies:
            children[dep].append(n.node_id)
    reached, stack = set(entries), list(entries)
    while stack:
        for child in children[stack.pop()]:
            if child not in reached:
                reached.add(child)
                stack.append(child)
    orphans = {n.node_id for n in roots if n.node_type not in ENTRY_TYPES}
    deps = {n.node_id: n.dependencies for n in wf.nodes}
    for n in wf.nodes:
        if n.node_id not in reached and n.node_id not in orphans:
            starts, stack, seen = [], list(n.dependencies), set()
            while stack:
                d = stack.pop()
                if d not in seen:
                    seen.add(d)
                    stack.extend(deps[d])
                    if d in orphans:
                        starts.append(d)
            problems.append(
                Problem(
                    f"is unreachable from the entry nodes ({', '.join(entries)}): every path into it starts at "
                    + ", ".join(f"'{s}'" for s in sorted(starts)),
                    "make it depend (through its dependencies) on an entry node, or remove it",
                    n.node_id,
                    "dependencies",
                )
            )
    return problems


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _node_problems(wf: Workflow) -> list[Problem]:
    problems: list[Problem] = []
    for n in wf.nodes:
        nid, cfg = n.node_id, n.config
        allowed = ROLES_BY_TYPE[n.node_type]
        if n.node_role not in allowed:
            fix = "use node_role " + " or ".join(r.value for r in allowed)
            problems.append(
                Problem(f"role {n.node_role.value} is not valid for a {n.node_type.value} node", fix, nid, "node_role")
            )
        if n.only_forward_compute and n.node_type not in (NodeType.MODEL_TRAIN, NodeType.MODEL_INFERENCE):
            problems.append(
                Problem(
                    f"only_forward_compute applies to model nodes, not {n.node_type.value}",
                    "remove only_forward_compute",
                    nid,
                    "only_forward_compute",
                )
            )
        if n.executable_ref is not None and n.node_type != NodeType.COMPUTE:
            problems.append(
                Problem(
                    f"executable_ref is only run on COMPUTE nodes; this is a {n.node_type.value} node, served by a service",
                    "remove executable_ref, or make it a COMPUTE node",
                    nid,
                    "executable_ref",
                )
            )
        if n.node_type == NodeType.COMPUTE and n.executable_ref is None:
            problems += _builtin_problems(n)
        if cat.CONFIG_AGENT in cfg and not (
            isinstance(cfg[cat.CONFIG_AGENT], str) and cfg[cat.CONFIG_AGENT].isidentifier()
        ):
            problems.append(
                Problem(
                    f"config.agent {cfg[cat.CONFIG_AGENT]!r} is not a name",
                    "use a name like agent_a",
                    nid,
                    "config.agent",
                )
            )
        for key in (cat.CONFIG_TP, cat.CONFIG_PP, cat.CONFIG_PARAM_COUNT):
            if key not in cfg:
                continue
            if not n.is_model_node:
                problems.append(
                    Problem(f"config.{key} only applies to model nodes", f"remove config.{key}", nid, f"config.{key}")
                )
            elif key == cat.CONFIG_PARAM_COUNT:
                try:
                    cat.parse_param_count(cfg[key])
                except ValueError as exc:
                    problems.append(
                        Problem(f"config.{key}: {exc}", "write e.g. 7B, 500M or 7000000", nid, f"config.{key}")
                    )
            elif not _positive_int(cfg[key]):
                problems.append(
                    Problem(
                        f"config.{key} = {cfg[key]!r} is not a positive integer",
                        f"write e.g. {key}: 2",
                        nid,
                        f"config.{key}",
                    )
                )
    return problems


def _builtin_problems(n: Node) -> list[Problem]:
    choice = cat.BUILTIN_COMPUTE.get(n.node_role)
    if choice is None:
        return [
            Problem(
                f"a COMPUTE node with role {n.node_role.value} has no built-in function",
                "set executable_ref: package.module:function, or use role "
                + ", ".join(r.value for r in cat.BUILTIN_COMPUTE),
                n.node_id,
                "executable_ref",
            )
        ]
    if choice.key is None or choice.key not in n.config:
        return []
    name = n.config[choice.key]
    if name not in choice.names:
        close = _close(str(name), choice.names)
        fix = (
            f"did you mean '{close}'?" if close else "use one of " + ", ".join(choice.names) + ", or set executable_ref"
        )
        return [
            Problem(
                f"config.{choice.key} {name!r} is not a built-in {n.node_role.value.lower()} function",
                fix,
                n.node_id,
                f"config.{choice.key}",
            )
        ]
    return []


def _column_problems(wf: Workflow) -> list[Problem]:
    """`inputs`/`outputs` name batch_schema columns; an input must be written by an ancestor (checked when
    every ancestor declares its outputs)."""
    known = cat.known_columns()
    problems: list[Problem] = []
    declared: dict[str, set[str] | None] = {}
    for n in wf.nodes:
        for key in (cat.CONFIG_INPUTS, cat.CONFIG_OUTPUTS):
            value = n.config.get(key)
            if value is None:
                continue
            if not (isinstance(value, list) and all(isinstance(c, str) for c in value)):
                problems.append(
                    Problem(
                        f"config.{key} is not a list of column names",
                        f"write {key}: [rewards, ...]",
                        n.node_id,
                        f"config.{key}",
                    )
                )
                continue
            for col in value:
                if col not in known:
                    close = _close(col, sorted(known))
                    fix = f"did you mean '{close}'?" if close else "use a column of meshrl.common.batch_schema"
                    problems.append(
                        Problem(f"config.{key} names an unknown column '{col}'", fix, n.node_id, f"config.{key}")
                    )
        outs = n.config.get(cat.CONFIG_OUTPUTS)
        declared[n.node_id] = set(outs) if isinstance(outs, list) else None
    if problems:
        return problems
    parents = {n.node_id: n.dependencies for n in wf.nodes}
    for n in wf.nodes:
        inputs = n.config.get(cat.CONFIG_INPUTS)
        if not inputs:
            continue
        ancestors, stack = set(), list(parents[n.node_id])
        while stack:
            a = stack.pop()
            if a not in ancestors:
                ancestors.add(a)
                stack.extend(parents[a])
        if any(declared[a] is None for a in ancestors):
            continue
        available = set().union(*(declared[a] for a in ancestors)) if ancestors else set()
        for col in inputs:
            if col not in available:
                writers = [m.node_id for m in wf.nodes if declared[m.node_id] and col in declared[m.node_id]]
                fix = (
                    f"add '{writers[0]}' to its dependencies" if writers else f"add a node that writes '{col}' upstream"
                )
                problems.append(
                    Problem(f"reads column '{col}', which no upstream node writes", fix, n.node_id, "config.inputs")
                )
    return problems


def _executable_problems(wf: Workflow, allowed: Sequence[str], import_them: bool) -> list[Problem]:
    problems = []
    for n in wf.nodes:
        if n.executable_ref is None or n.node_type != NodeType.COMPUTE:
            continue
        problem = check_executable(n.executable_ref, allowed, n.node_id, import_module=import_them)
        if problem is not None:
            problems.append(problem)
    return problems
