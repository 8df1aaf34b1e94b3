"""A workflow node as the step executor sees it (the attributes it and `workflow.columns` read), for the tests that
build a step's DAG by hand (test_async_pipeline, test_async_alignment) instead of loading a workflow file."""

from __future__ import annotations

from dataclasses import dataclass, field

from meshrl.scheduler.workflow import NodeRole, NodeType


@dataclass
class Node:
    node_id: str
    node_type: NodeType
    node_role: NodeRole
    dependencies: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    executable_ref: str | None = None  # what workflow.columns reads to know each node's columns
    only_forward_compute: bool = False
