"""The temperature a trainer call carries is its rows' sampling temperature (step/scoring/temperature.py): the rollout
node's own, else rollout.temperature, 1 for greedy rows, none without a rollout upstream; a call that would
read rows of two temperatures is refused when the job is created."""

from __future__ import annotations

import pytest
import yaml

from meshrl.common.errors import InvalidArgument
from meshrl.scheduler.step.scoring.temperature import check_temperatures, sampling_temperature


def _nodes(temperatures: dict[str, float | None]):
    from meshrl.scheduler.workflow import load_workflow_text

    nodes = [{"node_id": "data", "node_type": "DATA_LOAD", "node_role": "DATA"}]
    for rollout, temp in temperatures.items():
        config = {} if temp is None else {"temperature": temp}
        nodes.append(
            {
                "node_id": rollout,
                "node_type": "ROLLOUT",
                "node_role": "ROLLOUT",
                "dependencies": ["data"],
                "config": config,
            }
        )
    nodes.append(
        {"node_id": "old", "node_type": "MODEL_INFERENCE", "node_role": "ACTOR", "dependencies": list(temperatures)}
    )
    text = yaml.safe_dump({"dag_id": "t", "nodes": nodes})
    return load_workflow_text(text, {}).nodes


def test_a_trainer_call_carries_its_rollout_nodes_temperature():
    nodes = _nodes({"r": None})
    old = nodes[-1]
    assert sampling_temperature(old, nodes, 0.6) == 0.6  # rollout.temperature
    assert sampling_temperature(old, _nodes({"r": 0.8}), 0.6) == 0.8  # the node's own
    assert sampling_temperature(old, _nodes({"r": 0.0}), 0.6) == 1.0  # greedy: the raw logits' log-probs
    assert sampling_temperature(nodes[0], nodes, 0.6) is None  # no rollout upstream
    with pytest.raises(InvalidArgument, match="different temperatures"):
        check_temperatures(_nodes({"a": 0.6, "b": 1.0}), 0.6)
    check_temperatures(_nodes({"a": 0.6, "b": None}), 0.6)  # the same temperature twice
