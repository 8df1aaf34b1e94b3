"""Runs inside vLLM's workers (`--worker-extension-cls meshrl.rollout.vllm_worker.MeshrlWorkerExtension`):
loads a verified Hugging Face weight folder into the live model through the model's own
`load_weights` (which maps HF names onto vLLM's fused parameters).

Called by `VLLMEngine` through POST /collective_rpc (VLLM_SERVER_DEV_MODE=1); arguments arrive as
JSON strings. The folder was verified by the replica (manifest and checksums) before this call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
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
