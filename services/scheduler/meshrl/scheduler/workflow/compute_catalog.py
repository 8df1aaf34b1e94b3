"""The built-in COMPUTE functions a workflow can select by name, and the node-config keys the planner reads.

This is a contract between workflow files and the step executor: a COMPUTE node without `executable_ref`
selects a built-in with one config key (below), and the executor implements every name listed here. The
loader checks the selection at load time so a typo fails before a job starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from meshrl.common import batch_schema
from meshrl.scheduler.workflow.model import NodeRole


@dataclass(frozen=True)
class BuiltinChoice:
    """A COMPUTE role's built-in functions. When `key` is set, `config[key]` picks one of `names` (when absent,
    the job config's choice: algorithm.advantage for advantages); when `key` is None the role has one built-in
    behaviour whose variant the job config chooses (algorithm.reward for rewards)."""

    key: str | None
    names: tuple[str, ...]


BUILTIN_COMPUTE: Mapping[NodeRole, BuiltinChoice] = {
    # rewards: the job config's `algorithm.reward` (exact_match, math_verify, format_boxed or
    # package.module:function); a REWARD node's own `executable_ref` overrides it
    NodeRole.REWARD: BuiltinChoice(None, ("exact_match", "math_verify", "format_boxed")),
    # advantages: GRPO group normalisation with / without the std, RLOO leave-one-out, REINFORCE++ with a
    # KL penalty, GAE over the critic's values
    NodeRole.ADVANTAGE: BuiltinChoice("estimator", ("grpo", "grpo_no_std", "rloo", "reinforce_pp", "gae")),
    # DAPO: keep the groups whose rewards are not all equal; rewrites every row downstream reads
    NodeRole.DYNAMIC_SAMPLING: BuiltinChoice(None, ("nonzero_reward_std",)),
}

# Node-config keys with a meaning outside the node itself (read by the loader and the planner).
CONFIG_INPUTS = "inputs"  # list of batch_schema columns the node reads (written by an upstream node)
CONFIG_OUTPUTS = "outputs"  # list of batch_schema columns the node writes
CONFIG_AGENT = "agent"  # model family in multi-agent workflows; see Node.model_key
CONFIG_PARAM_COUNT = "param_count"  # parameters of the node's model (int or "7B", "500M")
CONFIG_TP = "tensor_parallel_size"  # devices per model replica (rollout engines, trainer TP)
CONFIG_PP = "pipeline_parallel_size"  # trainer pipeline stages


def known_columns() -> frozenset[str]:
    """Every data-plane column name declared in meshrl.common.batch_schema."""
    return frozenset(value for name, value in vars(batch_schema).items() if name.isupper() and isinstance(value, str))


_UNITS = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parse_param_count(value: object) -> int:
    """7000000, 7e9, "7B", "1.5B", "500M", "100K" -> a positive number of parameters.

    Raises ValueError saying what was wrong.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is a boolean, not a parameter count")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        text = value.strip().upper().replace("_", "")
        scale = 1
        if text and text[-1] in _UNITS:
            scale = _UNITS[text[-1]]
            text = text[:-1]
        try:
            number = float(text) * scale
        except ValueError:
            raise ValueError(f"{value!r} is not a number like 7B, 500M or 7000000") from None
    else:
        raise ValueError(f"{value!r} is not a number like 7B, 500M or 7000000")
    if not number > 0 or number != number or number == float("inf"):
        raise ValueError(f"{value!r} must be a positive finite number of parameters")
    return max(1, round(number))
