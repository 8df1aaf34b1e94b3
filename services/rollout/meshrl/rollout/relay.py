"""Weight updates for engines that run in their own server (SGLang, vLLM): the adapter verifies a
published folder (or receives a version over the weight group as its one rank, then writes it as a
local folder) and the engine loads that folder through its own API (`load_folder`).

Mixed into `SGLangEngine` and `VLLMEngine`. Checksums are those of the tensors last handed to the
engine (the verified folder), under HF names — the engine's own fused parameters have other names.
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

from meshrl.common import weights as W
from meshrl.common.errors import FailedPrecondition
from meshrl.rollout.types import PauseMode, WeightUpdateResult
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

    @abc.abstractmethod
    def load_folder(self, folder: str, version: int, pause_mode: PauseMode, flush_cache: bool) -> None:
        """The engine loads a verified HF weight folder as `version` (pausing around it)."""

    def update_weights_from_disk(
        self,
        path: str,
        version: int,
        *,
        manifest_sha256: str = "",
        staging_dir: str = "",
        pause_mode: PauseMode = PauseMode.IN_PLACE,
        flush_cache: bool = True,
    ) -> WeightUpdateResult:
        with self._relay_lock:
            staged = read_disk(path, version, manifest_sha256, staging_dir, load=False)
            start = time.perf_counter()
            self.load_folder(staged.folder, version, pause_mode, flush_cache)
            self._loaded_folder = staged.folder
            nbytes = sum(p.stat().st_size for p in Path(staged.folder).glob("*.safetensors"))
            return WeightUpdateResult(version, staged.seconds + time.perf_counter() - start, nbytes)

    def init_weight_update_group(self, group: W.GroupSpec) -> int:
        return self._relay_receiver.join_group(group)

    def update_weights_from_distributed(
        self,
        group_name: str,
        version: int,
        *,
        pause_mode: PauseMode = PauseMode.IN_PLACE,
        flush_cache: bool = True,
        timeout_seconds: float = 120.0,
    ) -> WeightUpdateResult:
        with self._relay_lock:
            staged = self._relay_receiver.receive_tensors(group_name, version, timeout_seconds)
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
            previous, self._loaded_folder = self._loaded_folder, str(folder)
            if previous.startswith(str(self._relay_dir)) and previous != str(folder):
                shutil.rmtree(previous, ignore_errors=True)
            return WeightUpdateResult(version, staged.seconds + time.perf_counter() - start, staged.nbytes)

    def destroy_weight_update_group(self, group_name: str) -> None:
        self._relay_receiver.leave_group(group_name)

    def weight_checksums(self, names: Sequence[str] = ()) -> tuple[int, dict[str, str]]:
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
        self._relay_receiver.close()
        shutil.rmtree(self._relay_dir, ignore_errors=True)


def _tensor_files(folder: Path) -> dict[str, str]:
    """{tensor name: file} of a folder's safetensors files."""
    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            out.update({name: path.name for name in f.keys()})
    return out
