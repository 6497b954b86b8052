--[[ distbrake: one check of one session's streak, atomically.

KEYS[1]  the session's slot, a hash: <key_prefix>:<18 chars of base64url(sha256(session id))>
ARGV[1]  the call: 16 bytes of its call hash, then 5 bytes of its call id's hash (21 bytes)
ARGV[2]  max_repeats for this tool, an integer >= 1
ARGV[3]  ttl in milliseconds
ARGV[4]  for inspection only: one byte holding the tool name's length, the tool name
         (at most 64 bytes), then the session id (at most 128 bytes)

The slot's fields (two, and packed: every byte of every session counts):
  h  16 bytes call hash | 5 bytes last call id | 5 bytes previous call id |
     4 bytes time of the last counted check (seconds, big-endian, from Redis's
     own clock: TIME) | the count, in decimal
  s  ARGV[4] of the check that started the streak

The rule: a call with the slot's call hash counts n + 1, unless its call id is
the last or the previous one of this streak: then it is a replay (a retry, or
the same host call passing a second seam), counted once, with the count it got
the first time. Any other call starts a new streak at 1. The call is denied
when its count >= max_repeats; denied calls keep counting. The key's TTL is
refreshed on every check.

Returns one integer: count * 4 + 2 * denied + replayed.
]]
local key = KEYS[1]
local call = ARGV[1]
local slot = redis.call('HGET', key, 'h')
local count = 1
local replayed = 0
local last_id = '\0\0\0\0\0'
if slot and string.sub(slot, 1, 16) == string.sub(call, 1, 16) then
  local n = tonumber(string.sub(slot, 31))
  if n then
    local id = string.sub(call, 17, 21)
    last_id = string.sub(slot, 17, 21)
    if id == last_id then
      count, replayed = n, 1
    elseif n > 1 and id == string.sub(slot, 22, 26) then
      count, replayed = n - 1, 1
    else
      count = n + 1
    end
  end
end
if replayed == 0 then
  local t = tonumber(redis.call('TIME')[1])
  local stamp = string.char(math.floor(t / 16777216) % 256, math.floor(t / 65536) % 256,
                            math.floor(t / 256) % 256, t % 256)
  if count == 1 then
    redis.call('HSET', key, 'h', call .. '\0\0\0\0\0' .. stamp .. '1', 's', ARGV[4])
  else
    redis.call('HSET', key, 'h', call .. last_id .. stamp .. count)
  end
end
redis.call('PEXPIRE', key, ARGV[3])
local denied = 0
if count >= tonumber(ARGV[2]) then
  denied = 2
end
return count * 4 + denied + replayed
