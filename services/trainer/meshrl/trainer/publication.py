"""Publishing a role's weights: a versioned folder on disk, or a broadcast over a joined weight-update group
(meshrl's own, or the engines' wire), complete or as a delta against the version published last (the base
this trainer keeps a copy of). Rank 0's `TrainerService` owns one `WeightPublisher` and calls it under its
lock; the other ranks take part in each weight gather through `start_gather`. No gRPC imports.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from meshrl.api.common.v1 import weights_pb2
from meshrl.common.errors import FailedPrecondition, InvalidArgument, NotFound
from meshrl.common.weights import DeltaBase, WeightGroup, delta_update, write_delta, write_version
from meshrl.common.weights.delta import DEFAULT_MAX_FRACTION
from meshrl.common.weights.engine_group import EngineGroupSender, join_sender
from meshrl.trainer.config import TrainerConfig
from meshrl.trainer.core import TrainerCore

# Copied into every published version so engines can (re)load it as a Hugging Face model folder.
MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


@dataclasses.dataclass
class Published:
    version: int
    bytes: int
    buckets: int
    seconds: float
    checksums: dict[str, str]
    disk: weights_pb2.DiskWeights | None = None
    backend: str = ""  # of the weight group that carried it; "" for disk


class _Counter:
    """Passes buckets through, counting them and their tensor bytes."""

    def __init__(self, buckets: Iterable[list]) -> None:
        self._buckets = buckets
        self.buckets = 0
        self.bytes = 0

    def __iter__(self) -> Iterator[list]:
        for bucket in self._buckets:
            self.buckets += 1
            self.bytes += sum(t.numel() * t.element_size() for _, t in bucket)
            yield bucket


def _model_files(model_path: str) -> dict[str, bytes]:
    root = Path(model_path)
    return {name: (root / name).read_bytes() for name in MODEL_FILES if (root / name).is_file()}


class WeightPublisher:
    """The joined weight groups and the delta bases of one trainer (rank 0). `start_gather(role, passes)`:
    brings the other ranks into `passes` gathers of the role's weights (model parallelism)."""

    def __init__(self, cfg: TrainerConfig, core: TrainerCore, start_gather: Callable[[str, int], None]) -> None:
        self.cfg = cfg
        self.core = core
        self._start_gather = start_gather
        self.groups: dict[str, WeightGroup | EngineGroupSender] = {}
        self._bases: dict[str, DeltaBase] = {}  # role -> the version published last, while deltas are asked for

    def join_group(self, group: weights_pb2.CollectiveGroup) -> int:
        """Joins (as rank 0, hosting the rendezvous) a weight-update group of either protocol (meshrl's own,
        or the engines' wire for SGLang / vLLM workers); blocks until all members joined."""
        old = self.groups.pop(group.group_name, None)
        if old is not None:
            old.destroy()
        joined = join_sender(group)
        self.groups[group.group_name] = joined
        return joined.world_size

    def destroy_group(self, name: str) -> None:
        group = self.groups.pop(name, None)
        if group is not None:
            group.destroy()

    def publish(
        self,
        role: str,
        transport: str,
        version: int,
        *,
        disk_root: str = "",
        keep_last: int = 0,
        bucket_bytes: int = 0,
        group_name: str = "",
        delta: bool = False,
        max_delta_fraction: float = 0.0,
    ) -> Published:
        """Publishes the role's weights as `version`: a versioned folder under `disk_root`, or a broadcast
        over the joined group `group_name` (every receiver confirms, else MembersUnresponsive / UpdateRefused).
        `delta`: a delta (a folder, or over the group) against the version published last when this trainer
        holds it and the delta is at most `max_delta_fraction` (0: 0.5) of a complete version, else a complete
        version; either way a copy of the published version is kept as the next base. `bytes` in the result:
        those the delta carried, else the complete version's."""
        bucket_bytes = bucket_bytes or self.cfg.defaults.bucket_bytes
        state = self.core.role(role)
        if not 0 <= max_delta_fraction <= 1:
            raise InvalidArgument(f"max_delta_fraction must be in [0, 1] (0: 0.5), got {max_delta_fraction}")
        if transport == "disk" and not disk_root:
            raise FailedPrecondition("disk publication needs disk_root (the folder of versions)")
        if transport != "disk" and group_name not in self.groups:
            raise NotFound(f"no weight group {group_name!r} (joined: {sorted(self.groups)}); join it first")
        start = time.perf_counter()
        self._start_gather(role, 2)
        sums = self.core.checksums(role)
        buckets = self.core.iter_hf_buckets(role, bucket_bytes)
        counter = _Counter(buckets)
        disk, backend, sent = None, "", None
        try:
            if transport == "disk":
                disk = self._write_disk(
                    role,
                    version,
                    counter,
                    disk_root,
                    keep_last,
                    bucket_bytes,
                    delta,
                    max_delta_fraction or DEFAULT_MAX_FRACTION,
                )
            else:
                group = self.groups[group_name]
                sent = self._send_group(
                    role, version, counter, group, bucket_bytes, delta, max_delta_fraction or DEFAULT_MAX_FRACTION
                )
                backend = group.spec.backend
        finally:
            for _ in buckets:  # on failure: finish the gather, so the other ranks are not left waiting
                pass
        state.weight_version = version
        nbytes = counter.bytes if transport == "disk" or sent is None else sent
        return Published(version, nbytes, counter.buckets, time.perf_counter() - start, sums, disk, backend)

    def _send_group(
        self, role: str, version: int, export: Iterable, group, bucket_bytes: int, delta: bool, max_fraction: float
    ) -> int | None:
        """Broadcasts `version` over `group`: as a delta against the base both sides hold when `delta` is asked
        for, the group is meshrl's own and the delta is at most `max_fraction` of a complete version (returns
        the delta's bytes), else complete (returns None), keeping a copy as the next base when deltas are
        asked for. A delta refused by replicas that miss the base raises UpdateRefused; sending the same
        version again then goes complete (the base holds it), so the scheduler refits them over the group."""
        base = self._bases.get(role)
        if not delta or not isinstance(group, WeightGroup):  # the engines' own wire carries complete versions
            self._bases.pop(role, None)
        elif base is not None and base.tensors and base.version < version:
            wire, stats = delta_update(base, version, export, max_fraction)
            if wire is not None:
                group.send(wire, version, bucket_bytes=bucket_bytes)
                return stats.delta_bytes
            export = base.tensors.items()  # the delta would be too large: the base holds this version now
        elif base is None or not base.holds(version):
            base = self._bases[role] = DeltaBase()
            export = base.record(version, export)
        group.send(export, version, bucket_bytes=bucket_bytes)
        return None

    def _write_disk(
        self,
        role: str,
        version: int,
        export: Iterable,
        root: str,
        keep_last: int,
        bucket_bytes: int,
        delta: bool,
        max_fraction: float,
    ) -> weights_pb2.DiskWeights:
        base = self._bases.get(role)
        if not delta:
            if base is not None and not base.holds(version):  # a refit of the base's version keeps it
                self._bases.pop(role)
        elif base is not None and base.tensors and base.version < version:
            disk, _ = write_delta(root, version, base, export, keep_last, max_fraction=max_fraction)
            if disk is not None:
                return disk
            export = base.tensors.items()  # the delta would be too large: the base holds this version now
        else:
            base = self._bases[role] = DeltaBase()
            export = base.record(version, export)
        model_files = _model_files(self.core.role(role).model_path)
        pub = self.cfg.publication
        return write_version(
            root,
            version,
            export,
            keep_last,
            bucket_bytes=bucket_bytes,
            extra_files=model_files,
            overwrite=True,
            digest=pub.digest,
            fsync=pub.fsync,
        )
