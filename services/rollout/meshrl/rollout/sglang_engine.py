"""The SGLang engine: an SGLang server (launched or given by URL) driven through its HTTP API.

Pinned: sglang 0.5.5 (the `sglang` extra of meshrl-rollout). Endpoints used (engine-apis.md §1):
POST /generate (input_ids, sampling_params, return_logprob, stream), /pause_generation,
/continue_generation, /flush_cache, /update_weights_from_disk, /init_weights_update_group,
/update_weights_from_distributed, /destroy_weights_update_group, /get_weights_by_name; GET /health,
/model_info, /server_info. A weight group of protocol "engine" is joined by SGLang's own TP workers
(native update, `relay.py`); one of protocol "meshrl" is received by this adapter and handed over as a
folder. Streaming: output_ids are deltas with --incremental-streaming-output, log-probs are cumulative.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import torch

from meshrl.api.common.v1 import weights_pb2
from meshrl.common import weights as W
from meshrl.common.errors import DataLoss, FailedPrecondition
from meshrl.common.weights import dtypes as wdtypes
from meshrl.common.weights.engine_group import dtype_name
from meshrl.rollout.config import EngineConfig
from meshrl.rollout.http_engine import HTTPEngine
from meshrl.rollout.http_server import ServerProcess, check_known_flags, cli_flags, python_executable
from meshrl.rollout.http_stream import Event, StreamState
from meshrl.rollout.memory import check_tags
from meshrl.rollout.relay import WeightRelay, group_request
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
        extra.setdefault("tp_size", self.section.tensor_parallel_size)
        extra.setdefault("dp_size", self.section.data_parallel_size)
        extra.setdefault("max_running_requests", self.config.max_batch_size)
        cmd = [
            python_executable(self.section.python or sys.executable),
            "-m",
            "sglang.launch_server",
            "--model-path",
            self.config.model_path,
            "--host",
            self.section.host,
            "--port",
            str(port),
            *cli_flags(extra),
        ]
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

    def request_body(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str, *, samples: int = 1, live: bool = True
    ) -> dict[str, Any]:
        """One sample per request (samples_per_request is 1); every token is streamed."""
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
        if not self.incremental:  # cumulative ids: everything so far in every event
            ids = ids[state.seen :]
        if len(pairs) >= state.seen + len(ids):  # cumulative log-probs (SGLang's in both modes)
            pairs = pairs[state.seen :]
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

    # --- native distributed update (SGLang's own TP workers join the weight group) -------------------
    def native_join(self, group: W.GroupSpec) -> None:
        body = group_request(group)
        self.check(
            self.post("/init_weights_update_group", body, timeout=group.timeout_s + 30), "init_weights_update_group"
        )

    def native_bucket(self, group_name: str, meta: weights_pb2.WeightBucketMeta, version: int) -> None:
        body = {
            "names": [t.name for t in meta.tensors],
            "dtypes": [dtype_name(t.dtype) for t in meta.tensors],
            "shapes": [list(t.shape) for t in meta.tensors],
            "group_name": group_name,
            "flush_cache": False,
            "abort_all_requests": False,
            "weight_version": str(version),
        }
        self.check(self.post("/update_weights_from_distributed", body), f"update_weights_from_distributed {version}")

    def native_finish(self, version: int, flush_cache: bool) -> None:
        if flush_cache and not self._running:  # SGLang refuses to flush while requests are paused in place
            self.flush_cache()
        reply = self.client.get(self.url + "/model_info", timeout=30.0)
        served = parse_version(self.check(reply, "model_info").get("weight_version"))
        if served != version:
            raise DataLoss(f"sglang reports weight version {served} after update {version}")

    def native_leave(self, group_name: str) -> None:
        self.check(self.post("/destroy_weights_update_group", {"group_name": group_name}), "destroy group")

    def native_checksums(self, specs) -> dict[str, str]:
        """Reads each tensor back from SGLang's live model (/get_weights_by_name, un-fused and gathered
        by SGLang under its HF name) in the dtype it was sent in, and hashes it."""
        out = {}
        for spec in specs:
            reply = self.post("/get_weights_by_name", {"name": spec.name, "truncate_size": 1 << 40})
            values = self.check(reply, f"get_weights_by_name {spec.name}")["result"]  # a nested list
            t = torch.tensor(values, dtype=torch.float64).to(wdtypes.from_proto(spec.dtype))
            out[spec.name] = W.tensor_checksums({spec.name: t.reshape(list(spec.shape))})[spec.name]
        return out

    # --- sleeping (colocated mode; the server runs with --enable-memory-saver) -------------------------
    def release_memory(self, tags=()) -> list[str]:
        tags = check_tags(tags)
        self.check(self.post("/release_memory_occupation", {"tags": list(tags)}), "release_memory_occupation")
        self._asleep = sorted(set(getattr(self, "_asleep", [])) | set(tags))
        return self._asleep

    def resume_memory(self, tags=()) -> list[str]:
        tags = check_tags(tags)
        self.check(self.post("/resume_memory_occupation", {"tags": list(tags)}), "resume_memory_occupation")
        self._asleep = sorted(set(getattr(self, "_asleep", [])) - set(tags))
        return self._asleep

    def shutdown(self) -> None:
        HTTPEngine.shutdown(self)
        self.close_relay()
