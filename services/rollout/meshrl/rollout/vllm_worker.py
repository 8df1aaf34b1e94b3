"""Runs inside vLLM's workers (`--worker-extension-cls meshrl.rollout.vllm_worker.MeshrlWorkerExtension`):
loads new weights through the worker's own in-place `reload_weights` (vLLM 0.32+, the path that also works
where the CPU build repacks every linear weight and leaves the parameter empty), from a verified Hugging Face
folder or from buckets received over the trainer's weight group, and keeps the checksums of what it received.

Called by `VLLMEngine` through POST /collective_rpc (VLLM_SERVER_DEV_MODE=1); arguments arrive as JSON strings.
A method never raises: a failing /collective_rpc makes vLLM's API server shut itself down, so a failure comes
back as {"error": message, "torn": whether weights had started to change}. Everything a call receives is
checked against the served model's tensor names and shapes before any weight changes.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from meshrl.rollout.vllm_groups import PendingModules, modules_of


def folder_files(folder: str) -> list[Path]:
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no .safetensors files")
    return files


def folder_shapes(folder: str) -> dict[str, tuple[int, ...]]:
    """{HF name: shape} of a folder's safetensors files, read from their headers."""
    out: dict[str, tuple[int, ...]] = {}
    for path in folder_files(folder):
        with safe_open(str(path), framework="pt") as f:
            out.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
    return out


def iter_folder_tensors(folder: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) of every safetensors file of a folder, file by file."""
    for path in folder_files(folder):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


class WeightsRefused(Exception):
    """Raised before any weight changed."""


def check_shapes(expected: dict[str, tuple[int, ...]], shapes: dict[str, tuple[int, ...]]) -> None:
    unknown = sorted(set(shapes) - set(expected))
    if unknown:
        raise WeightsRefused(f"the served model has no tensors named {unknown[:5]}; publish the served model's weights")
    wrong = [(n, s, expected[n]) for n, s in shapes.items() if tuple(s) != expected[n]]
    if wrong:
        name, got, want = wrong[0]
        raise WeightsRefused(f"{name} has shape {list(got)}, the served model's is {list(want)} ({len(wrong)} differ)")


def reported(method: Callable) -> Callable:
    """The method's result, or {"error", "torn"} in its place (see the module docstring)."""

    @functools.wraps(method)
    def run(self, *args: str) -> Any:
        try:
            return method(self, *args)
        except Exception as exc:  # noqa: BLE001 - any failure travels back as a reply, never as a 500
            return {"error": f"{type(exc).__name__}: {exc}", "torn": self.__dict__.get("_meshrl_torn", False)}

    return run


class MeshrlWorkerExtension:
    """Mixed into vLLM's worker class; `self.model_runner`, `self.vllm_config` and `self.reload_weights` are
    the worker's."""

    # --- the served model -----------------------------------------------------------------------
    def _meshrl_expected(self) -> dict[str, tuple[int, ...]]:
        """{HF name: shape} of the served model, read once from the folder vLLM started from."""
        if "_meshrl_shapes" not in self.__dict__:
            self._meshrl_shapes = folder_shapes(self.vllm_config.model_config.model)  # type: ignore[attr-defined]
        return self._meshrl_shapes

    def _meshrl_reload(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """One in-place reload of whole modules; a tied output layer's packed copy is made again after it."""
        self._meshrl_torn = True  # until the update completes
        self.reload_weights(weights_iterator=weights, is_checkpoint_format=True)  # type: ignore[attr-defined]
        model = self.model_runner.model  # type: ignore[attr-defined]
        hf_config = self.vllm_config.model_config.hf_config  # type: ignore[attr-defined]
        head = getattr(model, "lm_head", None)
        if getattr(hf_config, "tie_word_embeddings", False) and getattr(head, "quant_method", None) is not None:
            head.quant_method.process_weights_after_loading(head)

    # --- a verified folder --------------------------------------------------------------------------
    @reported
    def meshrl_load_folder(self, folder_json: str) -> int:
        folder = json.loads(folder_json)
        shapes = folder_shapes(folder)
        check_shapes(self._meshrl_expected(), shapes)
        missing = sorted(set(self._meshrl_expected()) - set(shapes))
        if missing:
            raise WeightsRefused(f"{folder} lacks {len(missing)} of the served model's tensors, e.g. {missing[:3]}")
        self.meshrl_begin_update()
        self._meshrl_reload(iter_folder_tensors(folder))
        self._meshrl_torn = False
        return len(shapes)

    # --- native weight updates: this worker is one rank of the trainer's weight group ---------------
    @reported
    def meshrl_join_group(self, group_json: str) -> int:
        """Joins the group as rank rank_offset + this worker's rank (engine_group.py builds it the way
        the engines do, standalone next to vLLM's own groups; over the store sealed with the service token in
        SECRET_ENV when the group is sealed); blocks until every rank joined."""
        from meshrl.common.weight_group_secret import SECRET_ENV
        from meshrl.common.weights.engine_group import engine_process_group, sealed_for

        g = json.loads(group_json)
        rank = int(g["rank_offset"]) + int(getattr(self, "rank", 0))
        store = torch.distributed.TCPStore(
            g["master_address"],
            int(g["master_port"]),
            int(g["world_size"]),
            False,
            timedelta(seconds=float(g["timeout_s"])),
        )
        groups = self.__dict__.setdefault("_meshrl_groups", {})
        backend_store = sealed_for(store, os.environ.get(SECRET_ENV) or None, g["group_name"], bool(g.get("sealed")))
        world = int(g["world_size"])
        pg = engine_process_group(g["backend"], backend_store, rank, world, g["group_name"], g["timeout_s"])
        groups[g["group_name"]] = (pg, store, float(g["timeout_s"]))
        return rank

    @reported
    def meshrl_begin_update(self) -> bool:
        """Forgets what the last update held or received (called before its first bucket)."""
        self._meshrl_pending = PendingModules(modules_of(self._meshrl_expected()))
        self._meshrl_received: dict[str, str] = {}
        return True

    @reported
    def meshrl_receive_bucket(self, group_name_json: str, names_json: str, dtypes_json: str, shapes_json: str) -> int:
        """Receives one bucket (one broadcast per tensor, list order), hashes each tensor as it came, and
        reloads every module the bucket made whole; the rest waits for the next bucket."""
        from meshrl.common.weights import tensor_checksums
        from meshrl.common.weights.engine_group import broadcast_all
        from meshrl.common.weights.transport import Deadline

        pg, _, timeout_s = self._meshrl_groups[json.loads(group_name_json)]
        names, dtypes, shapes = json.loads(names_json), json.loads(dtypes_json), json.loads(shapes_json)
        device = self.model_runner.device  # type: ignore[attr-defined]
        tensors = [torch.empty(s, dtype=getattr(torch, d), device=device) for d, s in zip(dtypes, shapes)]
        broadcast_all(pg, tensors, Deadline(timeout_s, f"bucket of {len(names)} tensors"))
        check_shapes(self._meshrl_expected(), {n: tuple(s) for n, s in zip(names, shapes)})
        self._meshrl_received.update(tensor_checksums(dict(zip(names, tensors)), names))
        ready = self._meshrl_pending.add(zip(names, tensors))
        if ready:
            self._meshrl_reload(ready)
        return len(names)

    @reported
    def meshrl_finish_update(self) -> int:
        """After the last bucket: every module received whole (else the update is torn)."""
        left = self._meshrl_pending.incomplete()
        self._meshrl_pending.clear()
        if left:
            module, names = next(iter(left.items()))
            self._meshrl_torn = True
            raise RuntimeError(f"the update ended with {len(left)} modules in part, e.g. {module} without {names}")
        self._meshrl_torn = False
        return len(self._meshrl_received)

    @reported
    def meshrl_leave_group(self, group_name_json: str) -> bool:
        return self.__dict__.get("_meshrl_groups", {}).pop(json.loads(group_name_json), None) is not None

    @reported
    def meshrl_checksums(self, names_json: str) -> dict[str, str]:
        """sha256 of the named tensors as this worker received them in the last update over the group."""
        received = self.__dict__.get("_meshrl_received", {})
        names = json.loads(names_json)
        absent = [n for n in names if n not in received]
        if absent:
            raise WeightsRefused(f"the last update over the group carried no tensors named {absent[:5]}")
        return {n: received[n] for n in names}
