"""Runs inside vLLM's workers (`--worker-extension-cls meshrl.rollout.vllm_worker.MeshrlWorkerExtension`):
loads weights into the live model through the model's own `load_weights` (which maps HF names onto
vLLM's fused parameters): a verified Hugging Face folder, or buckets received over the trainer's weight
group (each worker one rank; `process_weights_after_loading` after the last), and hashes live weights.

Called by `VLLMEngine` through POST /collective_rpc (VLLM_SERVER_DEV_MODE=1); arguments arrive as
JSON strings. The folder was verified by the replica (manifest and checksums) before this call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import torch
from safetensors import safe_open


def iter_folder_tensors(folder: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) of every safetensors file of a folder, file by file."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no .safetensors files")
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


class MeshrlWorkerExtension:
    """Mixed into vLLM's worker class; `self.model_runner` is the worker's model runner."""

    def meshrl_load_folder(self, folder_json: str) -> int:
        folder = json.loads(folder_json)
        model = self.model_runner.model  # type: ignore[attr-defined]
        loaded = model.load_weights(weights=iter_folder_tensors(folder))
        return len(loaded) if loaded is not None else 0

    # --- native weight updates: this worker is one rank of the trainer's weight group ---------------
    def meshrl_join_group(self, group_json: str) -> int:
        """Joins the group as rank rank_offset + this worker's rank (engine_group.py builds it the way
        the engines do, standalone next to vLLM's own groups); blocks until every rank joined."""
        from meshrl.common.weights.engine_group import engine_process_group

        g = json.loads(group_json)
        rank = int(g["rank_offset"]) + int(getattr(self, "rank", 0))
        store = torch.distributed.TCPStore(
            g["master_address"], int(g["master_port"]), int(g["world_size"]), False,
            timedelta(seconds=float(g["timeout_s"])),
        )  # fmt: skip
        groups = self.__dict__.setdefault("_meshrl_groups", {})
        groups[g["group_name"]] = (
            engine_process_group(g["backend"], store, rank, int(g["world_size"]), g["group_name"], g["timeout_s"]),
            store,
            float(g["timeout_s"]),
        )
        return rank

    def meshrl_receive_bucket(self, group_name_json: str, names_json: str, dtypes_json: str, shapes_json: str) -> int:
        """Receives one bucket (one broadcast per tensor, list order) and loads it in place."""
        from meshrl.common.weights.engine_group import broadcast_all
        from meshrl.common.weights.transport import Deadline

        pg, _, timeout_s = self._meshrl_groups[json.loads(group_name_json)]
        names, dtypes, shapes = json.loads(names_json), json.loads(dtypes_json), json.loads(shapes_json)
        device = next(self.model_runner.model.parameters()).device  # type: ignore[attr-defined]
        tensors = [torch.empty(s, dtype=getattr(torch, d), device=device) for d, s in zip(dtypes, shapes)]
        broadcast_all(pg, tensors, Deadline(timeout_s, f"bucket of {len(names)} tensors"))
        self.model_runner.model.load_weights(weights=list(zip(names, tensors)))  # type: ignore[attr-defined]
        self.__dict__.setdefault("_meshrl_shapes", {}).update(zip(names, (tuple(s) for s in shapes)))
        return len(names)

    def meshrl_finish_update(self, version_json: str) -> int:
        """After the last bucket: the model's post-load step (quantization, fused layouts), then the version."""
        self._meshrl_process_weights_after_loading()
        self._meshrl_version = int(json.loads(version_json))
        return self._meshrl_version

    def _meshrl_process_weights_after_loading(self) -> None:
        from vllm.model_executor.model_loader.utils import process_weights_after_loading

        runner = self.model_runner  # type: ignore[attr-defined]
        process_weights_after_loading(runner.model, runner.model_config, runner.device)

    def meshrl_weight_version(self) -> int:
        return int(getattr(self, "_meshrl_version", 0))

    def meshrl_leave_group(self, group_name_json: str) -> bool:
        return self.__dict__.get("_meshrl_groups", {}).pop(json.loads(group_name_json), None) is not None

    def meshrl_checksums(self, names_json: str, dtypes_json: str) -> dict[str, str]:
        """sha256 of HF-named tensors read from the live (possibly fused) parameters, in the sent dtypes."""
        from meshrl.common.weights import tensor_checksums

        params = dict(self.model_runner.model.named_parameters())  # type: ignore[attr-defined]
        shapes = self.__dict__.get("_meshrl_shapes", {})
        out = {}
        for name, dtype in zip(json.loads(names_json), json.loads(dtypes_json)):
            t = live_hf_tensor(params, shapes, name)
            out[name] = tensor_checksums({name: t.to(getattr(torch, dtype))})[name]
        return out


FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
         "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}  # fmt: skip
PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def live_hf_tensor(params: dict, shapes: dict, name: str) -> torch.Tensor:
    """An HF tensor out of vLLM's parameters: itself, or its rows of the fused qkv_proj / gate_up_proj
    (parts stacked on dim 0 in HF order, sizes from the shapes received)."""
    if name in params:
        return params[name].detach()
    for part, (fused, index) in FUSED.items():
        if f".{part}." in name:
            fused_name = name.replace(f".{part}.", f".{fused}.")
            if fused_name not in params:
                break
            sizes = [shapes[name.replace(f".{part}.", f".{p}.")][0] for p in PARTS[fused]]
            start = sum(sizes[:index])
            return params[fused_name].detach()[start : start + sizes[index]]
    raise KeyError(f"the live model holds no parameter for {name!r}")
