"""The typed workflow: a training step as a DAG of typed nodes (siiRL's shape), as loaded from a YAML file.

Built by `meshrl.scheduler.workflow.loader`; read by the task graph, the planner and the step executor.
Field-level checks live here (types, names, unknown fields); graph-level checks (dependencies, cycles,
reachability, roles, executables) live in the loader so every problem can name its node and its fix.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import pydantic

NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_\-]*$"
# package.module:function (the function may be an attribute path such as Class.method)
EXECUTABLE_REF_PATTERN = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"


class NodeType(str, enum.Enum):
    """What kind of work a node is, and so which service runs it."""

    DATA_LOAD = "DATA_LOAD"  # the scheduler reads the next prompts
    ROLLOUT = "ROLLOUT"  # the rollout service generates responses
    MODEL_INFERENCE = "MODEL_INFERENCE"  # a trainer role runs a forward pass (log-probs, values)
    MODEL_TRAIN = "MODEL_TRAIN"  # a trainer role runs an optimizer step (or a forward pass if only_forward_compute)
    COMPUTE = "COMPUTE"  # a CPU function in the scheduler: built-in or `executable_ref`
    BARRIER_SYNC = "BARRIER_SYNC"  # waits for all its dependencies; no work of its own

    def __str__(self) -> str:
        return self.value


class NodeRole(str, enum.Enum):
    """Which model or algorithm component a node belongs to."""

    DATA = "DATA"
    ROLLOUT = "ROLLOUT"
    ACTOR = "ACTOR"
    REFERENCE = "REFERENCE"
    CRITIC = "CRITIC"
    REWARD = "REWARD"
    ADVANTAGE = "ADVANTAGE"
    DYNAMIC_SAMPLING = "DYNAMIC_SAMPLING"
    DEFAULT = "DEFAULT"

    def __str__(self) -> str:
        return self.value


# The roles each node type may take; the first one is the default when `node_role` is omitted and it is the
# only choice.
ROLES_BY_TYPE: Mapping[NodeType, tuple[NodeRole, ...]] = {
    NodeType.DATA_LOAD: (NodeRole.DATA,),
    NodeType.ROLLOUT: (NodeRole.ROLLOUT,),
    NodeType.MODEL_INFERENCE: (NodeRole.ACTOR, NodeRole.REFERENCE, NodeRole.CRITIC, NodeRole.REWARD),
    NodeType.MODEL_TRAIN: (NodeRole.ACTOR, NodeRole.CRITIC),
    NodeType.COMPUTE: (NodeRole.REWARD, NodeRole.ADVANTAGE, NodeRole.DYNAMIC_SAMPLING, NodeRole.DEFAULT),
    NodeType.BARRIER_SYNC: (NodeRole.DEFAULT,),
}

# A step starts at nodes of these types: they need no input from another node.
ENTRY_TYPES: frozenset[NodeType] = frozenset({NodeType.DATA_LOAD, NodeType.ROLLOUT})
MODEL_TYPES: frozenset[NodeType] = frozenset({NodeType.ROLLOUT, NodeType.MODEL_INFERENCE, NodeType.MODEL_TRAIN})


class Node(pydantic.BaseModel):
    """One node of the step DAG. `config` is free-form except for the keys documented in the loader."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, use_enum_values=False)

    node_id: str = pydantic.Field(pattern=NAME_PATTERN, description="unique name, e.g. actor_train")
    node_type: NodeType = pydantic.Field(description="one of " + ", ".join(t.value for t in NodeType))
    node_role: NodeRole = pydantic.Field(description="one of " + ", ".join(r.value for r in NodeRole))
    dependencies: tuple[str, ...] = pydantic.Field((), description="node_ids this node reads from")
    only_forward_compute: pydantic.StrictBool = pydantic.Field(
        False, description="MODEL_TRAIN only: run the forward pass, no optimizer step"
    )
    config: dict[str, Any] = pydantic.Field(default_factory=dict, description="node settings (free mapping)")
    executable_ref: str | None = pydantic.Field(
        None, pattern=EXECUTABLE_REF_PATTERN, description="COMPUTE only: package.module:function"
    )

    @pydantic.model_validator(mode="before")
    @classmethod
    def _default_role(cls, data: Any) -> Any:
        """A node whose type allows a single role may omit `node_role`."""
        if isinstance(data, dict) and "node_role" not in data:
            try:
                roles = ROLES_BY_TYPE[NodeType(data.get("node_type"))]
            except (ValueError, KeyError):
                return data
            if len(roles) == 1:
                return {**data, "node_role": roles[0]}
        return data

    @property
    def is_model_node(self) -> bool:
        """True when the node runs on a model's workers (rollout engines or a trainer role)."""
        return self.node_type in MODEL_TYPES

    @property
    def is_forward_only(self) -> bool:
        return self.node_type == NodeType.MODEL_INFERENCE or (
            self.node_type == NodeType.MODEL_TRAIN and self.only_forward_compute
        )

    @property
    def agent(self) -> str | None:
        """`config.agent` names the model family in multi-agent workflows (default: one agent)."""
        value = self.config.get("agent")
        return value if isinstance(value, str) and value else None

    @property
    def model_key(self) -> str | None:
        """The model instance this node runs on: 'rollout', 'actor', 'reference', 'critic', 'reward'
        (prefixed 'AGENT.' when `config.agent` is set), or None for nodes that need no model."""
        if not self.is_model_node:
            return None
        base = self.node_role.value.lower()
        return f"{self.agent}.{base}" if self.agent else base


class Workflow(pydantic.BaseModel):
    """A validated workflow: `nodes` keep the file's order (used to break ties deterministically)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    dag_id: str = pydantic.Field(pattern=NAME_PATTERN, description="the workflow's name, e.g. grpo")
    description: str = pydantic.Field("", description="free text")
    nodes: tuple[Node, ...] = pydantic.Field(min_length=1, description="the list of nodes")

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(n.node_id for n in self.nodes)

    def node(self, node_id: str) -> Node:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(f"workflow '{self.dag_id}' has no node '{node_id}' (nodes: {', '.join(self.node_ids)})")
