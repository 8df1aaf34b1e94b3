"""Domain types of the rollout service: sampling parameters, generation requests and results,
stream chunks, engine status and weight-update records.

Engines, the replica core and the servicer speak these types; `server.py` converts them to and
from protobuf at the edge (`SamplingParams.from_proto` / `to_proto` live here with the type).
"""

from __future__ import annotations

import enum
import math
import numbers
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from meshrl.api.rollout.v1 import rollout_pb2
from meshrl.common.errors import DataLoss, InvalidArgument
from meshrl.common.suggest import did_you_mean


class TornWeights(DataLoss):
    """A weight update failed after some of the engine's weights had changed: it serves neither version,
    so its replica turns stale (takes no traffic) until a complete version refits it."""


class FinishReason(enum.IntEnum):
    """Why a sample ended; values equal meshrl.common.v1.FinishReason."""

    UNSPECIFIED = 0
    STOP = 1  # an end-of-sequence or stop token was produced (it is part of the response)
    LENGTH = 2  # max_tokens or the context length was reached
    ABORT = 3  # aborted by a pause in abort mode, a cancel or shutdown


class PauseMode(enum.IntEnum):
    """Values equal meshrl.common.v1.PauseMode."""

    ABORT = 1  # in-flight requests finish at once with FinishReason.ABORT
    IN_PLACE = 2  # in-flight requests wait; their later tokens carry the new weight version


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one response.

    temperature: 0 = greedy (argmax); > 0 scales the logits. top_p in (0, 1] (1 = off); top_k >= 0 (0 = off).
    max_tokens > 0: the most tokens generated. stop_token_ids: extra ids that end the response (kept in it).
    seed: None = nondeterministic; an int makes the sample reproducible on the same engine and weights.
    ignore_eos: keep generating past the model's end-of-sequence ids.
    Log-probs returned with a sample are log_softmax(logits / temperature) (raw logits when greedy), before
    top-k/top-p truncation: the distribution a trainer recomputes with the same temperature.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 16
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        try:
            if isinstance(self.stop_token_ids, str | bytes):
                raise TypeError("text is not a list of ids")
            ids = tuple(int(t) for t in self.stop_token_ids)
        except (TypeError, ValueError, OverflowError):
            raise InvalidArgument(
                f"sampling.stop_token_ids = {self.stop_token_ids!r}: must be a list of token ids (integers >= 0)",
                field="sampling.stop_token_ids",
            ) from None
        object.__setattr__(self, "stop_token_ids", ids)
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise InvalidArgument(
                f"sampling.max_tokens = {self.max_tokens!r}: must be a positive integer (the most tokens to generate)",
                field="sampling.max_tokens",
            )
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise InvalidArgument(
                f"sampling.temperature = {self.temperature!r}: must be >= 0 (0 = greedy)", field="sampling.temperature"
            )
        if not (0 < self.top_p <= 1):
            raise InvalidArgument(
                f"sampling.top_p = {self.top_p!r}: must be in (0, 1] (1 = off)", field="sampling.top_p"
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, numbers.Integral) or self.top_k < 0:
            raise InvalidArgument(
                f"sampling.top_k = {self.top_k!r}: must be an integer >= 0 (0 = off)", field="sampling.top_k"
            )
        if any(t < 0 for t in self.stop_token_ids):
            raise InvalidArgument(
                f"sampling.stop_token_ids = {list(self.stop_token_ids)}: token ids are >= 0",
                field="sampling.stop_token_ids",
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> SamplingParams:
        """From a dict (workflow config, engine args); an unknown key is INVALID_ARGUMENT naming the closest one."""
        known = cls.field_names()
        for key in values:
            if key not in known:
                hint = did_you_mean(key, known, f"known keys: {', '.join(known)}")
                raise InvalidArgument(f"unknown sampling key '{key}': {hint}", field=f"sampling.{key}")
        kwargs = dict(values)
        if "stop_token_ids" in kwargs:
            kwargs["stop_token_ids"] = kwargs["stop_token_ids"] or ()
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:
            raise InvalidArgument(f"bad sampling parameters {dict(values)}: {exc}", field="sampling") from None

    @classmethod
    def from_proto(cls, msg: rollout_pb2.SamplingParams) -> SamplingParams:
        """Proto defaults: top_p 0 means 1.0, top_k 0 is off, seed 0 means no seed."""
        return cls(
            temperature=msg.temperature,
            top_p=msg.top_p or 1.0,
            top_k=msg.top_k,
            max_tokens=msg.max_tokens,
            stop_token_ids=tuple(msg.stop_token_ids),
            seed=msg.seed or None,
            ignore_eos=msg.ignore_eos,
        )

    def to_proto(self) -> rollout_pb2.SamplingParams:
        return rollout_pb2.SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=self.max_tokens,
            stop_token_ids=list(self.stop_token_ids),
            seed=self.seed or 0,
            ignore_eos=self.ignore_eos,
        )

    def with_seed(self, seed: int | None) -> SamplingParams:
        return SamplingParams(**{**{f: getattr(self, f) for f in self.field_names()}, "seed": seed})


def new_request_id() -> str:
    return uuid.uuid4().hex


@dataclass
class GenerationRequest:
    """One response to generate. prompt_ids: token ids (non-empty). session_id: turns of one conversation."""

    prompt_ids: Sequence[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = field(default_factory=new_request_id)
    session_id: str = ""


@dataclass
class TokenChunk:
    """New tokens of a running request (streaming). Lists are aligned; finish_reason is set on the last chunk."""

    token_ids: list[int]
    logprobs: list[float]
    weight_versions: list[int]
    finish_reason: FinishReason | None = None


@dataclass
class GenerationResult:
    """A finished response. token_ids / logprobs (float) / weight_versions are aligned, one entry per token."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    weight_versions: list[int]
    finish_reason: FinishReason
    weight_version: int  # the version served when the request was admitted (used when no token was produced)

    @property
    def min_version(self) -> int:
        return min(self.weight_versions) if self.weight_versions else self.weight_version

    @property
    def max_version(self) -> int:
        return max(self.weight_versions) if self.weight_versions else self.weight_version


@dataclass
class EngineStatus:
    engine: str
    model_path: str
    weight_version: int
    queue_depth: int  # admitted requests waiting for a batch slot
    running_requests: int  # requests being decoded
    tokens_per_second: float  # generated tokens per second over the last window
    generated_tokens: int  # since start
    paused: bool
    healthy: bool


@dataclass
class WeightUpdateResult:
    version: int
    seconds: float  # the whole update: reading and verifying included
    bytes: int
    pause_seconds: float = 0.0  # of which generation was paused (the apply); 0 when not measured apart


@dataclass(frozen=True)
class DiskUpdate:
    """A published version on disk to load: a complete folder, or (`delta_base` set) a delta against
    that version. `staging_dir`: copy the folder there first, while generation goes on."""

    path: str
    version: int
    manifest_sha256: str = ""
    staging_dir: str = ""
    pause_mode: PauseMode = PauseMode.IN_PLACE
    flush_cache: bool = True
    delta_base: int | None = None


@dataclass(frozen=True)
class GroupUpdate:
    """A version to receive over the joined weight-update group `group_name`."""

    group_name: str
    version: int
    pause_mode: PauseMode = PauseMode.IN_PLACE
    flush_cache: bool = True
    timeout_seconds: float = 120.0
