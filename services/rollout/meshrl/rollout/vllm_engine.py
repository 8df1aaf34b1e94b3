"""The vLLM engine: a vLLM OpenAI server (launched or given by URL) driven through its HTTP API.

Pinned: vllm 0.11.0 (the `vllm` extra of meshrl-rollout), run with VLLM_SERVER_DEV_MODE=1 and
`--worker-extension-cls meshrl.rollout.vllm_worker.MeshrlWorkerExtension`. Endpoints used
(engine-apis.md §2): POST /v1/completions (token-id prompt, logprobs=0, return_token_ids,
stream), /reset_prefix_cache, /collective_rpc (weights into the workers: a folder, or buckets over a
weight group of protocol "engine" that every worker joins as one rank); GET /health.
vLLM 0.11 has no server-side pause: an in-place pause ends the server requests and continues
each one after the pause from its prompt plus the tokens made so far (their versions kept).
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from meshrl.api.common.v1 import weights_pb2
from meshrl.common import weights as W
from meshrl.common.errors import DataLoss, FailedPrecondition
from meshrl.common.weights.engine_group import dtype_name
from meshrl.rollout.config import EngineConfig
from meshrl.rollout.http_engine import HTTPEngine
from meshrl.rollout.http_server import ServerProcess, check_known_flags, cli_flags, python_executable
from meshrl.rollout.http_stream import Event, StreamState
from meshrl.rollout.memory import TAGS, check_tags
from meshrl.rollout.relay import WeightRelay, group_request
from meshrl.rollout.types import FinishReason, PauseMode, SamplingParams

SUPPORTED_VERSION = "0.11.0"
SERVED_NAME = "meshrl-policy"
WORKER_EXTENSION = "meshrl.rollout.vllm_worker.MeshrlWorkerExtension"
FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def known_server_args() -> list[str] | None:
    """vLLM's engine argument names when vllm is installed here, else None (not checked)."""
    try:
        from dataclasses import fields

        from vllm.engine.arg_utils import AsyncEngineArgs
    except Exception:  # noqa: BLE001 - vllm is an optional extra (GPU hosts)
        return None
    return [f.name for f in fields(AsyncEngineArgs)] + ["api_key", "served_model_name", "uvicorn_log_level"]


def token_ids_of(choice: dict[str, Any]) -> list[int]:
    """`token_ids` (return_token_ids) or, as a fallback, the "token_id:N" strings of logprobs.tokens."""
    if choice.get("token_ids") is not None:
        return [int(t) for t in choice["token_ids"]]
    tokens = (choice.get("logprobs") or {}).get("tokens") or []
    out = []
    for t in tokens:
        if not str(t).startswith("token_id:"):
            raise FailedPrecondition(f"vllm returned token {t!r} without its id; is return_tokens_as_token_ids set?")
        out.append(int(str(t).split(":", 1)[1]))
    return out


class VLLMEngine(WeightRelay, HTTPEngine):
    name = "vllm"

    def __init__(self, config: EngineConfig) -> None:
        WeightRelay.__init__(self, config.model_path)
        HTTPEngine.__init__(self, config, config.vllm)

    # --- server ---------------------------------------------------------------------------------
    def launch(self, port: int) -> ServerProcess:
        extra = dict(self.section.extra_args)
        check_known_flags(extra, known_server_args(), "vllm")
        if self.config.context_length:
            extra.setdefault("max_model_len", self.config.context_length)
        extra.setdefault("max_num_seqs", self.config.max_batch_size)
        extra.setdefault("tensor_parallel_size", self.section.tensor_parallel_size)
        extra.setdefault("data_parallel_size", self.section.data_parallel_size)
        cmd = [
            python_executable(self.section.python or sys.executable), "-m", "vllm.entrypoints.openai.api_server",
            "--model", self.config.model_path, "--host", self.section.host, "--port", str(port),
            "--served-model-name", SERVED_NAME, "--worker-extension-cls", WORKER_EXTENSION,
            *cli_flags(extra),
        ]  # fmt: skip
        if self.section.api_key:
            cmd += ["--api-key", self.section.api_key]
        env = {"VLLM_SERVER_DEV_MODE": "1", **self.section.env}
        return ServerProcess(cmd, env=env, log_file=self.section.log_file)

    # --- generation -------------------------------------------------------------------------------
    def generate_path(self) -> str:
        return "/v1/completions"

    def request_body(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": SERVED_NAME,
            "prompt": prompt_ids,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k or -1,
            "stop_token_ids": list(sampling.stop_token_ids),
            "ignore_eos": sampling.ignore_eos,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "stream": True,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    def parse_event(self, data: dict[str, Any], state: StreamState) -> Event:
        choices = data.get("choices") or []
        if not choices:
            return Event([], [])  # e.g. a usage-only event
        choice = choices[0]
        ids = token_ids_of(choice)
        lps = (choice.get("logprobs") or {}).get("token_logprobs") or []
        if len(lps) < len(ids):
            raise FailedPrecondition(f"vllm returned {len(ids)} tokens but {len(lps)} log-probs; send logprobs=0")
        logprobs = [float(x) if x is not None else math.nan for x in lps[: len(ids)]]
        reason = choice.get("finish_reason")
        return Event(ids, logprobs, None, FINISH.get(reason, FinishReason.STOP) if reason else None)

    # --- control ----------------------------------------------------------------------------------
    def server_pause(self, mode: PauseMode) -> bool:
        return mode == PauseMode.ABORT  # abort: closing the streams aborts the requests; in place: retract

    def server_continue(self) -> None:
        return None

    def flush_cache(self) -> bool:
        return self.post("/reset_prefix_cache").status_code == 200

    def rpc(self, method: str, *args: Any, timeout: float | None = None) -> list[Any]:
        """Calls a MeshrlWorkerExtension method on every worker; arguments travel as JSON strings."""
        body = {"method": method, "args": [json.dumps(a) for a in args], "timeout": timeout}
        reply = self.check(
            self.post("/collective_rpc", body, timeout=(timeout or 600.0) + 30), f"collective_rpc {method}"
        )
        return list(reply.get("results") or [])

    # --- weights ----------------------------------------------------------------------------------
    def load_folder(self, folder: str, version: int, pause_mode: PauseMode, flush_cache: bool) -> None:
        self.pause(pause_mode, reason="weights")
        try:
            self.rpc("meshrl_load_folder", folder)
            self._version = version
            if flush_cache:
                self.flush_cache()
        finally:
            self.continue_generation(reason="weights")

    # --- native distributed update (every vLLM worker is one rank of the weight group) --------------
    def native_join(self, group: W.GroupSpec) -> None:
        spec = {**group_request(group), "timeout_s": group.timeout_s}
        ranks = self.rpc("meshrl_join_group", spec, timeout=group.timeout_s)
        if len(ranks) != self.weight_ranks:
            raise FailedPrecondition(
                f"vllm has {len(ranks)} workers, vllm.tensor_parallel_size says {self.weight_ranks}"
            )

    def native_bucket(self, group_name: str, meta: weights_pb2.WeightBucketMeta, version: int) -> None:
        names = [t.name for t in meta.tensors]
        dtypes = [dtype_name(t.dtype) for t in meta.tensors]
        self.rpc("meshrl_receive_bucket", group_name, names, dtypes, [list(t.shape) for t in meta.tensors])

    def native_finish(self, version: int, flush_cache: bool) -> None:
        self.rpc("meshrl_finish_update", version)
        served = {int(v) for v in self.rpc("meshrl_weight_version")}
        if served != {version}:
            raise DataLoss(f"vllm's workers report weight versions {sorted(served)} after update {version}")
        if flush_cache:
            self.flush_cache()

    def native_leave(self, group_name: str) -> None:
        self.rpc("meshrl_leave_group", group_name)

    def native_checksums(self, specs) -> dict[str, str]:
        if self.weight_ranks != 1:
            raise FailedPrecondition("checksums of live vLLM weights are read with tensor_parallel_size 1 only")
        names = [s.name for s in specs]
        results = self.rpc("meshrl_checksums", names, [dtype_name(s.dtype) for s in specs])
        return dict(results[0])

    # --- sleeping (colocated mode; the server runs with --enable-sleep-mode) --------------------------
    def release_memory(self, tags=()) -> list[str]:
        """vLLM sleeps whole: level 2 drops weights and KV (the next update refills the weights), level 1
        (KV only asked for) discards the KV and offloads the weights to host memory."""
        tags = check_tags(tags)
        level = 2 if "weights" in tags else 1
        self.check(self.post("/sleep", params={"level": level}), f"sleep(level={level})")
        self._asleep = sorted(TAGS)
        return self._asleep

    def resume_memory(self, tags=()) -> list[str]:
        tags = check_tags(tags)
        self.check(self.post("/wake_up", params=[("tags", t) for t in tags]), f"wake_up({list(tags)})")
        self._asleep = sorted(set(getattr(self, "_asleep", [])) - set(tags))
        return self._asleep

    def shutdown(self) -> None:
        HTTPEngine.shutdown(self)
        self.close_relay()
