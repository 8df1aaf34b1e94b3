"""The trainer's model roles, named once: their names in config and workflows, and their proto enum
(`meshrl.trainer.v1.Role`). Used by the trainer's servicer, the scheduler's trainer client and its nodes.
"""

from __future__ import annotations

from meshrl.api.trainer.v1 import trainer_pb2 as tpb
from meshrl.common.errors import InvalidArgument

ROLES: tuple[str, ...] = ("actor", "reference", "critic", "reward")
_PROTO = {
    "actor": tpb.ROLE_ACTOR,
    "reference": tpb.ROLE_REFERENCE,
    "critic": tpb.ROLE_CRITIC,
    "reward": tpb.ROLE_REWARD,
}
_NAME = {v: k for k, v in _PROTO.items()}


def role_proto(name: str) -> int:
    """ "actor" -> ROLE_ACTOR; a workflow's node role ("ACTOR") is accepted too."""
    try:
        return _PROTO[name.lower()]
    except KeyError:
        raise InvalidArgument(f"role {name!r} is not one of {', '.join(ROLES)}") from None


def role_name(value: int, field: str = "role") -> str:
    """ROLE_ACTOR -> "actor"; anything else is refused with the field's name."""
    if value not in _NAME:
        raise InvalidArgument(
            f"{field} = {value} is not a role; use ROLE_ACTOR, ROLE_REFERENCE, ROLE_CRITIC or ROLE_REWARD"
        )
    return _NAME[value]
