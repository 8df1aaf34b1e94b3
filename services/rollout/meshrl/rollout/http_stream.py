"""The HTTP engines' wire pieces: one streamed event (`Event`), per-request parsing state, the server-sent
event reader, and what a model folder says about itself. Used by `HTTPEngine` and its SGLang / vLLM subclasses.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from meshrl.common.errors import FailedPrecondition, InvalidArgument, Unavailable
from meshrl.rollout.types import FinishReason, SamplingParams


@dataclass
class Event:
    """What one streamed event adds: new tokens, their log-probs, the server's weight version, and the end."""

    token_ids: list[int]
    logprobs: list[float]
    version: int | None = None
    finish: FinishReason | None = None
    all_versions: list[int] | None = None  # the engine's version of every token of the response (its last event)
    index: int = 0  # which sample of a request that asked for several


@dataclass
class StreamState:
    """Per-request parsing state (e.g. how many cumulative tokens were already seen)."""

    seen: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def read_model_facts(model_path: str, context_length: int | None) -> tuple[int, int, Any]:
    """(context length, vocab size, tokenizer or None) from a Hugging Face folder, without loading weights."""
    path = Path(model_path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise InvalidArgument(f"engine.model_path {model_path!r} has no config.json; point it at a Hugging Face folder")
    cfg = json.loads(config_file.read_text())
    text_cfg = cfg.get("text_config", cfg)
    limit = int(context_length or text_cfg.get("max_position_embeddings") or 0)
    vocab = int(text_cfg.get("vocab_size") or 0)
    tokenizer = None
    if (path / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path)
    return limit, vocab, tokenizer


def with_max_tokens(sampling: SamplingParams, max_tokens: int) -> SamplingParams:
    if max_tokens == sampling.max_tokens:
        return sampling
    values = {f: getattr(sampling, f) for f in SamplingParams.field_names()}
    return SamplingParams(**{**values, "max_tokens": max(1, max_tokens)})


def checked(reply: httpx.Response, refusal: str) -> dict[str, Any]:
    """The JSON body of a server's reply; {"success": false} or an HTTP error becomes a typed error whose
    message starts with `refusal` and gives the server's reason."""
    try:
        body = reply.json() if reply.content else {}
    except ValueError:
        body = {"message": reply.text}
    if not isinstance(body, dict):
        body = {"result": body}
    if reply.status_code >= 400 or body.get("success") is False:
        message = body.get("message") or body.get("detail") or body.get("error") or reply.text
        cls = InvalidArgument if reply.status_code in (400, 422) else FailedPrecondition
        if reply.status_code >= 500:
            cls = Unavailable
        raise cls(f"{refusal}: {message}")
    return body


def sse_payloads(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """The JSON payloads of server-sent events (`data: {...}` lines), until `data: [DONE]`."""
    for line in lines:
        if not line or not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        try:
            yield json.loads(payload)
        except json.JSONDecodeError:
            raise Unavailable(f"the engine server sent an event that is not JSON: {payload[:200]}") from None
