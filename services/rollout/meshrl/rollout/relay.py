"""Weight updates for engines that run in their own server (SGLang, vLLM), three ways:
- disk: the adapter verifies a published folder and the engine loads it (`load_folder`);
- native (a group of protocol "engine"): the engine's workers join the trainer's group themselves and
  receive each bucket straight into their live weights; the adapter reads each bucket's specs from the
  group's store (`EngineGroupReader`) and drives the engine's own update calls (`native_*` hooks);
- relay (a group of protocol "meshrl"): the adapter receives the version as its one rank, writes a
  local folder and the engine loads that.

Mixed into `SGLangEngine` and `VLLMEngine`. Checksums: after a native update, read back from the
engine's live weights (`native_checksums`); after a folder load, those of the folder handed to it.
"""

from __future__ import annotations

import abc
import shutil
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

from meshrl.api.common.v1 import weights_pb2
from meshrl.common import weights as W
from meshrl.common.errors import FailedPrecondition, InvalidArgument, MeshrlError
from meshrl.common.weights.engine_group import EngineGroupReader
from meshrl.rollout.types import DiskUpdate, GroupUpdate, PauseMode, WeightUpdateResult
from meshrl.rollout.weight_receiver import (
    WeightReceiver,
    read_disk,
)

MODEL_FILES = ("config.json", "generation_config.json")


class WeightRelay(abc.ABC):
    def __init__(self, model_path: str) -> None:
        self._relay_model_path = model_path
        self._relay_lock = threading.Lock()
        self._relay_receiver = WeightReceiver(dict)  # only its group membership is used here
        self._relay_dir = Path(
            tempfile.mkdtemp(prefix="meshrl-weights-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None)
        )
        self._loaded_folder: str = ""
        self._native: dict[str, EngineGroupReader] = {}
        self._native_specs: dict[str, weights_pb2.TensorSpec] = {}  # HF name -> spec, of the last native update

    @abc.abstractmethod
    def load_folder(self, folder: str, version: int, pause_mode: PauseMode, flush_cache: bool) -> None:
        """The engine loads a verified HF weight folder as `version` (pausing around it)."""

    # --- the engine's own distributed update (protocol "engine") ------------------------------------
    @abc.abstractmethod
    def native_join(self, group: W.GroupSpec) -> None:
        """The engine's workers join the trainer's group (ranks rank_offset ..); blocks until it is complete."""

    @abc.abstractmethod
    def native_bucket(self, group_name: str, meta: weights_pb2.WeightBucketMeta, version: int) -> None:
        """The engine receives one bucket (names, dtypes, shapes in broadcast order) into its live weights."""

    @abc.abstractmethod
    def native_finish(self, version: int, flush_cache: bool) -> None:
        """After the last bucket: post-processing, flush (by policy), and the engine's version read back."""

    @abc.abstractmethod
    def native_leave(self, group_name: str) -> None: ...

    def native_begin(self, version: int) -> None:  # noqa: B027 - optional hook
        """Before the first bucket of `version` (an engine that keeps per-update state resets it)."""

    def native_failed(self, error: BaseException) -> None:  # noqa: B027 - optional hook
        """After a failed update, before generation continues (e.g. drop requests paused on torn weights)."""

    @abc.abstractmethod
    def native_checksums(self, specs: Sequence[weights_pb2.TensorSpec]) -> dict[str, str]:
        """sha256 (the weights library's definition) of these tensors as the engine holds them now."""

    def update_weights_from_disk(self, update: DiskUpdate) -> WeightUpdateResult:
        version = update.version
        with self._relay_lock:
            staged = read_disk(update.path, version, update.manifest_sha256, update.staging_dir, load=False)
            start = time.perf_counter()
            self.load_folder(staged.folder, version, update.pause_mode, update.flush_cache)
            self._loaded_folder, self._native_specs = staged.folder, {}
            nbytes = sum(p.stat().st_size for p in Path(staged.folder).glob("*.safetensors"))
            return WeightUpdateResult(version, staged.seconds + time.perf_counter() - start, nbytes)

    def init_weight_update_group(self, group: W.GroupSpec) -> int:
        if group.protocol != "engine":
            return self._relay_receiver.join_group(group)
        ranks = self.weight_ranks
        dp = self.section.data_parallel_size
        if dp != 1:
            raise InvalidArgument(
                f"{self.name}.data_parallel_size = {dp}: the engine's weight-group ranks ignore its data-parallel "
                "rank; use 1 and one replica per data-parallel copy"
            )
        if group.rank_offset + ranks > group.world_size:
            raise InvalidArgument(
                f"{group.group_name}: this engine holds {ranks} ranks from offset {group.rank_offset}, "
                f"beyond the group's world size {group.world_size}"
            )
        self.native_leave_quietly(group.group_name)
        reader = EngineGroupReader(group, ranks)
        self.native_join(group)
        self._native[group.group_name] = reader
        return group.rank_offset

    def native_leave_quietly(self, group_name: str) -> None:
        if self._native.pop(group_name, None) is not None:
            try:
                self.native_leave(group_name)
            except MeshrlError:
                pass  # the engine dropped it already

    def update_weights_from_distributed(self, update: GroupUpdate) -> WeightUpdateResult:
        group_name, version, pause_mode, flush_cache = (
            update.group_name,
            update.version,
            update.pause_mode,
            update.flush_cache,
        )
        if group_name in self._native:
            return self._native_update(group_name, version, pause_mode, flush_cache, update.timeout_seconds)
        with self._relay_lock:
            staged = self._relay_receiver.receive_tensors(group_name, version, update.timeout_seconds)
            start = time.perf_counter()
            folder = self._relay_dir / f"v{version:06d}"
            if folder.exists():
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
            save_file({n: t.detach().cpu().contiguous() for n, t in staged.tensors}, folder / "model.safetensors")
            for name in MODEL_FILES:
                src = Path(self._relay_model_path) / name
                if src.is_file():
                    shutil.copy2(src, folder / name)
            self.load_folder(str(folder), version, pause_mode, flush_cache)
            previous, self._loaded_folder, self._native_specs = self._loaded_folder, str(folder), {}
            if previous.startswith(str(self._relay_dir)) and previous != str(folder):
                shutil.rmtree(previous, ignore_errors=True)
            return WeightUpdateResult(version, staged.seconds + time.perf_counter() - start, staged.nbytes)

    def _native_update(
        self, group_name: str, version: int, pause_mode: PauseMode, flush_cache: bool, timeout_s: float
    ) -> WeightUpdateResult:
        """Pauses, has the engine receive every bucket the trainer announces, confirms to the trainer."""
        reader = self._native[group_name]
        with self._relay_lock:
            start = time.perf_counter()
            self.pause(pause_mode, reason="weights")
            specs: dict[str, weights_pb2.TensorSpec] = {}
            try:
                error: Exception | None = None
                try:
                    self.native_begin(version)
                    for meta in reader.buckets(version, timeout_s):
                        self.native_bucket(group_name, meta, version)
                        specs.update((t.name, t) for t in meta.tensors)
                    self.native_finish(version, flush_cache)
                except MeshrlError as exc:
                    error = exc
                reader.confirm(error)
                if error is not None:
                    self.native_failed(error)
                    raise error
                self._version = version
                self._native_specs, self._loaded_folder = specs, ""
            finally:
                self.continue_generation(reason="weights")
            nbytes = sum(t.nbytes for t in specs.values())
            return WeightUpdateResult(version, time.perf_counter() - start, nbytes)

    def destroy_weight_update_group(self, group_name: str) -> None:
        self.native_leave_quietly(group_name)
        self._relay_receiver.leave_group(group_name)

    def weight_checksums(self, names: Sequence[str] = ()) -> tuple[int, dict[str, str]]:
        if self._native_specs:
            wanted = list(names) or W.sample_names(self._native_specs)
            unknown = [n for n in wanted if n not in self._native_specs]
            if unknown:
                raise InvalidArgument(f"the last update carried no tensors named {unknown[:5]}")
            return self.weight_version, self.native_checksums([self._native_specs[n] for n in wanted])
        folder = self._loaded_folder
        if not folder:
            raise FailedPrecondition(
                f"{getattr(self, 'name', 'engine')} reports checksums of the weights the replica handed it; "
                "none were loaded since start (it serves the model folder's weights)"
            )
        files = _tensor_files(Path(folder))
        wanted = list(names) or W.sample_names(files)
        tensors = {}
        for name in wanted:
            if name in files:
                with safe_open(str(Path(folder) / files[name]), framework="pt") as f:
                    tensors[name] = f.get_tensor(name)
        return getattr(self, "weight_version", 0), W.tensor_checksums(tensors, wanted)

    def close_relay(self) -> None:
        for name in list(self._native):
            self.native_leave_quietly(name)
        self._relay_receiver.close()
        shutil.rmtree(self._relay_dir, ignore_errors=True)


def group_request(group: W.GroupSpec) -> dict:
    """The group as the engines' join calls take it (SGLang's /init_weights_update_group body)."""
    return {
        "master_address": group.master_address,
        "master_port": group.master_port,
        "rank_offset": group.rank_offset,
        "world_size": group.world_size,
        "group_name": group.group_name,
        "backend": group.backend,
    }


def _tensor_files(folder: Path) -> dict[str, str]:
    """{tensor name: file} of a folder's safetensors files."""
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            out.update({name: path.name for name in f.keys()})
    return out
