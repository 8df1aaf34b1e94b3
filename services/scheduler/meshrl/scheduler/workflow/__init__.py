"""Workflow files: the typed model of a training step's DAG, its loader and validation, and the built-ins.

Public API (used by the job API, the step executor and `meshrl plan`):
    load_workflow(spec, config) / load_workflow_text(text, config) / load_workflow_file(path, config)
    load_builtin(name, config), builtin_names(), builtin_workflow_text(name)
    resolve_executable(ref, allowed_modules, node_id)
    Workflow, Node, NodeType, NodeRole, WorkflowError, Problem
"""

from meshrl.scheduler.workflow.builtin import builtin_names, builtin_workflow_text, load_builtin, load_workflow
from meshrl.scheduler.workflow.errors import Problem, WorkflowError
from meshrl.scheduler.workflow.executables import (
    ALLOWED_MODULES_ENV,
    DEFAULT_ALLOWED_MODULES,
    default_allowed_modules,
    resolve_executable,
)
from meshrl.scheduler.workflow.loader import load_workflow_data, load_workflow_file, load_workflow_text
from meshrl.scheduler.workflow.model import ENTRY_TYPES, ROLES_BY_TYPE, Node, NodeRole, NodeType, Workflow

__all__ = [
    "ALLOWED_MODULES_ENV",
    "DEFAULT_ALLOWED_MODULES",
    "ENTRY_TYPES",
    "ROLES_BY_TYPE",
    "Node",
    "NodeRole",
    "NodeType",
    "Problem",
    "Workflow",
    "WorkflowError",
    "builtin_names",
    "builtin_workflow_text",
    "default_allowed_modules",
    "load_builtin",
    "load_workflow",
    "load_workflow_data",
    "load_workflow_file",
    "load_workflow_text",
    "resolve_executable",
]
