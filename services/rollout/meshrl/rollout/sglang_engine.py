"""The SGLang engine: an SGLang server (launched or given by URL) driven through its HTTP API.

Pinned: sglang 0.5.5 (the `sglang` extra of meshrl-rollout). Endpoints used (engine-apis.md §1):
POST /generate (input_ids, sampling_params, return_logprob, stream), /pause_generation,
/continue_generation, /flush_cache, /update_weights_from_disk, /init_weights_update_group,
/update_weights_from_distributed, /destroy_weights_update_group; GET /health, /model_info, /server_info.
Weights from a meshrl collective are received by this adapter (one rank of the group, as for every
engine) and handed to SGLang as a verified safetensors folder on local storage.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from meshrl.common.errors import FailedPrecondition
from meshrl.rollout.config import EngineConfig
from meshrl.rollout.http_engine import HTTPEngine
from meshrl.rollout.http_server import ServerProcess, check_known_flags, cli_flags, python_executable
from meshrl.rollout.http_stream import Event, StreamState
from meshrl.rollout.relay import WeightRelay
from meshrl.rollout.types import FinishReason, PauseMode, SamplingParams

SUPPORTED_VERSION = "0.5.5"
FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def known_server_args() -> list[str] | None:
    """The fields of sglang's ServerArgs when sglang is installed here, else None (not checked)."""
    try:
        from dataclasses import fields

        from sglang.srt.server_args import ServerArgs
    except Exception:  # noqa: BLE001 - sglang is an optional extra (GPU hosts)
        return None
    return [f.name for f in fields(ServerArgs)]


def parse_version(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


def finish_reason(value: Any) -> FinishReason | None:
    """meta_info.finish_reason: None while running, else {"type": "stop" | "length" | "abort", ...}."""
    if not value:
        return None
    kind = value.get("type") if isinstance(value, dict) else str(value)
    return FINISH.get(kind, FinishReason.STOP)


class SGLangEngine(WeightRelay, HTTPEngine):
    name = "sglang"

    def __init__(self, config: EngineConfig) -> None:
        self.incremental = False
        WeightRelay.__init__(self, config.model_path)
        HTTPEngine.__init__(self, config, config.sglang)

    # --- server ---------------------------------------------------------------------------------
    def launch(self, port: int) -> ServerProcess:
        extra = dict(self.section.extra_args)
        check_known_flags(extra, known_server_args(), "sglang")
        if self.config.context_length:
            extra.setdefault("context_length", self.config.context_length)
        extra.setdefault("max_running_requests", self.config.max_batch_size)
        cmd = [
            python_executable(self.section.python or sys.executable), "-m", "sglang.launch_server",
            "--model-path", self.config.model_path, "--host", self.section.host, "--port", str(port),
            *cli_flags(extra),
        ]  # fmt: skip
        if self.section.api_key:
            cmd += ["--api-key", self.section.api_key]
        return ServerProcess(cmd, env=self.section.env, log_file=self.section.log_file)

    def after_start(self) -> None:
        info = self.client.get(self.url + "/server_info", timeout=30.0)
        if info.status_code == 200:
            self.incremental = bool(info.json().get("incremental_streaming_output", False))
        model = self.client.get(self.url + "/model_info", timeout=30.0)
        if model.status_code == 200:
            self._version = parse_version(model.json().get("weight_version")) or 0

    # --- generation -------------------------------------------------------------------------------
    def generate_path(self) -> str:
        return "/generate"

    def request_body(self, prompt_ids: list[int], sampling: SamplingParams, request_id: str) -> dict[str, Any]:
        params: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k or -1,
            "stop_token_ids": list(sampling.stop_token_ids),
            "ignore_eos": sampling.ignore_eos,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        return {
            "input_ids": prompt_ids,
            "sampling_params": params,
            "return_logprob": True,
            "stream": True,
            "rid": f"{request_id}.{len(prompt_ids)}",
        }

    def parse_event(self, data: dict[str, Any], state: StreamState) -> Event:
        meta = data.get("meta_info") or {}
        ids = [int(t) for t in data.get("output_ids") or []]
        pairs = meta.get("output_token_logprobs") or []
        if not self.incremental:  # cumulative: everything so far in every event
            ids, pairs = ids[state.seen :], pairs[state.seen :]
            state.seen += len(ids)
        logprobs = [float(p[0]) if p and p[0] is not None else math.nan for p in pairs[: len(ids)]]
        if len(logprobs) < len(ids):
            raise FailedPrecondition(
                f"sglang returned {len(ids)} tokens but {len(logprobs)} log-probs; is return_logprob honoured?"
            )
        return Event(ids, logprobs, parse_version(meta.get("weight_version")), finish_reason(meta.get("finish_reason")))

    # --- control ----------------------------------------------------------------------------------
    def server_pause(self, mode: PauseMode) -> bool:
        body = {"mode": "abort" if mode == PauseMode.ABORT else "in_place"}
        self.check(self.post("/pause_generation", body), "pause_generation")
        return True

    def server_continue(self) -> None:
        self.check(self.post("/continue_generation", {}), "continue_generation")

    def flush_cache(self) -> bool:
        reply = self.post("/flush_cache")
        return reply.status_code == 200

    # --- weights ----------------------------------------------------------------------------------
    def load_folder(self, folder: str, version: int, pause_mode: PauseMode, flush_cache: bool) -> None:
        """Tells SGLang to load a verified HF weight folder as `version` (paused around it)."""
        self.pause(pause_mode, reason="weights")
        try:
            running = bool(self._running)
            body = {
                "model_path": folder,
                "weight_version": str(version),
                "abort_all_requests": pause_mode == PauseMode.ABORT,
                # SGLang cannot flush while requests are paused in place; their KV stays (policy of the caller).
                "flush_cache": flush_cache and not (running and pause_mode == PauseMode.IN_PLACE),
            }
            self.check(self.post("/update_weights_from_disk", body), f"update_weights_from_disk({folder})")
            self._version = version
        finally:
            self.continue_generation(reason="weights")

    def shutdown(self) -> None:
        HTTPEngine.shutdown(self)
        self.close_relay()
