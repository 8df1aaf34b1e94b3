"""The replica's use of the weight plane (`meshrl.common.weights`): read and verify a published version,
join the weight-update group and receive a version over it, hash the live tensors.

Owned by the engines: `TransformersEngine` receives straight into its parameters (in place, no
re-allocation); the SGLang / vLLM adapters (`relay.py`) receive tensors and hand the engine a folder.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from meshrl.common import weights as W
from meshrl.common.errors import FailedPrecondition, InvalidArgument, NotFound

NamedParams = Callable[[], Mapping[str, torch.Tensor]]


@dataclass
class Staged:
    """A complete, verified weight version held in memory, not yet applied."""

    version: int
    tensors: list[tuple[str, torch.Tensor]]
    seconds: float
    folder: str = ""  # where it was read from ("" when it came over the group)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for _, t in self.tensors)


def newest_version(path: str | Path) -> Path | None:
    """`path` itself when it is a version folder, else the newest complete version under it."""
    if (Path(path) / "manifest.json").is_file():
        return Path(path)
    versions = W.list_versions(str(path))
    return Path(versions[-1][1]) if versions else None


def manifest_version(folder: str | Path) -> int:
    return W.read_manifest(str(folder))[0].version


def read_disk(
    path: str, version: int, manifest_sha256: str = "", staging_dir: str = "", *, load: bool = True
) -> Staged:
    """Verifies a published version (manifest sha256, version, every file's checksums) and reads its
    tensors (CPU). `staging_dir`: copy it there first. `load=False` verifies without keeping tensors."""
    start = time.perf_counter()
    if staging_dir:
        path = W.stage_to_local(path, staging_dir, manifest_sha256 or None)
    reader = W.read_version(path, manifest_sha256 or None)
    if reader.version != version:
        raise InvalidArgument(f"{path} holds weight version {reader.version}, but version {version} was announced")
    if load:
        tensors = list(reader)  # checksums are verified while reading
    else:
        reader.verify_all()  # checked on the files' mappings: nothing is read into memory
        tensors = []
    return Staged(version, tensors, time.perf_counter() - start, str(path))


class _ExpectedVersion(W.InPlaceSink):
    """Receives into the live parameters, refusing a version other than the announced one."""

    def __init__(self, named_params: Mapping[str, torch.Tensor], current: int, expected: int) -> None:
        super().__init__(named_params, current)
        self.expected = expected

    def begin(self, version: int) -> None:
        if version != self.expected:
            raise InvalidArgument(f"the trainer sends weight version {version}, but {self.expected} was announced")
        super().begin(version)


def _same_tensors(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    """Whether two name -> tensor maps hold the very same tensor objects under the same names."""
    return a.keys() == b.keys() and all(a[name] is t for name, t in b.items())


class WeightReceiver:
    """Weight-plane membership of one engine. `named_params()`: HF name -> live tensor (no tied duplicates)."""

    def __init__(self, named_params: NamedParams, device: torch.device | str = "cpu") -> None:
        self.named_params = named_params
        self.device = torch.device(device)
        self._groups: dict[str, W.WeightGroup] = {}
        self._sinks: dict[str, _ExpectedVersion] = {}  # kept: a sink remembers its checks of unchanged buckets

    # --- collective -----------------------------------------------------------------------------
    def join_group(self, spec: W.GroupSpec) -> int:
        """Joins (blocking until every member joined); a group of the same name is replaced."""
        old = self._groups.pop(spec.group_name, None)
        self._sinks.pop(spec.group_name, None)
        if old is not None:
            old.destroy()
        device = self.device if spec.backend == "nccl" and self.device.type == "cuda" else None
        self._groups[spec.group_name] = W.WeightGroup.join(spec, device=device)
        return spec.rank_offset

    def group(self, name: str) -> W.WeightGroup:
        group = self._groups.get(name)
        if group is None:
            raise NotFound(
                f"no weight group {name!r} was joined (joined: {sorted(self._groups) or 'none'}); "
                "call InitWeightUpdateGroup first"
            )
        return group

    def receive_into_model(
        self, group_name: str, current: int, version: int, timeout_s: float, on_full: Callable[[], None]
    ) -> tuple[int, W.StagedDelta | None]:
        """Receives one version: a complete one straight into the parameters, after `on_full()` (the caller
        pauses generation there); a delta into host memory, checked against the live parameters and decoded
        (BaseMismatch when they are not its base's, reported to the trainer). Returns (bytes, None) for a
        complete version, (delta bytes, the staged delta for `apply_delta`) for a delta.

        On a failure after the first bucket of a complete version, part of the model may be new: the caller
        marks itself stale."""
        params = self.named_params()
        group = self.group(group_name)
        sink = self._sinks.get(group_name)
        if sink is None or not _same_tensors(sink.named_params, params):
            sink = self._sinks[group_name] = _ExpectedVersion(params, current, version)
        else:
            sink.version, sink.expected = current, version
        either = W.DeltaOrFullSink(sink, on_full)
        group.receive(either, timeout=timeout_s)
        if either.staged is not None:
            return either.staged.delta_bytes, either.staged
        return sum(t.numel() * t.element_size() for t in params.values()), None

    def receive_tensors(self, group_name: str, version: int, timeout_s: float) -> Staged:
        """Receives one version as copies (for engines that load a folder)."""
        start = time.perf_counter()
        received: list[tuple[str, torch.Tensor]] = []

        def keep(got: int, tensors: list[tuple[str, torch.Tensor]]) -> None:
            if got != version:
                raise InvalidArgument(f"the trainer sends weight version {got}, but {version} was announced")
            if any(name in W.DELTA_WIRE_NAMES for name, _ in tensors):
                raise W.BaseMismatch(f"weight version {version} came as a delta; this engine takes complete versions")
            received.extend((name, t.detach().to("cpu", copy=True)) for name, t in tensors)

        self.group(group_name).receive(keep, timeout=timeout_s)
        return Staged(version, received, time.perf_counter() - start)

    def leave_group(self, group_name: str) -> None:
        group = self._groups.pop(group_name, None)
        self._sinks.pop(group_name, None)
        if group is not None:
            group.destroy()

    def close(self) -> None:
        for name in list(self._groups):
            self.leave_group(name)

    # --- the live model -----------------------------------------------------------------------------
    def apply(self, tensors: Sequence[tuple[str, torch.Tensor]], current: int, version: int) -> int:
        """Copies a complete version into the parameters in place, all or nothing; returns the bytes."""
        W.apply_to_state(self.named_params(), tensors, current, version)
        return sum(t.numel() * t.element_size() for _, t in tensors)

    def checksums(self, names: Sequence[str] = ()) -> dict[str, str]:
        """sha256 per tensor (the weights library's definition) of `names`, or of its default sample."""
        params = self.named_params()
        if not params:
            raise FailedPrecondition("this engine holds no tensors to hash")
        return W.tensor_checksums(params, list(names) or None)
