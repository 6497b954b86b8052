--[[ distbrake: one check of one session's streak, atomically (or a run of identical checks).

The names below (ARGV slots, modes, byte ranges, fields, reply codes) are the wire contract; its twin is
distbrake/redis/contract.py, with the same names and the same numbers. A byte range is given by its end:
bytes END_A + 1 .. END_B here are [END_A:END_B] in Python. What Redis runs has each name folded into its value
(distbrake/redis/script.py, `fold_contract`; the block's lines left empty, so line numbers hold): Redis runs this
body anew for every check, and each local the block made cost every check server CPU.

KEYS[1]         the session's streak record, a hash: <key_prefix>:<18 chars of base64url(sha256(session id))>
ARGV[CALL]      the call, or a run of k identical calls of this session in the order they were
                made: the call hash (to CALL_HASH_END: 16 bytes), the ttl in milliseconds (to
                CALL_TTL_END: 5 bytes big-endian), then each call's call id hash (ID_BYTES each:
                26 bytes for one call)
ARGV[MODE]      what is asked: MODE_CHECK ('c', a check or a run), MODE_CYCLES ('y', a check with
                the cycle rule on, never a run), MODE_LADDER ('l', a check with the ladder's rules, never a
                run), MODE_OBSERVE ('o', an observation, see below), MODE_FAILED ('f', a failure
                observation), MODE_BLOCK ('b', an operator's block) or MODE_UNBLOCK ('u', lift a halt)
ARGV[LIMIT]     max_repeats for this tool, an integer >= 1 (read by MODE_LADDER only)
ARGV[TTL]       ttl in milliseconds
ARGV[ABOUT]     for inspection only: one byte holding the tool name's length (plus ABOUT_PACKED_UUID,
                128, when the session id's UUIDs are packed: a zero byte and 16 bytes each), the tool
                name (at most 64 bytes), then the session id (at most 128 bytes)
ARGV[WINDOW]    the replay window in milliseconds (the brake's timeout)
ARGV[JUDGED]    what the check is judged by, kept for `inspect` and `list`: the limit in decimal,
                then "w" and warn_at when set, then "s" in shadow mode (enforce=False), then "p" for a
                progress-aware tool (its new streak empties the field r of an earlier one): "3", "5w2s", "5p"
ARGV[RESULT]    MODE_OBSERVE: 8 bytes of the tool result's digest
ARGV[LONGEST]   MODE_CYCLES: the longest cycle period looked for, 2..4 (the same slot as RESULT)
ARGV[REPEATS]   MODE_CYCLES: how many repetitions of a cycle deny, 2..10
ARGV[LADDER]    MODE_LADDER, its only argument after JUDGED (the same slot as RESULT): LADDER_BYTES (17) bytes, read
                by one string.byte (no string made, nothing parsed): once (1 or 0), enforce (1 or 0),
                cycle_halt_repeats, the longest cycle period and the cycle's repetitions (as ARGV[LONGEST] and
                ARGV[REPEATS]; 0 and 0 when cycles are off), a byte each, then halt_at, max_failures and max_calls,
                4 bytes big-endian each; 0 for a rule that is off
ARGV[NOW]       MODE_LADDER for a once-only tool: the worker's clock, Unix seconds, 4 bytes big-endian (kept as the
                time of a once-only call that runs; the server's TIME would cost each such check more)
ARGV[HALT_INFO] MODE_BLOCK: the field x to write (the same slot as CALL); ARGV[TTL] its ttl (>= 1 ms),
                ARGV[ABOUT] the field s for a session without a record (or '')

An observation (MODE_OBSERVE) records the result of one call of a progress-aware
tool, after the tool ran; ARGV[CALL] names that call. It is ignored when the streak
has moved on (the record's call hash or last call id is another). If the
previous identical call of this streak had another result, the streak restarts:
its count becomes 1, so the next identical call is checked as 2. Only progress
tools write the field r: 4 bytes of the call hash (to R_HASH_END, so a result from
an earlier streak is never compared) and the 8 bytes of the result digest. Returns
OBSERVE_RESTARTED (2) when the streak restarted, OBSERVE_RECORDED (1) when recorded,
OBSERVE_IGNORED (0) when ignored.

A failure observation (MODE_FAILED, after a call of a tool with max_failures ran): ARGV[RESULT] '1' (it
failed) adds one to the tool's failures in a row in f<tool> (the same call id twice counts once), '0'
(it succeeded) empties f<tool> (when it holds a failure). Ignored (OBSERVE_IGNORED) when the session has no record or is halted.

A halted session (h ends with HALTED, '!': "5/3!") is refused before anything: a check
(any mode, a run too) gets {REPLY_HALTED, x}, nothing counted, nothing written, the TTL not refreshed (a
halt lasts its TTL from the moment it was set); an observation is ignored. It is halted by a check in
MODE_LADDER (below) or by an operator: MODE_BLOCK appends HALTED to h (or writes h = 16 zero bytes |
NO_ID | NO_ID | ttl | "0!" when there is no record), writes x, sets the key's TTL to ARGV[TTL] (>= 1; h
keeps that ttl) and returns 1; MODE_UNBLOCK deletes a halted session's record (returns 1), and leaves any
other alone (returns 0).

The ladder (MODE_LADDER; the twin of distbrake/model.py's `check`): the streak step (and the ring step
when ARGV[LADDER] has a longest period) as in MODE_CHECK/MODE_CYCLES, then the call's facts: once_since (the
Unix seconds of the entry of o with this call's hash, unless this is a replay of that entry's call id),
failures (of f<tool>), the call's number among the tool's calls (n<tool> + 1, written, for a counted
call; for a replay, n<tool> less the calls counted since), all 0 when the rule is off. Judged in the
model's order (halt_at or a cycle repeated cycle_halt_repeats times, repeat, cycle, once, failures,
cap), a counted call (never a replay) then has its effects: a halt, when enforced, writes HALTED and x
(rule kind 'repeat' by halt_at, else 'cycle'); else a once-only call that runs (not denied, or shadow
mode) whose hash is not in o yet is appended to o (ONCE_ENTRIES at most, the oldest dropped; its time is
ARGV[NOW]). TIME is read only for a halt. Reply: {code, once_since, failures, calls, halts (1: the cycle halts)}, and a
completed cycle's period, hashes and tools after them; when those four are all 0, the reply of
MODE_CHECK (or MODE_CYCLES with cycles on) instead: the ladder has nothing to judge but the count.

The record's fields (packed: every byte of every session counts):
  h (FIELD_STREAK)  call hash (to H_HASH_END: 16 bytes) | last call id (to H_LAST_END) |
                    previous call id (to H_PREVIOUS_END) | ttl in milliseconds (to H_TTL_END) |
                    the count, in decimal | H_JUDGED_MARK ('/') | ARGV[JUDGED] of the last check (the limit,
                    warn_at and enforcement the fleet judged it by): "<31 bytes>5/3"
  s (FIELD_ABOUT)   ARGV[ABOUT] of the check that started the streak
  r (FIELD_RESULT)  progress-aware tools only: 4 bytes of the call hash | 8 bytes of the last result's digest
  c (FIELD_RING)    sessions checked with cycles on only: the period of the cycle the last call completed and
                    of the one the previous call completed (a byte each, 0: none) | one byte n | the ring: the
                    first RING_ENTRY (6) bytes of the call hash of each of the session's last n counted calls,
                    oldest first, at most ARGV[LONGEST] * ARGV[REPEATS] of them | the tools of the last
                    ARGV[LONGEST] + 1 of those calls, each as one length byte and the name (as in ARGV[ABOUT])
  x (FIELD_HALT)    halted sessions only: since (Unix ms), kind, count, limit, hash prefix (12 hex), who, reason,
                    tool, joined by NUL bytes
  o (FIELD_ONCE)    once-only tools only: ONCE_ENTRY (17) bytes per call that ran: ONCE_HASH (8) bytes of the call
                    hash | call id (5) | Unix seconds (4, big-endian: ARGV[NOW]), oldest first
  f<tool>           max_failures only: call id (5) of the tool's last failure | its failures in a row, decimal
                    (empty after a success)
  n<tool>           max_calls only: the tool's counted calls in the session, decimal (<tool>: as in ARGV[ABOUT])
Ladder rules off, an unhalted session's record is what it was before them (no field more).
Records of earlier versions are read as they are, and their streaks go on: their h ends with the count (no
H_JUDGED_MARK; the count is read up to the first byte that is not a digit), and a field j (FIELD_JUDGED in
contract.py) held ARGV[JUDGED], which `inspect` reads when h has none. The script never writes j: a streak
that goes on writes one field, h.

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
recognised: the record keeps the last two call ids only, to stay small.) A run whose call ids
repeat, among its own calls or the record's last two (a host's retry racing its first attempt, a
new call racing a retry), and is not such a resend, is counted call by call as the calls would be
one at a time: the reply is then an array of one integer per call, in order.

Cycles (MODE_CYCLES; never sent as a run): every counted call also enters
the ring of c. A call whose ring ends in ARGV[REPEATS] repetitions of one sequence
of p calls (2 <= p <= ARGV[LONGEST], the shortest first) that are not all the same
call completes a cycle; denied calls enter the ring too, so a call that goes on
with the cycle completes it again. A replay gets the cycle answer its call got.

Returns one integer for the run's last call: count * REPLY_COUNT (4) + REPLY_REPLAYED (1) when a
replay; the earlier calls of a run have the counts just below it. The script counts; the client's
rule model judges the count (max_repeats, warn_at, shadow mode), so a check's reply says nothing of
a denial and ARGV[LIMIT] is read by the ladder alone. A call that completes a cycle gets an array
instead (CYCLE_REPLY): that integer, the period p, the cycle's p ring entries (RING_ENTRY bytes each,
as hex: a client that decodes replies as text reads them too, in order, ending with this call)
and their p tools (length byte and name each).
]]
-- The wire contract (twin of distbrake/redis/contract.py; folded into the code when loaded, see above).
local CALL, MODE, LIMIT, TTL, ABOUT, WINDOW, JUDGED = 1, 2, 3, 4, 5, 6, 7
local RESULT, LONGEST, REPEATS, LADDER, LADDER_BYTES, NOW, HALT_INFO = 8, 8, 9, 8, 17, 9, 1
local MODE_CHECK, MODE_CYCLES, MODE_OBSERVE, MODE_LADDER = 'c', 'y', 'o', 'l'
local MODE_FAILED, MODE_BLOCK, MODE_UNBLOCK = 'f', 'b', 'u'
local CALL_HASH_END, CALL_TTL_END, ID_BYTES = 16, 21, 5
local H_HASH_END, H_LAST_END, H_PREVIOUS_END, H_TTL_END, H_JUDGED_MARK = 16, 21, 26, 31, '/'
local R_HASH_END, RING_ENTRY, ABOUT_PACKED_UUID = 4, 6, 128
local FIELD_STREAK, FIELD_ABOUT, FIELD_RESULT, FIELD_RING = 'h', 's', 'r', 'c'
local FIELD_HALT, FIELD_ONCE, FIELD_FAILURES, FIELD_CALLS = 'x', 'o', 'f', 'n'
local HALTED, HALTED_BYTE, ONCE_HASH, ONCE_ENTRY, ONCE_ENTRIES = '!', 33, 8, 17, 64
local REPLY_COUNT, REPLY_REPLAYED, REPLY_HALTED = 4, 1, 0
local OBSERVE_IGNORED, OBSERVE_RECORDED, OBSERVE_RESTARTED = 0, 1, 2
local NO_ID = '\0\0\0\0\0'  -- ID_BYTES zero bytes: no call id

local string, ARGV = string, ARGV  -- locals: a global is a table look-up each time it is read
local rcall, sub, byte, find, char = redis.call, string.sub, string.byte, string.find, string.char
local key = KEYS[1]
local call = ARGV[CALL]
local mode = ARGV[MODE]

local plain, cycles, ladder = true, false, false
if mode ~= MODE_CHECK then
  plain = false
  if mode == MODE_OBSERVE then
    local stored = rcall('HMGET', key, FIELD_STREAK, FIELD_RESULT)
    local record, seen = stored[1], stored[2]
    if not record or byte(record, -1) == HALTED_BYTE or sub(record, 1, H_LAST_END)
        ~= sub(call, 1, CALL_HASH_END) .. sub(call, CALL_TTL_END + 1, CALL_TTL_END + ID_BYTES) then
      return OBSERVE_IGNORED
    end
    local mine = sub(call, 1, R_HASH_END) .. ARGV[RESULT]
    if seen and sub(seen, 1, R_HASH_END) == sub(call, 1, R_HASH_END) and seen ~= mine then
      local mark = find(record, H_JUDGED_MARK, H_TTL_END + 1, true)
      rcall('HSET', key, FIELD_STREAK, sub(record, 1, H_LAST_END) .. NO_ID
        .. sub(record, H_PREVIOUS_END + 1, H_TTL_END) .. '1' .. (mark and sub(record, mark) or ''), FIELD_RESULT, mine)
      return OBSERVE_RESTARTED
    end
    rcall('HSET', key, FIELD_RESULT, mine)
    return OBSERVE_RECORDED
  elseif mode == MODE_FAILED then
    local record = rcall('HGET', key, FIELD_STREAK)
    if not record or byte(record, -1) == HALTED_BYTE then
      return OBSERVE_IGNORED
    end
    -- the tool's field: its name as ARGV[ABOUT] holds it (after the length byte)
    local field = FIELD_FAILURES .. sub(ARGV[ABOUT], 2, 1 + byte(ARGV[ABOUT], 1) % ABOUT_PACKED_UUID)
    local seen = rcall('HGET', key, field)
    if ARGV[RESULT] ~= '1' then  -- a success: the tool's failures in a row start again (the field emptied)
      if seen and seen ~= '' then
        rcall('HSET', key, field, '')
      end
      return OBSERVE_RECORDED
    end
    local id = sub(call, CALL_TTL_END + 1, CALL_TTL_END + ID_BYTES)
    local failed = 0
    if seen then
      if sub(seen, 1, ID_BYTES) == id then
        return OBSERVE_IGNORED  -- this call's failure was observed already
      end
      failed = tonumber(sub(seen, ID_BYTES + 1)) or 0
    end
    rcall('HSET', key, field, id .. string.format('%d', failed + 1))
    return OBSERVE_RECORDED
  elseif mode == MODE_BLOCK then
    local record = rcall('HGET', key, FIELD_STREAK)
    local ttl, packed = tonumber(ARGV[TTL]), {}
    for i = 5, 1, -1 do  -- the ttl as field h keeps it: 5 bytes big-endian
      packed[i] = char(math.floor(ttl / 256 ^ (5 - i)) % 256)
    end
    packed = table.concat(packed)
    local head, tail = string.rep('\0', CALL_HASH_END) .. NO_ID .. NO_ID, '0'
    if record and #record > H_TTL_END then
      head, tail = sub(record, 1, H_PREVIOUS_END), sub(record, H_TTL_END + 1)
    end
    if byte(tail, -1) ~= HALTED_BYTE then
      tail = tail .. HALTED
    end
    if record or ARGV[ABOUT] == '' then
      rcall('HSET', key, FIELD_STREAK, head .. packed .. tail, FIELD_HALT, ARGV[HALT_INFO])
    else
      rcall('HSET', key, FIELD_STREAK, head .. packed .. tail, FIELD_HALT, ARGV[HALT_INFO],
        FIELD_ABOUT, ARGV[ABOUT])
    end
    rcall('PEXPIRE', key, ttl)
    return 1
  elseif mode == MODE_UNBLOCK then
    local record = rcall('HGET', key, FIELD_STREAK)
    if record and byte(record, -1) == HALTED_BYTE then
      return rcall('PEXPIRE', key, 0)  -- a timeout of 0 deletes the key (no command the checks do not run)
    end
    return 0
  elseif mode == MODE_LADDER then
    ladder = true
  elseif mode == MODE_CYCLES then
    cycles = true
  else
    return redis.error_reply('ERR distbrake: unknown mode')
  end
end
-- The common path (a check, cycles off) makes as few strings as it can: each one costs the server.
local size = #call
-- ARGV[CALL] is CALL_TTL_END + ID_BYTES * k bytes (floor: an integer on Lua 5.3+ too)
local k = 1
if size > CALL_TTL_END + ID_BYTES then
  k = math.floor((size - CALL_TTL_END) / ID_BYTES)
end
local last = sub(call, size - ID_BYTES + 1)
local hash = sub(call, 1, CALL_HASH_END)
local record, ring
local name_list, cycle_reply, parse_ring, period_of
-- The cycle rule's longest period and repetitions (ARGV[LONGEST] and ARGV[REPEATS], or ARGV[LADDER]'s)
local longest, repeats
-- ARGV[LADDER]'s rules (0: off): once, enforce, cycle_halt_repeats, halt_at, max_failures, max_calls
local once, enforce, halt_repeats, halt_at, max_failures, max_calls
local once_list, failed, calls, tool  -- MODE_LADDER: the fields o, f<tool> and n<tool>, and the tool
if plain then
  record = rcall('HGET', key, FIELD_STREAK)
else
  if ladder then
    local h1, h2, h3, h4, f1, f2, f3, f4, c1, c2, c3, c4
    once, enforce, halt_repeats, longest, repeats, h1, h2, h3, h4, f1, f2, f3, f4, c1, c2, c3, c4 =
      byte(ARGV[LADDER], 1, LADDER_BYTES)
    halt_at = ((h1 * 256 + h2) * 256 + h3) * 256 + h4
    max_failures = ((f1 * 256 + f2) * 256 + f3) * 256 + f4
    max_calls = ((c1 * 256 + c2) * 256 + c3) * 256 + c4
    cycles = longest > 0
  elseif cycles then
    longest, repeats = tonumber(ARGV[LONGEST]), tonumber(ARGV[REPEATS])
  end
  if ladder and (cycles or once > 0 or max_failures > 0 or max_calls > 0) then
    -- the fields of the rules that are on ('' names no field: nil)
    if max_failures > 0 or max_calls > 0 then
      tool = sub(ARGV[ABOUT], 2, 1 + byte(ARGV[ABOUT], 1) % ABOUT_PACKED_UUID)
    end
    if cycles or max_failures > 0 or max_calls > 0 then
      local stored = rcall('HMGET', key, FIELD_STREAK, cycles and FIELD_RING or '', once > 0 and FIELD_ONCE or '',
        max_failures > 0 and FIELD_FAILURES .. tool or '', max_calls > 0 and FIELD_CALLS .. tool or '')
      record, ring, once_list, failed, calls = stored[1], stored[2], stored[3], stored[4], stored[5]
    else  -- once-only alone (each field asked for costs the server: none more)
      local stored = rcall('HMGET', key, FIELD_STREAK, FIELD_ONCE)
      record, once_list = stored[1], stored[2]
    end
  elseif cycles then
    local stored = rcall('HMGET', key, FIELD_STREAK, FIELD_RING)
    record, ring = stored[1], stored[2]
  else  -- halt_at alone
    record = rcall('HGET', key, FIELD_STREAK)
  end

  if cycles then
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
      local n = #entries / RING_ENTRY
      for i = #names - (n - at_end) - period + 1, #names - (n - at_end) do
        shown[#shown + 1] = char(#names[i]) .. names[i]
      end
      local members = sub(entries, (at_end - period) * RING_ENTRY + 1, at_end * RING_ENTRY)
      local hex = (string.gsub(members, '.', function(one) return string.format('%02x', byte(one)) end))
      return {code, period, hex, table.concat(shown)}
    end

    -- The ring of c as (periods, entries, tools part).
    parse_ring = function()
      if not ring or #ring < 3 then
        return '\0\0', '', ''
      end
      local n = byte(ring, 3)
      return sub(ring, 1, 2), sub(ring, 4, 3 + n * RING_ENTRY), sub(ring, 4 + n * RING_ENTRY)
    end

    -- The shortest period p (2..longest) whose `repeats` repetitions end the ring `entries`, else 0.
    period_of = function(entries, longest, repeats)
      local filled, newest = #entries, sub(entries, -RING_ENTRY)
      for p = 2, longest do
        local span = p * repeats * RING_ENTRY
        if filled < span then
          break
        end
        -- first the one comparison that rules most calls out: this call against the one p calls before it
        if newest == sub(entries, filled - (p + 1) * RING_ENTRY + 1, filled - p * RING_ENTRY) then
          local window = sub(entries, -span)
          if sub(window, 1, span - p * RING_ENTRY) == sub(window, p * RING_ENTRY + 1)
              and sub(window, 1, p * RING_ENTRY) ~= string.rep(sub(window, 1, RING_ENTRY), p) then
            return p
          end
        end
      end
      return 0
    end
  end

end
local stored = nil  -- the record's count when it holds this call's streak
if record then
  -- A halted session (h ends with HALTED): refused, nothing counted or written, the TTL left as it is.
  if byte(record, -1) == HALTED_BYTE then
    return {REPLY_HALTED, rcall('HGET', key, FIELD_HALT) or ''}
  end
  if find(record, hash, 1, true) == 1 then
    -- the count's digits, up to H_JUDGED_MARK (or the end, in a record of an older version): read as bytes,
    -- the first three by one string.byte, a count of one or two digits (most streaks) without a loop (every
    -- call of a string function, and every Lua instruction, costs each check server CPU); no digit (a record
    -- not of ours): no count, a new streak
    local d1, d2, d3 = byte(record, H_TTL_END + 1, H_TTL_END + 3)
    if d1 and d1 >= 48 and d1 <= 57 then
      if not (d2 and d2 >= 48 and d2 <= 57) then
        stored = d1 - 48
      elseif not (d3 and d3 >= 48 and d3 <= 57) then
        stored = (d1 - 48) * 10 + d2 - 48
      else  -- three digits or more: the rest byte by byte
        local value, at = ((d1 - 48) * 10 + d2 - 48) * 10 + d3 - 48, H_TTL_END + 4
        local digit = byte(record, at)
        while digit and digit >= 48 and digit <= 57 do
          value, at = value * 10 + digit - 48, at + 1
          digit = byte(record, at)
        end
        stored = value
      end
    end
  end
end
local n = 0
local before = NO_ID
-- what the ladder judges: a replay and its count, the streak's reply, its cycle's period, whether it halts, field h
local replayed, count, reply, period, halts, streak = false, nil, nil, 0, false, nil
if stored then
  local last_id = sub(record, H_HASH_END + 1, H_LAST_END)
  local again = nil
  -- a run is resent whole when its last two call ids are the record's last two
  if last == last_id and (k == 1 or sub(call, size - 2 * ID_BYTES + 1, size - ID_BYTES)
      == sub(record, H_LAST_END + 1, H_PREVIOUS_END)) then
    again = stored
  elseif k == 1 and stored > 1 and find(record, last, H_LAST_END + 1, true) == H_LAST_END + 1 then
    again = stored - 1
  end
  if again then
    local b1, b2, b3, b4, b5 = byte(record, H_PREVIOUS_END + 1, H_TTL_END)
    local ttl = (((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5
    if ttl - rcall('PTTL', key) <= tonumber(ARGV[WINDOW]) then
      rcall('PEXPIRE', key, ARGV[TTL])
      local code = again * REPLY_COUNT + REPLY_REPLAYED
      reply = code
      if cycles then
        local periods, entries, tools = parse_ring()
        local previous = again ~= stored and 1 or 0
        period = byte(periods, 1 + previous)
        local at_end = #entries / RING_ENTRY - previous
        if period > 0 and at_end >= period and #name_list(tools) >= period + previous then
          reply = cycle_reply(code, period, entries, tools, at_end)
        else
          period = 0
        end
      end
      if not ladder then
        return reply
      end
      replayed, count = true, again  -- judged by the ladder below
    end
  end
  n = stored
  before = last_id
end
if not replayed then
  if k > 1 then
    -- A run whose call ids repeat (among its calls, or the record's last two) is counted call by call, each
    -- as it would be alone: a replay keeps the count it got; the reply is then an array, a code per call.
    local seen, previous, mixed = {}, n > 0 and sub(record, H_LAST_END + 1, H_PREVIOUS_END), false
    for at = CALL_TTL_END + 1, size, ID_BYTES do
      local id = sub(call, at, at + ID_BYTES - 1)
      if seen[id] or id == before or id == previous then
        mixed = true
        break
      end
      seen[id] = true
    end
    if mixed and not cycles then
      local c, newest, older, fresh, counted, replies = n, before, previous or NO_ID, nil, false, {}
      for at = CALL_TTL_END + 1, size, ID_BYTES do
        local id = sub(call, at, at + ID_BYTES - 1)
        local again = nil
        if c > 0 and (id == newest or (c > 1 and id == older)) then
          if fresh == nil then
            local b1, b2, b3, b4, b5 = byte(record, H_PREVIOUS_END + 1, H_TTL_END)
            local ttl = (((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5
            fresh = ttl - rcall('PTTL', key) <= tonumber(ARGV[WINDOW])
          end
          if fresh then
            again = id == newest and c or c - 1
          end
        end
        if again then
          replies[#replies + 1] = again * REPLY_COUNT + REPLY_REPLAYED
        else
          c, older, newest, counted, fresh = c + 1, newest, id, true, true
          replies[#replies + 1] = c * REPLY_COUNT
        end
      end
      if counted then
        local fields = hash .. newest .. older .. sub(call, CALL_HASH_END + 1, CALL_TTL_END) .. c .. H_JUDGED_MARK
          .. ARGV[JUDGED]
        if n == 0 and record and byte(ARGV[JUDGED], -1) == 112 then
          rcall('HSET', key, FIELD_STREAK, fields, FIELD_ABOUT, ARGV[ABOUT], FIELD_RESULT, '')
        elseif n == 0 then
          rcall('HSET', key, FIELD_STREAK, fields, FIELD_ABOUT, ARGV[ABOUT])
        else
          rcall('HSET', key, FIELD_STREAK, fields)
        end
      end
      rcall('PEXPIRE', key, ARGV[TTL])
      return replies
    end
  end
  count = n + k
  if k > 1 then
    before = sub(call, size - 2 * ID_BYTES + 1, size - ID_BYTES)
  end
  -- the count in decimal: below 100 its digits by one string.char (a number made a string costs the server
  -- about twice as much: Lua formats it as a float)
  local fields = hash .. last .. before .. sub(call, CALL_HASH_END + 1, CALL_TTL_END) .. (count < 10 and
    char(48 + count) or count < 100 and char(48 + (count - count % 10) / 10, 48 + count % 10) or count)
    .. H_JUDGED_MARK .. ARGV[JUDGED]
  local code = count * REPLY_COUNT
  local renew = n == 0 and record and byte(ARGV[JUDGED], -1) == 112  -- "p": a progress-aware tool
  if not cycles then
    if renew then
      -- a progress-aware call starts a streak: no result of this streak yet (r emptied, never compared)
      rcall('HSET', key, FIELD_STREAK, fields, FIELD_ABOUT, ARGV[ABOUT], FIELD_RESULT, '')
    elseif n == 0 then
      rcall('HSET', key, FIELD_STREAK, fields, FIELD_ABOUT, ARGV[ABOUT])
    else
      rcall('HSET', key, FIELD_STREAK, fields)
    end
    rcall('PEXPIRE', key, ARGV[TTL])
    if not ladder then
      return code
    end
    reply = code
  else
    -- Cycles on: the ring step, written with the record in one HSET.
    local periods, entries, tools = parse_ring()
    local size_byte = byte(ARGV[ABOUT], 1) % ABOUT_PACKED_UUID
    local kept_entries = longest * math.max(repeats, halt_repeats or 0) * RING_ENTRY
    entries = entries .. string.rep(sub(call, 1, RING_ENTRY), k)
    if #entries > kept_entries then
      entries = sub(entries, -kept_entries)
    end
    tools = tools .. string.rep(char(size_byte) .. sub(ARGV[ABOUT], 2, 1 + size_byte), k)
    local kept, at = 0, 1
    while at <= #tools do
      kept = kept + 1
      at = at + 1 + byte(tools, at)
    end
    while kept > longest + 1 do
      tools = sub(tools, 2 + byte(tools, 1))
      kept = kept - 1
    end
    period = period_of(entries, longest, repeats)
    local c = char(period, byte(periods, 1), #entries / RING_ENTRY) .. entries .. tools
    if renew then
      rcall('HSET', key, FIELD_STREAK, fields, FIELD_ABOUT, ARGV[ABOUT], FIELD_RESULT, '', FIELD_RING, c)
    elseif n == 0 then
      rcall('HSET', key, FIELD_STREAK, fields, FIELD_ABOUT, ARGV[ABOUT], FIELD_RING, c)
    else
      rcall('HSET', key, FIELD_STREAK, fields, FIELD_RING, c)
    end
    rcall('PEXPIRE', key, ARGV[TTL])
    reply = code
    if period > 0 then
      reply = cycle_reply(code, period, entries, tools, #entries / RING_ENTRY)
    end
    if not ladder then
      return reply
    end
    -- a cycle repeated cycle_halt_repeats times halts the session
    halts = period > 0 and halt_repeats > 0 and period_of(entries, longest, halt_repeats) > 0
  end
  streak = fields
end
-- The ladder (MODE_LADDER; see model.check): the call's facts, its judgement (model.judge's order) and its
-- effects (the tool's call count, the once-only call that ran, the halt); `reply`: the streak's answer (a
-- code, or a cycle's array); `streak`: the field h just written (nil for a replay, whose n is the stored count).
local once_since, failures, number = 0, 0, 0
local prefix = once > 0 and sub(hash, 1, ONCE_HASH)
if once > 0 and once_list then
  local at = find(once_list, prefix, 1, true)
  while at and (at - 1) % ONCE_ENTRY ~= 0 do  -- found across two entries: not an entry's hash
    at = find(once_list, prefix, at + 1, true)
  end
  if at and not (replayed and sub(once_list, at + ONCE_HASH, at + ONCE_HASH + ID_BYTES - 1) == last) then
    local b1, b2, b3, b4 = byte(once_list, at + ONCE_HASH + ID_BYTES, at + ONCE_ENTRY - 1)
    once_since = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
  end
end
if max_failures > 0 and failed then
  failures = tonumber(sub(failed, ID_BYTES + 1)) or 0
end
if max_calls > 0 then
  number = tonumber(calls or '0') or 0
  if replayed then  -- its number then: the tool's calls less those counted since
    number = number - (n - count)
  else
    number = number + 1
    rcall('HSET', key, FIELD_CALLS .. tool, string.format('%d', number))
  end
end
if not replayed then
  local halting = halts or (halt_at > 0 and count >= halt_at)
  if halting and enforce > 0 then
    local now = rcall('TIME')
    local by_count = halt_at > 0 and count >= halt_at
    local since = string.format('%d', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
    local hex = (string.gsub(sub(hash, 1, RING_ENTRY), '.',
      function(one) return string.format('%02x', byte(one)) end))
    rcall('HSET', key, FIELD_STREAK, streak .. HALTED, FIELD_HALT, table.concat({
      since, by_count and 'repeat' or 'cycle', string.format('%d', count),
      string.format('%d', by_count and halt_at or halt_repeats), hex, '', '',
      tool or sub(ARGV[ABOUT], 2, 1 + byte(ARGV[ABOUT], 1) % ABOUT_PACKED_UUID)}, '\0'))
  elseif once > 0 and once_since == 0 and (enforce == 0 or not (halting
      or ((count > 1 or ARGV[LIMIT] == '1') and count >= tonumber(ARGV[LIMIT])) or period > 0
      or (max_failures > 0 and failures >= max_failures) or (max_calls > 0 and number > max_calls))) then
    -- a once-only call that runs: no rule refuses it (the model's judgement), or shadow mode (a first call's
    -- count, 1, reaches the limit only when it is 1: no number made of ARGV[LIMIT] otherwise)
    local entries = (once_list or '') .. prefix .. last .. ARGV[NOW]
    if #entries > ONCE_ENTRIES * ONCE_ENTRY then
      entries = sub(entries, -ONCE_ENTRIES * ONCE_ENTRY)
    end
    rcall('HSET', key, FIELD_ONCE, entries)
  end
end
if once_since == 0 and failures == 0 and number == 0 and not halts then
  return reply  -- nothing for the ladder to judge but the count (and the cycle): the reply of its mode
end
local out = {type(reply) == 'table' and reply[1] or reply, once_since, failures, number, halts and 1 or 0}
if type(reply) == 'table' then
  out[6], out[7], out[8] = reply[2], reply[3], reply[4]
end
return out
