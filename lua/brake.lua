--[[ distbrake: one check of one session's streak, atomically.

KEYS[1]  the session's streak record, a hash: <key_prefix>:<18 chars of base64url(sha256(session id))>
ARGV[1]  the call: 16 bytes of its call hash, 5 bytes of its call id's hash, then the
         ttl in milliseconds as 5 bytes, big-endian (26 bytes)
ARGV[2]  max_repeats for this tool, an integer >= 1
ARGV[3]  ttl in milliseconds
ARGV[4]  for inspection only: one byte holding the tool name's length, the tool name
         (at most 64 bytes), then the session id (at most 128 bytes)

The record's fields (two, and packed: every byte of every session counts):
  h  16 bytes call hash | 5 bytes last call id | 5 bytes previous call id |
     5 bytes ttl in milliseconds | the count, in decimal
  s  ARGV[4] of the check that started the streak

The time of the last check is the key's expiry, set by Redis's own clock,
minus the ttl kept in h: `inspect` reads it back with TIME and PTTL, and the
script needs no clock call of its own.

The rule: a call with the record's call hash counts n + 1, unless its call id is
the last or the previous one of this streak: then it is a replay (a retry, or
the same host call passing a second seam), counted once, with the count it got
the first time. Any other call starts a new streak at 1. The call is denied
when its count >= max_repeats; denied calls keep counting. The key's TTL is
refreshed on every check.

Returns one integer: count * 4 + 2 * denied + replayed.
]]
local rcall = redis.call
local key = KEYS[1]
local call = ARGV[1]
local record = rcall('HGET', key, 'h')
local count = 1
local replayed = 0
local last_id = '\0\0\0\0\0'
if record and string.sub(record, 1, 16) == string.sub(call, 1, 16) then
  local n = tonumber(string.sub(record, 32))
  if n then
    local id = string.sub(call, 17, 21)
    last_id = string.sub(record, 17, 21)
    if id == last_id then
      count, replayed = n, 1
    elseif n > 1 and id == string.sub(record, 22, 26) then
      count, replayed = n - 1, 1
    else
      count = n + 1
    end
  end
end
if replayed == 0 then
  if count == 1 then
    rcall('HSET', key, 'h', string.sub(call, 1, 21) .. last_id .. string.sub(call, 22) .. '1',
          's', ARGV[4])
  else
    rcall('HSET', key, 'h', string.sub(call, 1, 21) .. last_id .. string.sub(call, 22) .. count)
  end
end
rcall('PEXPIRE', key, ARGV[3])
if count >= tonumber(ARGV[2]) then
  return count * 4 + 2 + replayed
end
return count * 4 + replayed
