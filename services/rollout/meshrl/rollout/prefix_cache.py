"""A small LRU of prompt KV caches, so the n samples of one prompt group (and the turns of one
session) prefill their shared prefix once.

Used by the continuous batcher on its own thread (not thread-safe by design). Entries are keyed by
token-id tuples; a lookup returns the longest cached prefix of a prompt (exact matches also return
the logits after the prompt, so no forward pass is needed at all). Bounded by total cached tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from meshrl.rollout.kv_batch import SeqKV


@dataclass
class PrefixEntry:
    kv: SeqKV  # per layer (keys, values), each [1, H_kv, len, D]
    logits: torch.Tensor | None  # [V] fp32 after the last token, when known


@dataclass
class PrefixHit:
    length: int  # how many leading prompt tokens are cached
    entry: PrefixEntry


class PrefixCache:
    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], PrefixEntry] = OrderedDict()
        self._tokens = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def cached_tokens(self) -> int:
        return self._tokens

    def lookup(self, prompt: Sequence[int]) -> PrefixHit | None:
        """The longest cached prefix of `prompt` (the whole prompt counts only with its logits)."""
        if self.max_tokens <= 0:
            return None
        key = tuple(prompt)
        entry = self._entries.get(key)
        if entry is not None and entry.logits is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return PrefixHit(len(key), entry)
        best: tuple[int, tuple[int, ...]] | None = None
        for cached in self._entries:
            n = len(cached)
            if n < len(key) and (best is None or n > best[0]) and key[:n] == cached:
                best = (n, cached)
        if best is None:
            self.misses += 1
            return None
        self._entries.move_to_end(best[1])
        self.hits += 1
        return PrefixHit(best[0], self._entries[best[1]])

    def insert(self, tokens: Sequence[int], kv: SeqKV, logits: torch.Tensor | None) -> None:
        key = tuple(tokens)
        if self.max_tokens <= 0 or len(key) > self.max_tokens or not key:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._tokens -= len(key)
        self._entries[key] = PrefixEntry(kv, logits)
        self._tokens += len(key)
        while self._tokens > self.max_tokens:
            evicted, _ = self._entries.popitem(last=False)
            self._tokens -= len(evicted)

    def clear(self) -> int:
        n = len(self._entries)
        self._entries.clear()
        self._tokens = 0
        return n
