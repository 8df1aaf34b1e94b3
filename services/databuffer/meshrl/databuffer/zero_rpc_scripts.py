"""The Lua scripts of the zero-RPC direct path (meshrl.databuffer.direct describes them, a client runs them by
EVALSHA: meshrl.common.zero_rpc). PUT commits a one-value batch that a client staged (SET, staging TTL) in the
same round trip, renaming it to the batch's generation-free value key `{tag}:v` (O(1): the payload is not
copied; a get reads it with the manifest in one MULTI), enforcing what a relayed put does: overwrite rule, payload size, budget reservation in the ledger,
TTLs, the replaced generation's grace period, index membership and the commit notification. COUNT_READ
counts a zero-RPC get where GetStats sees it. Neither runs on a Redis Cluster (their keys span slots).
"""

from meshrl.databuffer.ledger import PRUNE  # defines release(m) and prune(now)

# KEYS: ledger exp, size, tot (as meshrl.databuffer.ledger), manifest, staged value, job's batch index, jobs index,
#       value key.
# ARGV: now_ms, budget max_bytes, max_entries, batch tag, gen, total bytes, header, ttl_ms, grace_ms, margin_ms,
#       overwrite ('0' | '1'), chunk_bytes, rows, commit channel, index member, step, job id.
# Returns {'ok', replaced gen or ''}, or a refusal (the staged value is deleted, nothing else changed):
# {'missing'}, {'size', got, want}, {'exists', gen}, {'samegen', gen}, {'reused', member},
# {'budget', used bytes, entries}.
PUT = (
    PRUNE
    + """
local now, total = tonumber(ARGV[1]), tonumber(ARGV[6])
local function refuse(status, a, b)
  redis.call('DEL', KEYS[5])
  return {status, a or '', b or ''}
end
local function index(key, kind, member, score, ttl)
  if kind == 'z' then redis.call('ZADD', key, score, member) else redis.call('SADD', key, member) end
  local left = redis.call('PTTL', key)
  if left == -1 or (left >= 0 and left < ttl) then redis.call('PEXPIRE', key, ttl) end
end
if redis.call('EXISTS', KEYS[5]) == 0 then return {'missing', '', ''} end
local got = redis.call('STRLEN', KEYS[5])
if got ~= total then return refuse('size', tostring(got), ARGV[6]) end
local cur = redis.call('HGET', KEYS[4], 'gen')
if cur and ARGV[11] == '0' then return refuse('exists', cur) end
if cur == ARGV[5] then return refuse('samegen', cur) end
local member = 'b:' .. ARGV[4] .. ':' .. ARGV[5]
prune(now)
if redis.call('HEXISTS', KEYS[2], member) == 1 then return refuse('reused', member) end
local used = tonumber(redis.call('HGET', KEYS[3], 'bytes') or '0')
local entries = redis.call('ZCARD', KEYS[1])
local need = math.max(1, total + string.len(ARGV[7]))
if used + need > tonumber(ARGV[2]) or entries + 1 > tonumber(ARGV[3]) then
  return refuse('budget', tostring(used), tostring(entries))
end
local ttl, grace = tonumber(ARGV[8]), tonumber(ARGV[9])
local keep = ttl + tonumber(ARGV[10])
redis.call('ZADD', KEYS[1], now + keep, member)
redis.call('HSET', KEYS[2], member, need)
redis.call('HINCRBY', KEYS[3], 'bytes', need)
local old_n = '0'
if cur then
  old_n = redis.call('HGET', KEYS[4], 'n') or '0'
  local old, stem = 'b:' .. ARGV[4] .. ':' .. cur, '{' .. ARGV[4] .. '}:c:' .. cur .. ':'
  for i = 0, tonumber(old_n) - 1 do
    if grace > 0 then redis.call('PEXPIRE', stem .. i, grace) else redis.call('DEL', stem .. i) end
  end
  if grace > 0 then redis.call('ZADD', KEYS[1], 'XX', now + grace, old) else release(old) end
end
redis.call('RENAME', KEYS[5], KEYS[8])
redis.call('PEXPIRE', KEYS[8], keep)
redis.call('DEL', KEYS[4])
redis.call('HSET', KEYS[4], 'gen', ARGV[5], 'n', '1', 'cb', ARGV[12], 'bytes', ARGV[6], 'h', ARGV[7], 't', ARGV[1],
  'r', ARGV[13], 'v', '1')
if cur and grace > 0 then redis.call('HSET', KEYS[4], 'pg', cur, 'pn', old_n) end
redis.call('PEXPIRE', KEYS[4], ttl)
index(KEYS[6], 'z', ARGV[15], ARGV[16], keep)
index(KEYS[7], 's', ARGV[17], 0, keep)
redis.call('PUBLISH', ARGV[14], ARGV[4])
return {'ok', cur or '', ''}
"""
)

# KEYS: manifest, read stats hash. Counts one get of the batch (its bytes and rows) when it is there.
COUNT_READ = """
local f = redis.call('HMGET', KEYS[1], 'bytes', 'r')
if not f[1] then return 0 end
redis.call('HINCRBY', KEYS[2], 'calls', 1)
redis.call('HINCRBY', KEYS[2], 'bytes', f[1])
redis.call('HINCRBY', KEYS[2], 'rows', f[2] or '0')
return 1
"""
