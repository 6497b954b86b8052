--[[ distbrake: one check of one session's streak, atomically (or a run of identical checks).

KEYS[1]  the session's streak record, a hash: <key_prefix>:<18 chars of base64url(sha256(session id))>
ARGV[1]  the call, or a run of k identical calls of this session in the order they were
         made: 16 bytes of the call hash, the ttl in milliseconds as 5 bytes big-endian,
         then 5 bytes of each call's call id hash (26 bytes for one call)
ARGV[2]  max_repeats for this tool, an integer >= 1
ARGV[3]  ttl in milliseconds
ARGV[4]  for inspection only: one byte holding the tool name's length (plus 128 when the
         session id's UUIDs are packed: a zero byte and 16 bytes each), the tool name (at most
         64 bytes), then the session id (at most 128 bytes)
ARGV[5]  the replay window in milliseconds (the brake's timeout)
ARGV[6]  what the check is judged by, kept for `inspect` and `list`: the limit in decimal,
         then "w" and warn_at when set, then "s" in shadow mode (enforce=False), then "p" for a
         progress-aware tool (its new streak empties the field r of an earlier one): "3", "5w2s", "5p"
ARGV[7]  in an observation (seven arguments, see below): 8 bytes of the tool result's digest;
         in a check with cycles on (eight arguments): the longest cycle period looked for, 2..4
ARGV[8]  in a check with cycles on: how many repetitions of a cycle deny, 2..10

An observation (seven arguments) records the result of one call of a progress-aware
tool, after the tool ran; ARGV[1] names that call. It is ignored when the streak
has moved on (the record's call hash or last call id is another). If the
previous identical call of this streak had another result, the streak restarts:
its count becomes 1, so the next identical call is checked as 2. Only progress
tools write the field r: 4 bytes of the call hash (so a result from an earlier
streak is never compared) and the 8 bytes of the result digest. Returns 2 when
the streak restarted, 1 when recorded, 0 when ignored.

The record's fields (two, and packed: every byte of every session counts):
  h  16 bytes call hash | 5 bytes last call id | 5 bytes previous call id |
     5 bytes ttl in milliseconds | the count, in decimal
  s  ARGV[4] of the check that started the streak
  j  ARGV[6] of the last check (the limit, warn_at and enforcement the fleet judged it by)
  r  progress-aware tools only: 4 bytes of the call hash | 8 bytes of the last result's digest
  c  sessions checked with cycles on only: the period of the cycle the last call completed and of
     the one the previous call completed (a byte each, 0: none) | one byte n | the ring: the first
     6 bytes of the call hash of each of the session's last n counted calls, oldest first, at most
     ARGV[7] * ARGV[8] of them | the tools of the last ARGV[7] + 1 of those calls, each as one
     length byte and the name (as in ARGV[4])

The time of the last check is the key's expiry, set by Redis's own clock,
minus the ttl kept in h: `inspect` reads it back with TIME and PTTL, and the
script reads it (PTTL) only when a call id repeats.

The rule: a call with the record's call hash counts n + 1, unless its call id is
the last or the previous one of this streak and the last check was at most the
replay window ago: then it is a replay (a retry after a lost reply, or the same
host call passing a second seam), counted once, with the count it got the first
time. The same call id later than that is a new call (hosts that number their
calls afresh every turn reuse ids). Any other call starts a new streak at 1. The
call is denied when its count >= max_repeats; denied calls keep counting. The
key's TTL is refreshed on every check.

A run (k > 1) is how the asyncio brake sends a burst of identical calls of one
session in one round trip: the calls count n + 1 ... n + k, in order. A run is
resent whole after a lost reply, and its last call id is then the record's last
one: the whole run is a replay and gets the counts it got the first time. (A run
counted, then followed by another call before the resend arrives, is no longer
recognised: the record keeps the last two call ids only, to stay small.)

Cycles (eight arguments; never sent as a run): every counted call also enters
the ring of c. A call whose ring ends in ARGV[8] repetitions of one sequence
of p calls (2 <= p <= ARGV[7], the shortest first) that are not all the same
call completes a cycle; denied calls enter the ring too, so a call that goes on
with the cycle completes it again. A replay gets the cycle answer its call got.

Returns one integer for the run's last call: count * 4 + 2 * denied + replayed;
the earlier calls of a run have the counts just below it. A call that completes
a cycle gets an array instead: that integer (denied there means the streak
rule's denial), the period p, the cycle's p ring entries (6 bytes each, as
hex: a client that decodes replies as text reads them too, in order, ending
with this call) and their p tools (length byte and name each).
]]
local rcall, sub, byte, find = redis.call, string.sub, string.byte, string.find
local key = KEYS[1]
local call = ARGV[1]
local argc = #ARGV
if argc == 7 then
  local stored = rcall('HMGET', key, 'h', 'r')
  local record, seen = stored[1], stored[2]
  if not record or sub(record, 1, 21) ~= sub(call, 1, 16) .. sub(call, 22, 26) then
    return 0
  end
  local mine = sub(call, 1, 4) .. ARGV[7]
  if seen and sub(seen, 1, 4) == sub(call, 1, 4) and seen ~= mine then
    rcall('HSET', key, 'h', sub(record, 1, 21) .. '\0\0\0\0\0' .. sub(record, 27, 31) .. '1', 'r', mine)
    return 2
  end
  rcall('HSET', key, 'r', mine)
  return 1
end
-- The common path (a check, cycles off) makes as few strings as it can: each one costs the server.
local size = #call
local k = math.floor((size - 21) / 5)  -- ARGV[1] is 21 + 5k bytes (floor: an integer on Lua 5.3+ too)
local last = sub(call, size - 4)
local limit = tonumber(ARGV[2])
local cycles = argc == 8
local record, ring
local name_list, cycle_reply, parse_ring
if cycles then
  local stored = rcall('HMGET', key, 'h', 'c')
  record, ring = stored[1], stored[2]

  -- The tools part of c (length byte and name each) as a list of names.
  name_list = function(names)
    local list, at = {}, 1
    while at <= #names do
      local length = byte(names, at)
      list[#list + 1] = sub(names, at + 1, at + length)
      at = at + 1 + length
    end
    return list
  end

  -- The cycle answer for a call whose cycle of `period` calls ends at ring entry `at_end` of `entries`.
  cycle_reply = function(code, period, entries, tools, at_end)
    local names, shown = name_list(tools), {}
    for i = #names - (#entries / 6 - at_end) - period + 1, #names - (#entries / 6 - at_end) do
      shown[#shown + 1] = string.char(#names[i]) .. names[i]
    end
    local members = sub(entries, (at_end - period) * 6 + 1, at_end * 6)
    local hex = (string.gsub(members, '.', function(one) return string.format('%02x', byte(one)) end))
    return {code, period, hex, table.concat(shown)}
  end

  -- The ring of c as (periods, entries, tools part).
  parse_ring = function()
    if not ring or #ring < 3 then
      return '\0\0', '', ''
    end
    local n = byte(ring, 3)
    return sub(ring, 1, 2), sub(ring, 4, 3 + n * 6), sub(ring, 4 + n * 6)
  end
else
  record = rcall('HGET', key, 'h')
end
local hash = sub(call, 1, 16)
local n = 0
local before = '\0\0\0\0\0'
if record and find(record, hash, 1, true) == 1 then
  local stored = tonumber(sub(record, 32))
  if stored then
    local last_id = sub(record, 17, 21)
    local count = nil
    if last == last_id then
      count = stored
    elseif k == 1 and stored > 1 and find(record, last, 22, true) == 22 then
      count = stored - 1
    end
    if count then
      local b1, b2, b3, b4, b5 = byte(record, 27, 31)
      local ttl = (((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5
      if ttl - rcall('PTTL', key) <= tonumber(ARGV[5]) then
        rcall('PEXPIRE', key, ARGV[3])
        local code = count * 4 + 1
        if count >= limit then
          code = count * 4 + 3
        end
        if cycles then
          local periods, entries, tools = parse_ring()
          local previous = count ~= stored and 1 or 0
          local period = byte(periods, 1 + previous)
          local at_end = #entries / 6 - previous
          if period > 0 and at_end >= period and #name_list(tools) >= period + previous then
            return cycle_reply(code, period, entries, tools, at_end)
          end
        end
        return code
      end
    end
    n = stored
    before = last_id
  end
end
local count = n + k
if k > 1 then
  before = sub(call, size - 9, size - 5)
end
local fields = hash .. last .. before .. sub(call, 17, 21) .. count
local code = count * 4
if count >= limit then
  code = count * 4 + 2
end
local renew = n == 0 and record and byte(ARGV[6], -1) == 112
if not cycles then
  if renew then
    -- a progress-aware call starts a streak: no result of this streak yet (r emptied, never compared)
    rcall('HSET', key, 'h', fields, 'j', ARGV[6], 's', ARGV[4], 'r', '')
  elseif n == 0 then
    rcall('HSET', key, 'h', fields, 'j', ARGV[6], 's', ARGV[4])
  else
    rcall('HSET', key, 'h', fields, 'j', ARGV[6])
  end
  rcall('PEXPIRE', key, ARGV[3])
  return code
end

-- Cycles on: the ring step, written with the record in one HSET.
local periods, entries, tools = parse_ring()
local longest, repeats = tonumber(ARGV[7]), tonumber(ARGV[8])
local size_byte = byte(ARGV[4], 1) % 128
entries = entries .. string.rep(sub(call, 1, 6), k)
if #entries > longest * repeats * 6 then
  entries = sub(entries, -longest * repeats * 6)
end
tools = tools .. string.rep(string.char(size_byte) .. sub(ARGV[4], 2, 1 + size_byte), k)
local kept, at = 0, 1
while at <= #tools do
  kept = kept + 1
  at = at + 1 + byte(tools, at)
end
while kept > longest + 1 do
  tools = sub(tools, 2 + byte(tools, 1))
  kept = kept - 1
end
local period = 0
local filled, newest = #entries, sub(entries, -6)
for p = 2, longest do
  local span = p * repeats * 6
  if filled < span then
    break
  end
  -- first the one comparison that rules most calls out: this call against the one p calls before it
  if newest == sub(entries, filled - p * 6 - 5, filled - p * 6) then
    local window = sub(entries, -span)
    if sub(window, 1, span - p * 6) == sub(window, p * 6 + 1)
        and sub(window, 1, p * 6) ~= string.rep(sub(window, 1, 6), p) then
      period = p
      break
    end
  end
end
local c = string.char(period, byte(periods, 1), #entries / 6) .. entries .. tools
if renew then
  rcall('HSET', key, 'h', fields, 'j', ARGV[6], 's', ARGV[4], 'r', '', 'c', c)
elseif n == 0 then
  rcall('HSET', key, 'h', fields, 'j', ARGV[6], 's', ARGV[4], 'c', c)
else
  rcall('HSET', key, 'h', fields, 'j', ARGV[6], 'c', c)
end
rcall('PEXPIRE', key, ARGV[3])
if period > 0 then
  return cycle_reply(code, period, entries, tools, #entries / 6)
end
return code
