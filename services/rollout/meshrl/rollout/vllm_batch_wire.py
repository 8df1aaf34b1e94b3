"""The wire format of meshrl's batch route on a vLLM server: one HTTP call carries a whole batch of token-id
requests and streams their tokens back as newline-delimited JSON, several requests per line.

Shared by the route itself (`vllm_batch_route`, loaded into vLLM's API server as an endpoint plugin) and the
adapter (`VLLMEngine`), so both ends read one definition. Pure Python: no vLLM, no HTTP client.

Request (POST BATCH_PATH, JSON):
    {"stream_interval": 16,             # tokens per streamed output of a request; 0 = its final output only
     "requests": [{"id": "r1",          # the server request id (`/inference/v1/abort_requests` takes it)
                   "prompt": [5, 6, 7], # prompt token ids
                   "params": {...}}]}   # vLLM SamplingParams fields (n, max_tokens, temperature, seed, ...)
Reply: 200 with `application/x-ndjson` lines, each {"out": [item, ...]}; an item is
    {"i": request index, "k": sample index (of n), "ids": new token ids, "lps": their log-probs,
     "finish": null | "stop" | "length" | "abort", "versions": null | [[weight version, start, end], ...]}
(`versions`, on a sample's last item, says which weight version made each of its tokens), or
    {"i": request index, "error": "why the engine failed it"};
the last line is {"done": true}. A body that is not such a batch is refused with 400 and {"detail": why}.
"""

from __future__ import annotations

import json
import math
from typing import Any

PLUGIN = "meshrl"  # the endpoint plugin's name: VLLM_PLUGINS must list it
BATCH_PATH = "/inference/meshrl/v1/generate_batch"  # under /inference: vLLM's --api-key guards it
INFO_PATH = "/inference/meshrl/v1/info"  # {"batch_format": FORMAT, "vllm": version}: the route is there
FORMAT = 1
DONE = {"done": True}


class BatchRefused(ValueError):
    """The body is not a batch this route can run (answered with 400 and the reason)."""


def parse_batch(body: Any) -> tuple[list[tuple[str, list[int], dict[str, Any]]], int]:
    """[(request id, prompt token ids, sampling params)], stream_interval of a batch body; BatchRefused
    naming the request and field that are wrong."""
    if not isinstance(body, dict) or not isinstance(body.get("requests"), list):
        raise BatchRefused('the body must be a JSON object {"requests": [...], "stream_interval": int}')
    interval = body.get("stream_interval", 0)
    if not isinstance(interval, int) or isinstance(interval, bool) or interval < 0:
        raise BatchRefused(f"stream_interval must be an integer >= 0 (0 = final outputs only), got {interval!r}")
    out = []
    for i, entry in enumerate(body["requests"]):
        if not isinstance(entry, dict):
            raise BatchRefused(f"requests[{i}] must be an object with id, prompt and params, got {entry!r:.80}")
        rid, prompt, params = entry.get("id"), entry.get("prompt"), entry.get("params", {})
        if not isinstance(rid, str) or not rid:
            raise BatchRefused(f"requests[{i}].id must be a non-empty string, got {rid!r:.80}")
        if not isinstance(prompt, list) or not prompt or not all(_is_int(t) and t >= 0 for t in prompt):
            raise BatchRefused(f"requests[{i}] ({rid}): prompt must be a non-empty list of token ids")
        if not isinstance(params, dict):
            raise BatchRefused(f"requests[{i}] ({rid}): params must be an object of SamplingParams fields")
        out.append((rid, prompt, params))
    ids = [rid for rid, _, _ in out]
    if len(set(ids)) != len(ids):
        raise BatchRefused("request ids repeat within the batch; give each request its own id")
    return out, interval


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def encode_line(payload: dict[str, Any]) -> bytes:
    """One line of the reply (log-probs that are NaN or infinite go as null)."""
    return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
