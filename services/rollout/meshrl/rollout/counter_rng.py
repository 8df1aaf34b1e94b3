"""Counter-based random numbers for sampling: a row's draw is a pure function of (key, position).

The transformers engine samples every running row in one vectorized pass (meshrl.rollout.sampler): the
uniform that picks a row's token at response position t is a hash of (the request's 64-bit key, t). So a
seeded request draws the same tokens whatever else shares its batch, whatever order rows join in and after
its KV cache is flushed and recomputed, without one torch.Generator (and one multinomial call) per row.

The hash is two 32-bit lanes of Wellons' "lowbias32" integer mixer, computed in int64 with every
intermediate below 2**63 (products are split into 16-bit halves), so no signed overflow happens anywhere.
Both lanes feed the 53-bit uniform, so two rows share a draw only if their keys and positions match.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
_M1, _M2 = 0x7FEB352D, 0x846CA68B  # lowbias32's multipliers
_GOLDEN = 0x9E3779B9  # spreads consecutive counters (token ids, positions) over the word
_LANE_B = 0x85EBCA6B  # separates the second lane from the first


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for int64 x in [0, 2**32), exactly: x * (c's low 16 bits) + (x * (c's high 16 bits)
    mod 2**16) << 16, each term below 2**49."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 on int64 words in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, _M1)
    x = x ^ (x >> 15)
    x = _mul32(x, _M2)
    return x ^ (x >> 16)


def row_lanes(keys: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 32-bit words per row ([B] int64 each) from the row's 64-bit key and its position."""
    keys = keys & 0x7FFF_FFFF_FFFF_FFFF
    lo, hi = keys & MASK32, (keys >> 32) & MASK32
    pos = _mul32(positions & MASK32, _GOLDEN)
    a = mix32(mix32(lo ^ pos) ^ hi)
    b = mix32(mix32(hi ^ pos ^ _LANE_B) ^ lo)
    return a, b


def row_uniforms(keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[B] float64 uniforms in (0, 1) with 53 random bits: entry i depends only on keys[i] and positions[i]."""
    a, b = row_lanes(keys.to(torch.int64), positions.to(torch.int64))
    bits = (a << 21) | (b >> 11)  # 32 + 21 bits, below 2**53
    return (bits.to(torch.float64) + 0.5) * (1.0 / 2**53)
