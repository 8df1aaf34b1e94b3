"""Which samples of a batch may share one server request: the samples of one prompt with the same sampling
settings go as one request that asks for n samples (vLLM's `n`), so the server parses, schedules and streams one
request instead of n. On an engine that honours seeds, sample k of such a request is seeded with the first
sample's seed + k (vLLM's rule for the children of a request), so only samples whose seeds run on that way join.
"""

from __future__ import annotations

from collections.abc import Sequence

from meshrl.rollout.types import GenerationRequest


def sample_groups(requests: Sequence[GenerationRequest], *, seeds_sent: bool, limit: int) -> list[list[int]]:
    """The indices of `requests` in groups of at most `limit` that one request can serve, in order of first
    appearance; a request that joins no other (a greedy one never does) is a group of one. `seeds_sent`: the engine honours seeds, so a
    group's seeds must be consecutive (or all unset)."""
    groups: list[list[int]] = []
    open_group: dict[tuple, list[int]] = {}
    for i, request in enumerate(requests):
        sampling = request.sampling
        key = (tuple(int(t) for t in request.prompt_ids), sampling.with_seed(None))
        group = open_group.get(key) if sampling.temperature > 0 else None  # vLLM refuses n > 1 when greedy
        if group is not None and len(group) < limit and _seed_follows(requests, group, sampling.seed, seeds_sent):
            group.append(i)
            continue
        group = [i]
        groups.append(group)
        open_group[key] = group
    return groups


def _seed_follows(requests: Sequence[GenerationRequest], group: list[int], seed: int | None, seeds_sent: bool) -> bool:
    if not seeds_sent:
        return True
    first = requests[group[0]].sampling.seed
    if first is None or seed is None:
        return first is None and seed is None
    return seed == first + len(group)
