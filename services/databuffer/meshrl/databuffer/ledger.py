"""The budget ledger: how many bytes and entries the buffer holds, shared by every service
instance over one Redis, so that writes past the budget are refused (never evicting data).

Each stored thing (one generation of a batch, one stream group) is a member with a size and
an expiry (its TTL); expired members are pruned on every reservation, so batches that
expired in Redis stop counting. Reservations are atomic Lua scripts on one hash slot.
Used by the batch store and the stream store.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshrl.common.errors import InvalidArgument
from meshrl.common.put_checks import budget_exceeded

# KEYS: exp (zset member -> expiry ms), size (hash member -> bytes), tot (hash: bytes)
# release(m) drops one member and its bytes; prune(now) releases every member expired by `now` (at most 5000).
PRUNE = """
local function release(m)
  local s = redis.call('HGET', KEYS[2], m)
  if s then
    if redis.call('HINCRBY', KEYS[3], 'bytes', '-' .. s) == 0 then redis.call('HDEL', KEYS[3], 'bytes') end
    redis.call('HDEL', KEYS[2], m)
  end
  redis.call('ZREM', KEYS[1], m)
end
local function prune(now)
  local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 5000)
  for _, m in ipairs(expired) do release(m) end
end
"""

# ARGV: now_ms, max_bytes, max_entries, expiry_ms, member1, bytes1, member2, bytes2, ...
# Returns {1, used, entries}, {0, used, entries} (over the budget) or {-1, member, 0} (member already held).
_RESERVE = (
    PRUNE
    + """
prune(tonumber(ARGV[1]))
for i = 5, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 1 then return {-1, ARGV[i], 0} end
end
local used = tonumber(redis.call('HGET', KEYS[3], 'bytes') or '0')
local entries = redis.call('ZCARD', KEYS[1])
local need, count = 0, 0
for i = 5, #ARGV, 2 do
  need = need + tonumber(ARGV[i + 1])
  count = count + 1
end
if used + need > tonumber(ARGV[2]) or entries + count > tonumber(ARGV[3]) then
  return {0, tostring(used), entries}
end
for i = 5, #ARGV, 2 do
  redis.call('ZADD', KEYS[1], ARGV[4], ARGV[i])
  redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
  redis.call('HINCRBY', KEYS[3], 'bytes', ARGV[i + 1])
end
return {1, tostring(used + need), entries + count}
"""
)

# ARGV: members...
_RELEASE = """
local n = 0
for _, m in ipairs(ARGV) do
  local s = redis.call('HGET', KEYS[2], m)
  if s then
    if redis.call('HINCRBY', KEYS[3], 'bytes', '-' .. s) == 0 then redis.call('HDEL', KEYS[3], 'bytes') end
    redis.call('HDEL', KEYS[2], m)
    n = n + 1
  end
  redis.call('ZREM', KEYS[1], m)
end
return n
"""

# ARGV: expiry_ms, members...
_EXTEND = """
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', ARGV[1], ARGV[i]) end
return 1
"""

# ARGV: member, expiry_ms, old member or '', old expiry_ms (0: release the old member)
_SETTLE = """
redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[1])
if ARGV[3] ~= '' then
  if tonumber(ARGV[4]) > 0 then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[4], ARGV[3])
  else
    local s = redis.call('HGET', KEYS[2], ARGV[3])
    if s then
      if redis.call('HINCRBY', KEYS[3], 'bytes', '-' .. s) == 0 then redis.call('HDEL', KEYS[3], 'bytes') end
      redis.call('HDEL', KEYS[2], ARGV[3])
    end
    redis.call('ZREM', KEYS[1], ARGV[3])
  end
end
return 1
"""

# ARGV: now_ms
_USAGE = (
    PRUNE
    + """
prune(tonumber(ARGV[1]))
return {tostring(redis.call('HGET', KEYS[3], 'bytes') or '0'), redis.call('ZCARD', KEYS[1])}
"""
)


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Usage:
    bytes: int
    entries: int


class Ledger:
    def __init__(self, client: Any, keys: Sequence[str], max_bytes: int, max_entries: int) -> None:
        self._keys = list(keys)
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._reserve = client.register_script(_RESERVE)
        self._release = client.register_script(_RELEASE)
        self._extend = client.register_script(_EXTEND)
        self._usage = client.register_script(_USAGE)
        self._settle = client.register_script(_SETTLE)

    def reserve(self, sizes: Mapping[str, int], expiry_ms: int, what: str) -> None:
        """Counts `sizes` (member -> bytes) against the budget, or raises ResourceExhausted."""
        if not sizes:
            return
        args: list[Any] = [now_ms(), self.max_bytes, self.max_entries, expiry_ms]
        for member, size in sizes.items():
            args += [member, max(1, int(size))]  # '-0' is no integer to Redis
        ok, used, entries = self._reserve(keys=self._keys, args=args)
        if ok == -1:  # members are fresh random names: one already counted is a reused generation
            raise InvalidArgument(f"{what}: {used.decode()} is already counted; use a fresh random generation")
        if not ok:
            need = sum(sizes.values())
            raise budget_exceeded(what, need, len(sizes), int(used), entries, self.max_bytes, self.max_entries)

    def release(self, members: Sequence[str]) -> int:
        if not members:
            return 0
        return int(self._release(keys=self._keys, args=list(members)))

    def extend(self, members: Sequence[str], expiry_ms: int) -> None:
        if members:
            self._extend(keys=self._keys, args=[expiry_ms, *members])

    def settle(self, member: str, expiry_ms: int, old_member: str | None, old_grace_ms: int) -> None:
        """After a commit: `member` counts until `expiry_ms`; the replaced `old_member` until its grace
        period ends (or is released now when there is none). One round trip."""
        old_expiry = now_ms() + old_grace_ms if old_grace_ms > 0 else 0
        self._settle(keys=self._keys, args=[member, expiry_ms, old_member or "", old_expiry])

    def usage(self) -> Usage:
        used, entries = self._usage(keys=self._keys, args=[now_ms()])
        return Usage(int(used), int(entries))
