"""The Lua scripts of the stream store (meshrl.databuffer.streams): each runs atomically on the
hash slot of one stream (its entries and its metadata hash), so they work on a Redis Cluster.

Entries hold: v = weight version, d = the serialized SampleGroup, r = its budget-ledger member,
n = its size in bytes. The metadata hash holds: latest (newest version), appended, bytes,
drop:<reason> counters.
"""

IDS = """
local function parse(id)
  local ms, seq = string.match(id, '(%d+)-(%d+)')
  return tonumber(ms), tonumber(seq)
end
local function less(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am < bm or (am == bm and as < bs)
end
local function succ(id)
  local ms, seq = string.match(id, '(%d+)-(%d+)')
  return ms .. '-' .. (tonumber(seq) + 1)
end
local function fields(list)
  local out = {}
  for i = 1, #list, 2 do out[list[i]] = list[i + 1] end
  return out
end
"""

# KEYS: stream, meta. ARGV: ttl_ms, then (version, data, member, size) per group. Returns the entry ids.
APPEND = """
local ids, total, latest = {}, 0, redis.call('HGET', KEYS[2], 'latest')
for i = 2, #ARGV, 4 do
  ids[#ids + 1] = redis.call('XADD', KEYS[1], '*', 'v', ARGV[i], 'd', ARGV[i + 1], 'r', ARGV[i + 2], 'n', ARGV[i + 3])
  if not latest or tonumber(ARGV[i]) > tonumber(latest) then latest = ARGV[i] end
  total = total + tonumber(ARGV[i + 3])
end
redis.call('HSET', KEYS[2], 'latest', latest)
redis.call('HINCRBY', KEYS[2], 'appended', #ids)
redis.call('HINCRBY', KEYS[2], 'bytes', total)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return ids
"""

# KEYS: stream, meta. ARGV: now_ms, ttl_ms. Trims what every consumer group acked and what
# outlived the TTL (acking it in every group, counted as 'expired'); returns the ledger members.
TRIM = (
    IDS
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local ttl_cut = (tonumber(ARGV[1]) - tonumber(ARGV[2])) .. '-0'
local consumed = nil
local groups = redis.call('XINFO', 'GROUPS', KEYS[1])
for _, g in ipairs(groups) do
  local info = fields(g)
  local summary = redis.call('XPENDING', KEYS[1], info['name'])
  local bound = succ(info['last-delivered-id'])
  if summary[1] > 0 then bound = summary[2] end
  if consumed == nil or less(bound, consumed) then consumed = bound end
end
if consumed == nil then consumed = '0-0' end
for _, g in ipairs(groups) do
  local name = fields(g)['name']
  local old = redis.call('XPENDING', KEYS[1], name, '-', '(' .. ttl_cut, 100000)
  for _, p in ipairs(old) do redis.call('XACK', KEYS[1], name, p[1]) end
end
local cut = consumed
if less(consumed, ttl_cut) then cut = ttl_cut end
local members, bytes, expired, start = {}, 0, 0, '-'
while true do
  local batch = redis.call('XRANGE', KEYS[1], start, '(' .. cut, 'COUNT', 500)
  if #batch == 0 then break end
  for _, e in ipairs(batch) do
    local f = fields(e[2])
    members[#members + 1] = f['r']
    bytes = bytes + tonumber(f['n'])
    if not less(e[1], consumed) then expired = expired + 1 end
  end
  start = '(' .. batch[#batch][1]
end
if #members > 0 then
  redis.call('XTRIM', KEYS[1], 'MINID', cut)
  redis.call('HINCRBY', KEYS[2], 'bytes', -bytes)
end
if expired > 0 then redis.call('HINCRBY', KEYS[2], 'drop:expired', expired) end
return members
"""
)

# KEYS: stream. ARGV: group, consumer, min_idle_ms, count. Returns {id, data, version, deliveries} per claimed group.
CLAIM = """
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], '0-0', 'COUNT', ARGV[4])
local out = {}
for _, e in ipairs(r[2]) do
  if e and e[2] then
    local f = {}
    for i = 1, #e[2], 2 do f[e[2][i]] = e[2][i + 1] end
    local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
    local deliveries = 1
    if p[1] then deliveries = p[1][4] end
    out[#out + 1] = {e[1], f['d'], f['v'], deliveries}
  end
end
return out
"""

# KEYS: stream, meta. Returns the ledger members of every group, then deletes both keys.
DROP = """
local members, start = {}, '-'
while true do
  local batch = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', 500)
  if #batch == 0 then break end
  for _, e in ipairs(batch) do
    for i = 1, #e[2], 2 do if e[2][i] == 'r' then members[#members + 1] = e[2][i + 1] end end
  end
  start = '(' .. batch[#batch][1]
end
redis.call('DEL', KEYS[1], KEYS[2])
return members
"""

# KEYS: stream. ARGV: last-delivered id. Counts the entries after it (lag, where XINFO has none).
LAG = """
local n, start = 0, '(' .. ARGV[1]
while true do
  local batch = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', 1000)
  if #batch == 0 then break end
  n = n + #batch
  start = '(' .. batch[#batch][1]
end
return n
"""
