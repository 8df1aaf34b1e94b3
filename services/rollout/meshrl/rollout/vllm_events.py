"""What vLLM streams back, read into the adapter's `Event`s: a chunk of `/inference/v1/generate` (one request's
server-sent events) and a line of meshrl's batch route (several requests' items, format in `vllm_batch_wire`).
Both carry token ids, their log-probs, the finish reason and, on a sample's last piece, the weight version spans
of its whole output. Used by `VLLMEngine`.
"""

from __future__ import annotations

import math
from typing import Any

from meshrl.common.errors import FailedPrecondition
from meshrl.rollout.http_stream import Event
from meshrl.rollout.types import FinishReason

FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH, "abort": FinishReason.ABORT}


def parse_version(value: Any) -> int:
    """vLLM's weight version string as meshrl's integer ("default" before any update: 0)."""
    text = str(value)
    return int(text) if text.isdigit() else 0


def finish_of(reason: str | None) -> FinishReason | None:
    return FINISH.get(reason, FinishReason.STOP) if reason else None


def token_versions(spans: list[tuple[Any, int, int]] | None) -> list[int] | None:
    """[(version, start, end)] spans as the version of each token."""
    if spans is None:
        return None
    return [parse_version(v) for v, start, end in spans for _ in range(int(end) - int(start))]


def logprobs_of(values: list[float | None], n: int) -> list[float]:
    if len(values) < n:
        raise FailedPrecondition(f"vllm returned {n} tokens but {len(values)} log-probs; send logprobs=0")
    return [float(v) if v is not None else math.nan for v in values[:n]]


def stream_event(data: dict[str, Any]) -> Event:
    """One chunk of /inference/v1/generate: token ids, their log-probs (`logprobs.content`), the finish reason,
    and on the last chunk the weight version spans of the whole output."""
    choices = data.get("choices") or []
    if not choices:
        return Event([], [])  # e.g. a usage-only event
    choice = choices[0]
    ids = [int(t) for t in choice.get("token_ids") or []]
    content = (choice.get("logprobs") or {}).get("content") or []
    logprobs = logprobs_of([c.get("logprob") for c in content], len(ids))
    spans = choice.get("weight_versions")
    versions = token_versions([(s["version"], s["start"], s["end"]) for s in spans] if spans is not None else None)
    finish = finish_of(choice.get("finish_reason"))
    return Event(ids, logprobs, None, finish, versions, index=int(choice.get("index") or 0))


def batch_events(data: dict[str, Any]) -> list[tuple[int, int, Event | str]]:
    """(request index, sample index, Event) per item of one batch-route line; an error item gives its reason."""
    out: list[tuple[int, int, Event | str]] = []
    for item in data.get("out") or []:
        if "error" in item:
            out.append((int(item["i"]), 0, str(item["error"])))
            continue
        ids = [int(t) for t in item["ids"]]
        logprobs = logprobs_of(item.get("lps") or [], len(ids))
        event = Event(ids, logprobs, None, finish_of(item.get("finish")), token_versions(item.get("versions")))
        out.append((int(item["i"]), int(item.get("k") or 0), event))
    return out
