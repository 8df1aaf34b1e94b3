"""A reward with a signal on a random tiny model, for tests that compare learning curves: the share of a
response's characters that are digits (it runs in the scheduler process; `job.allowed_modules` names
`tests.integration`)."""

from __future__ import annotations

from collections.abc import Sequence


def digit_share(prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]) -> list[float]:
    return [sum(c.isdigit() for c in r) / max(1, len(r)) for r in responses]
