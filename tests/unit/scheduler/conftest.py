"""Fixtures for the scheduler's workflow and planning tests: workflow builders (`kit`) and a user module.

Test modules here cannot import conftest (pytest runs with --import-mode=importlib), so the builders are
handed out by the `kit` fixture.
"""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from meshrl.scheduler.workflow import Workflow, WorkflowError, load_workflow_data, load_workflow_text


def _node(node_id: str, node_type: str, role: str | None = None, deps: tuple[str, ...] = (), **extra: Any) -> dict:
    out: dict[str, Any] = {"node_id": node_id, "node_type": node_type, "dependencies": list(deps)}
    if role is not None:
        out["node_role"] = role
    out.update(extra)
    return out


def _chain_nodes() -> list[dict]:
    """data -> rollout -> reward -> advantage -> train (a valid minimal step)."""
    return [
        _node("data", "DATA_LOAD", "DATA"),
        _node("rollout", "ROLLOUT", "ROLLOUT", ("data",)),
        _node("reward", "COMPUTE", "REWARD", ("rollout",)),
        _node("advantage", "COMPUTE", "ADVANTAGE", ("reward",)),
        _node("train", "MODEL_TRAIN", "ACTOR", ("advantage",)),
    ]


def _two_agent_nodes() -> list[dict]:
    """One data_load feeding two agents ("a", "b"), each rollout -> reward -> train."""
    nodes = [_node("data", "DATA_LOAD")]
    for agent in ("a", "b"):
        cfg = {"agent": agent}
        nodes += [
            _node(f"rollout_{agent}", "ROLLOUT", deps=("data",), config=cfg),
            _node(f"reward_{agent}", "COMPUTE", "REWARD", (f"rollout_{agent}",)),
            _node(f"train_{agent}", "MODEL_TRAIN", "ACTOR", (f"reward_{agent}",), config=cfg),
        ]
    return nodes


def _build(nodes: list[dict], **kwargs: Any) -> Workflow:
    return load_workflow_data({"dag_id": "t", "nodes": nodes}, **kwargs)


def _problems(nodes: list[dict] | None = None, *, text: str | None = None, **kwargs: Any) -> WorkflowError:
    with pytest.raises(WorkflowError) as info:
        if text is not None:
            load_workflow_text(textwrap.dedent(text), **kwargs)
        else:
            _build(nodes or [], **kwargs)
    return info.value


def _as_yaml(nodes: list[dict]) -> str:
    return yaml.safe_dump({"dag_id": "t", "nodes": nodes}, sort_keys=False)


@pytest.fixture
def kit() -> SimpleNamespace:
    return SimpleNamespace(
        node=_node, chain=_chain_nodes, two_agents=_two_agent_nodes, build=_build, problems=_problems, as_yaml=_as_yaml
    )


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> Iterator[Callable[[str], str]]:
    """Writes a uniquely named module (from the given source) on sys.path and returns its name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def make(source: str) -> str:
        name = f"mrl_user_{uuid.uuid4().hex[:10]}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        names.append(name)
        return name

    yield make
    for name in names:
        sys.modules.pop(name, None)
