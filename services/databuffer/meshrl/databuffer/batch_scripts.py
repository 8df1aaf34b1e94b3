"""The Lua scripts of the keyed batch store (meshrl.databuffer.batches): the commit that swaps a batch's
manifest to a fully staged generation, and the delete of one generation; each runs atomically on the hash
slot of one batch (its manifest and chunks share a hash tag), so they work on a Redis Cluster.
"""

# KEYS: manifest, new chunks (ARGV[12] of them), old chunks.
# ARGV: overwrite, expected_gen, gen, n, cb, bytes, header, created_ms, ttl_ms, chunk_ttl_ms, grace_ms, n_new, old_n,
#       channel, tag, check_sizes, rows. With a grace period the old generation stays readable a while, named in
#       'pg'/'pn' (delete removes it). Publishes the tag on the commit channel (waiting gets wake up). check_sizes
#       '1' (chunks a client staged itself): each chunk must hold cb bytes, the last one the rest. rows: the batch's
#       (counted by the zero-RPC get, meshrl.databuffer.zero_rpc_scripts).
COMMIT = """
local cur = redis.call('HGET', KEYS[1], 'gen')
if not cur then cur = '' end
if ARGV[1] == '0' and cur ~= '' then return {'exists', cur, ''} end
if cur == ARGV[3] then return {'samegen', cur, ''} end
if cur ~= ARGV[2] then return {'changed', cur, redis.call('HGET', KEYS[1], 'n') or '0'} end
local n_new = tonumber(ARGV[12])
for i = 2, 1 + n_new do
  if redis.call('EXISTS', KEYS[i]) == 0 then return {'missing', KEYS[i], ''} end
  if ARGV[16] == '1' then
    local want = tonumber(ARGV[5])
    if i == 1 + n_new then want = tonumber(ARGV[6]) - want * (n_new - 1) end
    local got = redis.call('STRLEN', KEYS[i])
    if got ~= want then return {'size', KEYS[i], tostring(got) .. ' ' .. tostring(want)} end
  end
end
redis.call('DEL', KEYS[1], string.sub(KEYS[1], 1, -2) .. 'v')
redis.call('HSET', KEYS[1], 'gen', ARGV[3], 'n', ARGV[4], 'cb', ARGV[5], 'bytes', ARGV[6], 'h', ARGV[7], 't', ARGV[8],
  'r', ARGV[17])
if cur ~= '' and tonumber(ARGV[11]) > 0 then redis.call('HSET', KEYS[1], 'pg', cur, 'pn', ARGV[13]) end
redis.call('PEXPIRE', KEYS[1], ARGV[9])
for i = 2, 1 + n_new do redis.call('PEXPIRE', KEYS[i], ARGV[10]) end
for i = 2 + n_new, #KEYS do
  if tonumber(ARGV[11]) > 0 then redis.call('PEXPIRE', KEYS[i], ARGV[11]) else redis.call('DEL', KEYS[i]) end
end
redis.call('PUBLISH', ARGV[14], ARGV[15])
return {'ok', cur, ''}
"""

# KEYS: manifest, chunks. ARGV: expected gen. Returns 1 deleted, 0 absent, -1 changed meanwhile. Both scripts
# also delete the batch's value key ('{tag}:v', where a zero-RPC put keeps a one-value payload).
DELETE = """
local cur = redis.call('HGET', KEYS[1], 'gen')
if not cur then return 0 end
if cur ~= ARGV[1] then return -1 end
for i = 1, #KEYS do redis.call('DEL', KEYS[i]) end
redis.call('DEL', string.sub(KEYS[1], 1, -2) .. 'v')
return 1
"""
