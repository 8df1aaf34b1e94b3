"""The checks a typed workflow must pass beyond its field types: unique ids, known dependencies, no cycle,
every node reachable from an entry, roles that fit their node types, built-in COMPUTE selections, planner
config keys, data-plane columns and executable_refs. Each returns `Problem`s naming the node and the fix.

Called by the loader (`load_workflow_data`) after the pydantic model has validated the fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshrl.common.suggest import close_match
from meshrl.scheduler.workflow import compute_catalog as cat
from meshrl.scheduler.workflow.columns import node_outputs
from meshrl.scheduler.workflow.cycles import find_cycle
from meshrl.scheduler.workflow.errors import Problem
from meshrl.scheduler.workflow.executables import check_executable
from meshrl.scheduler.workflow.model import ENTRY_TYPES, ROLES_BY_TYPE, Node, NodeType, Workflow


def workflow_problems(wf: Workflow, allowed: Sequence[str], import_executables: bool) -> list[Problem]:
    """Every problem of `wf`, in check order; columns are checked only when everything else is fine."""
    problems = graph_problems(wf) + node_problems(wf)
    if not problems:
        problems += column_problems(wf)
    return problems + executable_problems(wf, allowed, import_executables)


def graph_problems(wf: Workflow) -> list[Problem]:
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
                close = close_match(dep, ids)
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
    return reachability_problems(wf)


def reachability_problems(wf: Workflow) -> list[Problem]:
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


def node_problems(wf: Workflow) -> list[Problem]:
    problems: list[Problem] = []
    for n in wf.nodes:
        nid = n.node_id
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
        if n.executable_ref is not None and n.node_type not in RUNS_EXECUTABLE:
            problems.append(
                Problem(
                    f"executable_ref is only run on COMPUTE nodes (a function) and ROLLOUT nodes (an environment); "
                    f"this is a {n.node_type.value} node, served by a service",
                    "remove executable_ref, or make it a COMPUTE node",
                    nid,
                    "executable_ref",
                )
            )
        if n.node_type == NodeType.COMPUTE and n.executable_ref is None:
            problems += _builtin_problems(n)
        problems += _planner_key_problems(n)
    return problems


def _planner_key_problems(n: Node) -> list[Problem]:
    """The node-config keys the planner reads: agent names, TP / PP sizes, parameter counts."""
    problems: list[Problem] = []
    nid, cfg = n.node_id, n.config
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
                problems.append(Problem(f"config.{key}: {exc}", "write e.g. 7B, 500M or 7000000", nid, f"config.{key}"))
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
        close = close_match(str(name), choice.names)
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


def column_problems(wf: Workflow) -> list[Problem]:
    """`inputs`/`outputs` name batch_schema columns; every input must be written by an ancestor (its declared
    outputs, or what its built-in writes: meshrl.scheduler.workflow.columns)."""
    known = cat.known_columns()
    problems: list[Problem] = []
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
                    close = close_match(col, sorted(known))
                    fix = f"did you mean '{close}'?" if close else "use a column of meshrl.common.batch_schema"
                    problems.append(
                        Problem(f"config.{key} names an unknown column '{col}'", fix, n.node_id, f"config.{key}")
                    )
    if problems:
        return problems
    writes = node_outputs(wf.nodes)
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
        available = set().union(*(writes[a] for a in ancestors))
        for col in inputs:
            if col not in available:
                writers = [m.node_id for m in wf.nodes if col in writes[m.node_id]]
                silent = sorted(a for a in ancestors if not writes[a])
                if writers:
                    fix = f"add '{writers[0]}' to its dependencies"
                elif silent:
                    fix = f"declare config.outputs on '{silent[0]}' if it writes '{col}'"
                else:
                    fix = f"add a node that writes '{col}' upstream"
                problems.append(
                    Problem(f"reads column '{col}', which no upstream node writes", fix, n.node_id, "config.inputs")
                )
    return problems


# Node types whose executable_ref something runs: a COMPUTE node's function, a ROLLOUT node's environment class.
RUNS_EXECUTABLE = (NodeType.COMPUTE, NodeType.ROLLOUT)


def executable_problems(wf: Workflow, allowed: Sequence[str], import_them: bool) -> list[Problem]:
    problems = []
    for n in wf.nodes:
        if n.executable_ref is None or n.node_type not in RUNS_EXECUTABLE:
            continue
        problem = check_executable(n.executable_ref, allowed, n.node_id, import_module=import_them)
        if problem is not None:
            problems.append(problem)
    return problems
