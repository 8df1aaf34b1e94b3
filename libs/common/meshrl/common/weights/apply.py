"""In-place application of incoming weights to a live model: validate everything, then copy.

Called by the rollout engines (transformers engine: `dict(model.named_parameters())`) through
`loading.load_version` (disk) and `sink.InPlaceSink` (collective). Parameters are never
re-allocated (`copy_` under no_grad), so engine-held references and CUDA graphs stay valid.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

from meshrl.common.errors import InvalidArgument

MAX_LISTED = 8  # problems named in one error message


def check_version(current_version: int, new_version: int) -> None:
    """Refuses going back; re-applying the current version (a refit) is allowed."""
    if new_version < current_version:
        raise InvalidArgument(
            f"weight version {new_version} is older than the version {current_version} this replica serves; "
            "refused (publish a newer version, or refit the replica from the latest one)"
        )


def find_problems(
    named_params: Mapping[str, torch.Tensor],
    incoming: Iterable[tuple[str, torch.dtype, Sequence[int]]],
    already_seen: set[str] | None = None,
) -> tuple[list[str], set[str]]:
    """Checks (name, dtype, shape) triples against the parameters.

    Returns the problems found (unknown name, repeated name, dtype or shape mismatch) and the
    names seen, including `already_seen`.
    """
    problems: list[str] = []
    seen = set(already_seen or ())
    for name, dtype, shape in incoming:
        param = named_params.get(name)
        if param is None:
            problems.append(f"unknown tensor {name!r}")
        elif name in seen:
            problems.append(f"tensor {name!r} sent twice")
        elif param.dtype != dtype:
            problems.append(f"{name!r} has dtype {dtype} but the parameter is {param.dtype}")
        elif tuple(param.shape) != tuple(shape):
            problems.append(f"{name!r} has shape {list(shape)} but the parameter is {list(param.shape)}")
        seen.add(name)
    return problems, seen


def refuse(version: int, problems: Sequence[str], touched: bool = False) -> InvalidArgument:
    listed = "; ".join(problems[:MAX_LISTED])
    more = f" (and {len(problems) - MAX_LISTED} more)" if len(problems) > MAX_LISTED else ""
    state = "earlier buckets were already applied, refit this replica" if touched else "nothing was changed by it"
    return InvalidArgument(
        f"weight version {version} refused, {state}: {listed}{more}. "
        "The export and the replica's model must have the same HF names, dtypes and shapes"
    )


def missing_names(named_params: Mapping[str, torch.Tensor], seen: set[str]) -> list[str]:
    return sorted(set(named_params) - seen)


def apply_to_state(
    named_params: Mapping[str, torch.Tensor],
    incoming: Iterable[tuple[str, torch.Tensor]],
    current_version: int,
    new_version: int,
) -> int:
    """Copies a complete weight version into `named_params` in place; returns the number of tensors.

    All of `incoming` is taken (a disk reader verifies its checksums meanwhile) and checked
    before the first copy: a version older than `current_version`, an unknown, repeated or
    missing tensor, or a dtype or shape mismatch raises InvalidArgument (DataLoss comes from a
    corrupt file), and then no parameter has been touched.
    """
    check_version(current_version, new_version)
    tensors = list(incoming)
    problems, seen = find_problems(named_params, ((n, t.dtype, t.shape) for n, t in tensors))
    missing = missing_names(named_params, seen)
    if missing:
        problems.append(f"{len(missing)} parameter(s) missing from the update, e.g. {missing[:MAX_LISTED]}")
    if problems:
        raise refuse(new_version, problems)
    with torch.no_grad():
        for name, tensor in tensors:
            named_params[name].copy_(tensor)
    return len(tensors)
