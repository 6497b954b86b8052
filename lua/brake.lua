--[[ distbrake: one check of one session's streak, atomically.

KEYS[1]  the session's slot, a hash: <key_prefix>:<22 chars of base64url(sha256(session id))>
ARGV[1]  id: 16 bytes of the call hash followed by 8 bytes of the call id's hash (24 bytes)
ARGV[2]  max_repeats, an integer >= 1 (the limit for this tool)
ARGV[3]  ttl in milliseconds
ARGV[4]  tool name (cut to 64 characters by the client)
ARGV[5]  session id (cut to 128 characters by the client)

The slot's fields (short names: every byte of every session counts):
  h  the id of the last call (ARGV[1] form)        n  the streak count
  t  tool name of the last call                    s  session id
  u  time of the last check, seconds, Redis clock (TIME)

Rule: same call hash as h -> n + 1, unless the call id is also the same (a
replay: counted once, same count, same verdict); otherwise n = 1. The call
is denied when n >= max_repeats. The key's TTL is refreshed on every check.

Returns one integer: n * 4 + 2 * denied + replayed.
]]
local key = KEYS[1]
local id = ARGV[1]
local last = redis.call('HMGET', key, 'h', 'n')
local now = redis.call('TIME')[1]
local count
local replayed = 0
if last[1] and string.sub(last[1], 1, 16) == string.sub(id, 1, 16) then
  if last[1] == id then
    count = tonumber(last[2])
    replayed = 1
    redis.call('HSET', key, 'u', now)
  else
    count = tonumber(last[2]) + 1
    redis.call('HSET', key, 'h', id, 'n', count, 'u', now)
  end
else
  count = 1
  redis.call('HSET', key, 'h', id, 'n', 1, 't', ARGV[4], 's', ARGV[5], 'u', now)
end
redis.call('PEXPIRE', key, ARGV[3])
local denied = 0
if count >= tonumber(ARGV[2]) then
  denied = 2
end
return count * 4 + denied + replayed
