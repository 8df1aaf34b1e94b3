"""Which data-plane columns each node of a workflow writes: its declared `outputs`, or what the built-in
behind it writes when it declares none. A node that reads a column no ancestor writes is refused at load
(`workflow.checks.column_problems`), and the step executor reads exactly the declared inputs from the
nearest ancestor that writes each one (`meshrl.scheduler.step.dag.columns`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from meshrl.common import batch_schema as S
from meshrl.scheduler.workflow import compute_catalog as cat
from meshrl.scheduler.workflow.model import Node, NodeRole, NodeType

# What a rollout adds to every sample row (besides the prompt columns it copies from its input).
GENERATED = (S.RESPONSE_IDS, S.ROLLOUT_LOGPROBS, S.RESPONSE_VERSIONS, S.GROUP_INDEX)
DATA_LOAD_OUTPUTS = (S.PROMPT_IDS, S.ANSWER, S.PROMPT_INDEX)
# What a ROLLOUT node with an environment writes: one row per episode (meshrl.scheduler.step.user.episodes).
EPISODE_OUTPUTS = (
    S.PROMPT_IDS,
    S.ANSWER,
    *GENERATED,
    S.LOSS_MASK,
    S.REWARDS,
    S.ACCURACY,
    S.EPISODE_TURNS,
    S.EPISODE_END,
)


def declared(node: Node, key: str) -> list[str] | None:
    """config.inputs / config.outputs as a list of names, None when absent or not a list of strings."""
    value = node.config.get(key)
    if isinstance(value, list) and all(isinstance(c, str) for c in value):
        return list(value)
    return None


def builtin_outputs(node: Node, upstream: frozenset[str]) -> frozenset[str]:
    """What the built-in behind `node` writes when it declares no outputs; `upstream`: what its ancestors
    write (a rollout copies its input columns, a row filter passes every column through)."""
    t, r = node.node_type, node.node_role
    if t == NodeType.DATA_LOAD:
        return frozenset(DATA_LOAD_OUTPUTS)
    if t == NodeType.ROLLOUT and node.executable_ref:
        return frozenset(EPISODE_OUTPUTS)
    if t == NodeType.ROLLOUT:
        inputs = declared(node, cat.CONFIG_INPUTS)
        return frozenset(inputs if inputs is not None else upstream) | frozenset(GENERATED)
    builtin_compute = t == NodeType.COMPUTE and (node.executable_ref is None or r == NodeRole.REWARD)
    if builtin_compute:
        if r == NodeRole.REWARD:
            return frozenset({S.REWARDS, S.ACCURACY})
        if r == NodeRole.ADVANTAGE:
            gae = node.config.get("estimator") == "gae"
            return frozenset({S.ADVANTAGES, S.RETURNS} if gae else {S.ADVANTAGES})
        if r == NodeRole.DYNAMIC_SAMPLING:
            return upstream
    if t == NodeType.MODEL_INFERENCE and r == NodeRole.REWARD:  # a reward model (step/scoring/reward_model.py)
        return frozenset({S.REWARDS, S.ACCURACY, S.RM_SCORES})
    if t == NodeType.MODEL_INFERENCE or t == NodeType.MODEL_TRAIN and node.only_forward_compute:
        if r == NodeRole.CRITIC:
            return frozenset({S.VALUES})
        default = S.OLD_LOGPROBS if r == NodeRole.ACTOR else S.REF_LOGPROBS
        name = node.config.get("output_name", default)
        return frozenset({name, S.ENTROPY} if r == NodeRole.ACTOR else {name})
    return frozenset()  # a user COMPUTE node declares what it writes; training and barriers write nothing


def node_outputs(nodes: Iterable[Node]) -> Mapping[str, frozenset[str]]:
    """{node_id: the columns it writes} (declared, else built-in), for the nodes of an acyclic workflow."""
    by_id = {n.node_id: n for n in nodes}
    parents = {nid: list(n.dependencies) for nid, n in by_id.items()}
    out: dict[str, frozenset[str]] = {}
    reach: dict[str, frozenset[str]] = {}  # a node's columns and every ancestor's

    def visit(nid: str) -> frozenset[str]:
        if nid not in reach:
            upstream = frozenset().union(*(visit(p) for p in parents[nid]))
            mine = declared(by_id[nid], cat.CONFIG_OUTPUTS)
            out[nid] = frozenset(mine) if mine is not None else builtin_outputs(by_id[nid], upstream)
            reach[nid] = out[nid] | upstream
        return reach[nid]

    for nid in by_id:
        visit(nid)
    return out
