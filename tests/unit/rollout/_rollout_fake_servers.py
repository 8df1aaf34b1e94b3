"""Fake SGLang and vLLM HTTP servers for the adapter tests: they answer with the documented JSON
shapes (engine-apis.md §1-2: /generate meta_info with output_token_logprobs and weight_version,
finish_reason objects; /v1/completions choices with token_ids and logprobs; control endpoints),
stream server-sent events, record every request, and generate deterministic tokens:
token k of a response to prompt p is (sum(p) + k) % 200 with log-prob -0.01 * (k + 1).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def token(prompt: list[int], k: int) -> int:
    return (sum(prompt) + k) % 200


def logprob(k: int) -> float:
    return -0.01 * (k + 1)


class FakeServer:
    """Base: routes, request log, pause gate. Subclasses implement `generate(handler, body)`."""

    def __init__(self, step_s: float = 0.01) -> None:
        self.step_s = step_s
        self.requests: list[tuple[str, str, Any]] = []
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
                return json.loads(raw) if raw else None

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
        path = h.path.split("?")[0]
        with self.lock:
            self.requests.append((method, path, body))
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
        super().__init__(**kw)

    def routes(self) -> dict:
        ok = {"success": True, "message": "ok"}
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
            ("POST", "/init_weights_update_group"): lambda h, b: self.reply(h, 200, ok),
            ("POST", "/destroy_weights_update_group"): lambda h, b: self.reply(h, 200, ok),
        }

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
                    yield {"text": "", "output_ids": [] if self.incremental else ids, "meta_info": {
                        "id": body["rid"], "finish_reason": {"type": "abort", "message": "Abort by pause"},
                        "weight_version": self.version, "output_token_logprobs": [] if self.incremental else lps}}  # fmt: skip
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
                    "id": body["rid"], "finish_reason": finish, "prompt_tokens": len(prompt),
                    "weight_version": self.version, "completion_tokens": len(ids), "cached_tokens": 0,
                    "output_token_logprobs": [lps[-1]] if self.incremental else list(lps),
                }  # fmt: skip
                yield {"text": "x", "output_ids": [t] if self.incremental else list(ids), "meta_info": meta}
                if done:
                    return

        self.stream(h, events())


class FakeVLLM(FakeServer):
    def __init__(self, token_ids_field: bool = True, **kw: Any) -> None:
        self.token_ids_field = token_ids_field
        super().__init__(**kw)

    def routes(self) -> dict:
        return {
            **super().routes(),
            ("POST", "/v1/completions"): self.completions,
            ("POST", "/reset_prefix_cache"): lambda h, b: self.reply(h, 200, b""),
            ("POST", "/collective_rpc"): lambda h, b: self.reply(h, 200, {"results": [26]}),
        }

    def completions(self, h, body) -> None:
        prompt = body["prompt"]
        n = body["max_tokens"]

        def events():
            for k in range(n):
                time.sleep(self.step_s)
                t = token(prompt, k)
                choice = {
                    "index": 0, "text": "x",
                    "logprobs": {"text_offset": [k], "token_logprobs": [logprob(k)], "tokens": [f"token_id:{t}"],
                                 "top_logprobs": [{f"token_id:{t}": logprob(k)}]},
                    "finish_reason": "length" if k == n - 1 else None, "stop_reason": None,
                }  # fmt: skip
                if self.token_ids_field:
                    choice["token_ids"] = [t]
                yield {
                    "id": "cmpl-1",
                    "object": "text_completion",
                    "created": 1,
                    "model": body["model"],
                    "choices": [choice],
                }

        self.stream(h, events())
