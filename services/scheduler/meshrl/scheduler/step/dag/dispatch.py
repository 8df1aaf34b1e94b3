"""What a job can run: the dispatch table from (node type, node role) to the step handler that runs it, the
node-config keys each handler reads, and the check that refuses, when a job is created, a workflow that
declares something no handler would honour (instead of ignoring it or failing at step 1).

The workflow validator (`meshrl.scheduler.workflow`) accepts every (type, role) that `meshrl plan` can place;
this table must cover all of them but the plan-only ones below, and `check_dispatch_table` proves it.
Read by `NodeHandlers` (step/dag/nodes.py) and `JobManager.create`.
"""

from __future__ import annotations

from collections.abc import Mapping

from meshrl.common.errors import Internal
from meshrl.common.suggest import did_you_mean
from meshrl.scheduler.step.dag.agents import agent_problems
from meshrl.scheduler.step.scoring.reward_model import REWARD_MODEL_KEYS, reward_model_problems
from meshrl.scheduler.step.user.episodes import EPISODE_KEYS
from meshrl.scheduler.workflow import ROLES_BY_TYPE, NodeRole, NodeType, Problem, Workflow, WorkflowError
from meshrl.scheduler.workflow import compute_catalog as cat

T, R = NodeType, NodeRole

# (node type, node role) -> NodeHandlers method. A COMPUTE node with executable_ref (other than a REWARD
# node, whose ref replaces the reward function) runs `user_compute`.
DISPATCH: Mapping[tuple[NodeType, NodeRole], str] = {
    (T.DATA_LOAD, R.DATA): "data_load",
    (T.ROLLOUT, R.ROLLOUT): "rollout",
    (T.MODEL_INFERENCE, R.ACTOR): "inference",
    (T.MODEL_INFERENCE, R.REFERENCE): "inference",
    (T.MODEL_INFERENCE, R.CRITIC): "inference",
    (T.MODEL_INFERENCE, R.REWARD): "reward_model",
    (T.MODEL_TRAIN, R.ACTOR): "train",
    (T.MODEL_TRAIN, R.CRITIC): "train",
    (T.COMPUTE, R.REWARD): "reward",
    (T.COMPUTE, R.ADVANTAGE): "advantage",
    (T.COMPUTE, R.DYNAMIC_SAMPLING): "dynamic_sampling",
    (T.COMPUTE, R.DEFAULT): "user_compute",
    (T.BARRIER_SYNC, R.DEFAULT): "barrier",
}

# What `meshrl plan` places but no job runs yet, and what to write instead.
PLAN_ONLY: Mapping[tuple[NodeType, NodeRole], str] = {}

# The node-config keys each handler reads (besides the declarations every node may carry). A user COMPUTE
# node (executable_ref) receives its whole config, so any key is its own.
_DECLARED = {cat.CONFIG_INPUTS, cat.CONFIG_OUTPUTS, cat.CONFIG_PARAM_COUNT, cat.CONFIG_TP, cat.CONFIG_PP}
CONFIG_KEYS: Mapping[str, frozenset[str]] = {
    "data_load": frozenset({"prompts_per_step"}),
    "rollout": frozenset({"n", "temperature", "top_p", "max_tokens", *EPISODE_KEYS}),
    "inference": frozenset({"output_name"}),
    "train": frozenset(),
    "reward": frozenset(),
    "reward_model": REWARD_MODEL_KEYS,
    "advantage": frozenset({"estimator"}),
    "dynamic_sampling": frozenset(),
    "barrier": frozenset(),
}


def check_dispatch_table() -> None:
    """The dispatch table and the validator's table agree: every (type, role) a workflow may declare runs,
    or is plan-only with a reason."""
    declared = {(t, r) for t, roles in ROLES_BY_TYPE.items() for r in roles}
    if set(DISPATCH) | set(PLAN_ONLY) != declared or set(DISPATCH) & set(PLAN_ONLY):
        missing = sorted(f"{t.value}/{r.value}" for t, r in declared - set(DISPATCH) - set(PLAN_ONLY))
        raise Internal(f"the step dispatch table and ROLES_BY_TYPE disagree (no handler for: {missing})")


def handler_name(node) -> str:
    if node.node_type == T.COMPUTE and node.executable_ref and node.node_role != R.REWARD:
        return "user_compute"
    if node.node_type == T.MODEL_TRAIN and node.only_forward_compute:
        return "inference"  # a forward pass of the role, no optimizer step
    return DISPATCH[(node.node_type, node.node_role)]


def runnable_problems(wf: Workflow) -> list[Problem]:
    """What in a valid workflow a job would not honour: plan-only nodes, config keys that no handler reads,
    reward-model and multi-agent nodes it cannot run (step/scoring/reward_model.py, step/dag/agents.py)."""
    problems: list[Problem] = []
    for n in wf.nodes:
        pair = (n.node_type, n.node_role)
        if pair in PLAN_ONLY:
            problems.append(
                Problem(
                    f"{n.node_type.value} with role {n.node_role.value} is plan-only",
                    PLAN_ONLY[pair],
                    n.node_id,
                    "node_role",
                )
            )
            continue
        name = handler_name(n)
        if name == "user_compute":
            continue
        known = CONFIG_KEYS[name] | _DECLARED
        if name == "rollout" and not n.executable_ref:
            for key in EPISODE_KEYS:
                if key in n.config:
                    problems.append(
                        Problem(
                            f"config.{key} limits multi-turn episodes, but this ROLLOUT node names no environment",
                            f"set executable_ref: package.module:EnvClass, or remove config.{key}",
                            n.node_id,
                            f"config.{key}",
                        )
                    )
        for key in n.config:
            if key not in known and key != cat.CONFIG_AGENT:
                fix = did_you_mean(key, sorted(known), f"remove it; a {n.node_type.value} node reads {sorted(known)}")
                problems.append(
                    Problem(f"config.{key} is read by nothing that runs this node", fix, n.node_id, f"config.{key}")
                )
    return problems + reward_model_problems(wf.nodes) + agent_problems(wf.nodes)


def check_runnable(wf: Workflow) -> None:
    """Refuses (WorkflowError, INVALID_ARGUMENT) a workflow a job cannot run as written."""
    problems = runnable_problems(wf)
    if problems:
        raise WorkflowError(problems, source=f"workflow '{wf.dag_id}'")
