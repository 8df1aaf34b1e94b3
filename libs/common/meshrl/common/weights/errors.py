"""Typed failures of a collective weight update, carrying what the scheduler needs to recover.

Raised by `WeightGroup.send` (trainer side). The scheduler reads `outcome` to take the
unresponsive or refusing members out: destroy the group, re-create one with the remaining
members (`GroupPlan.without`), redo the update for them, and mark the others stale until refitted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshrl.common.errors import DeadlineExceeded, FailedPrecondition


@dataclass(frozen=True)
class UpdateOutcome:
    """Where each receiver rank of the group stands after one update attempt.

    acked: ranks that applied the whole update and confirmed it.
    unresponsive: ranks that did not join, receive or confirm within the deadline.
    refused: rank -> the error it reported (bad version, unknown tensor, shape mismatch...).
    """

    version: int
    acked: tuple[int, ...] = ()
    unresponsive: tuple[int, ...] = ()
    refused: dict[int, str] = field(default_factory=dict)

    @property
    def failed(self) -> tuple[int, ...]:
        return tuple(sorted({*self.unresponsive, *self.refused}))


class MembersUnresponsive(DeadlineExceeded):
    """One or more members did not join, receive or confirm in time; the group is unusable now."""

    def __init__(self, message: str, outcome: UpdateOutcome) -> None:
        super().__init__(message)
        self.outcome = outcome


class UpdateRefused(FailedPrecondition):
    """Every member answered, but some refused the update (see `outcome.refused`).

    A member that refuses at the first bucket (lower version, unknown or mismatched tensor) has
    touched nothing; one that refuses later may hold part of the update. Either way the
    scheduler marks it stale until it is refitted.
    """

    def __init__(self, message: str, outcome: UpdateOutcome) -> None:
        super().__init__(message)
        self.outcome = outcome


class BaseMismatch(FailedPrecondition):
    """A replica was sent a delta against a version it does not hold (it missed that version, or its
    weights differ from it); nothing was changed. The scheduler refits it with a complete version."""
