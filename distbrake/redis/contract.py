"""The wire contract between the brakes and `lua/brake.lua`: every record field, byte range, ARGV slot,
mode and reply code, by name.

Its twin is the block of constants at the top of `lua/brake.lua`: the same
names, the same numbers (a test compares them). Byte ranges are given by
their ends, which are the same number in both languages: bytes
`END_A + 1 .. END_B` in Lua (1-based, inclusive) are `[END_A:END_B]` in
Python. ARGV slots are numbered as in Lua (ARGV[1] is `argv[0]` of a Python
tuple). Adding a field is one edit here, one in the Lua header, and the rule
model.

The record (one Redis hash per session) has these fields:

    h  the streak: call hash | last call id | previous call id | ttl in milliseconds | the count in decimal |
       H_JUDGED_MARK | ARGV[JUDGED] of the last check (the limit, warn_at and enforcement it was judged by)
    s  ARGV[ABOUT] of the check that started the streak (tool name and session id, for inspection)
    r  progress-aware tools only: 4 bytes of the call hash | the 8 bytes of the last result's digest
    c  cycles only: two period bytes | one count byte n | the ring (n entries) | the tools
    x  halted sessions only: why (HALT_PARTS joined by NUL bytes); h then ends with HALTED
    o  once-only tools only: ONCE_ENTRY bytes per once-only call that ran (hash | call id | Unix seconds, the
       checking worker's clock: ARGV[NOW])
    f<tool>  max_failures only: the call id of the tool's last observed failure | its failures in a row (empty
             after a success)
    n<tool>  max_calls only: the tool's calls in the session, in decimal

Records of earlier versions are read, and their streaks continued, as they
are: their h ends with the count (no H_JUDGED_MARK), and ARGV[JUDGED] was in
a field of its own, j (FIELD_JUDGED), which `inspect` reads when h has none;
the script no longer writes j, so a streak that goes on writes one field.

A mixed-version fleet. The record carries no version byte: each worker loads
its own script by SHA (a script's arguments go only from a worker to its own
script), so workers of different checkouts share one Redis and its records.
Older readers (`inspect`, `list`) cannot parse `j` ending in `p`: they show a
progress-aware tool's recorded limit as unknown (`max_repeats` null, `state`
`unknown`) and judge it by their own settings; readers from before the packing
of `s` (ABOUT_PACKED_UUID) mis-read the tool and session of a record whose
session id holds a UUID. Older writers ignore `c` (the calls they count never
enter the cycle ring) and `r` (a tool is progress-aware only on newer workers),
and take a repeated call id for a replay however late it comes, so a host that
reuses `call_0` every turn is braked only by newer workers. Writers from before
H_JUDGED_MARK read no count in an `h` that holds one ("5/3"): they start the
streak afresh, so while a session's checks alternate between old and new
workers its streak restarts (roll a fleet forward quickly); their readers
(`inspect`, `list`, `top`, `clear_all`) do not see such a record at all
(`clear_all` leaves it to its TTL). Counts and denials
are otherwise the same. The ladder needs every worker on its version: an older
writer reads no count in a halted `h` ("5/3!"), starts the streak afresh and so
lifts the halt, and ignores `o`, `f<tool>` and `n<tool>`; an older reader lists
no halted session (its `h` is not a record to it). ARGV[LADDER]'s bytes and
ARGV[NOW] changed after the ladder landed (decimal text and the server's TIME
before): each worker still sends them only to its own script, and the record
is the same, so workers on either side of that change share it.
"""

from __future__ import annotations

__all__ = [
    "ABOUT", "ABOUT_PACKED_UUID", "CALL", "CALL_HASH_END", "CALL_TTL_END", "CYCLE_REPLY", "FIELDS", "FIELD_ABOUT",
    "FIELD_CALLS", "FIELD_FAILURES", "FIELD_HALT", "FIELD_JUDGED", "FIELD_ONCE", "FIELD_RESULT", "FIELD_RING",
    "FIELD_STREAK", "HALTED", "HALTED_BYTE", "HALT_INFO", "HALT_PARTS", "H_HASH_END", "H_JUDGED_MARK", "H_LAST_END",
    "H_PREVIOUS_END", "H_TTL_END", "ID_BYTES", "JUDGED", "LADDER", "LADDER_BYTES", "LADDER_REPLY", "LIMIT", "LONGEST",
    "MODE", "MODE_BLOCK", "MODE_CHECK", "MODE_CYCLES", "MODE_FAILED", "MODE_LADDER", "MODE_OBSERVE", "MODE_UNBLOCK",
    "NOW", "NO_ID", "OBSERVE_IGNORED", "OBSERVE_RECORDED", "OBSERVE_RESTARTED", "ONCE_ENTRIES", "ONCE_ENTRY",
    "ONCE_HASH", "REPEATS", "REPLY_COUNT", "REPLY_COUNT_SHIFT", "REPLY_HALTED", "REPLY_REPLAYED", "RESULT",
    "RESULT_BYTES", "RING_ENTRY", "R_HASH_END", "TTL", "WINDOW",
]

# -- the record's fields ------------------------------------------------------------------------------
FIELD_STREAK = b"h"
FIELD_ABOUT = b"s"
FIELD_JUDGED = b"j"  # records of earlier versions only (read by `inspect`, never written): ARGV[JUDGED]
FIELD_RESULT = b"r"
FIELD_RING = b"c"
FIELD_HALT = b"x"  # halted sessions: why (HALT_PARTS); every check is refused while h ends with HALTED
FIELD_ONCE = b"o"  # once-only tools: the calls that ran
FIELD_FAILURES = b"f"  # + the tool name (as in s): max_failures' count of the tool
FIELD_CALLS = b"n"  # + the tool name (as in s): max_calls' count of the tool
FIELDS = (FIELD_ABOUT, FIELD_STREAK, FIELD_JUDGED, FIELD_HALT)  # what `inspect` reads (HMGET), in this order

# A halted session: h ends with this byte ("5/3!"); an operator's block of a session without a
# record writes h = 16 zero bytes | NO_ID | NO_ID | ttl | "0!". The field x is HALT_PARTS joined by NUL bytes:
# since (Unix milliseconds), kind (b"repeat", b"cycle", b"block"), count, limit, the hash prefix (12 hex),
# who, reason (no NUL in either), then the tool (last: it may hold anything).
HALTED = b"!"
HALTED_BYTE = HALTED[0]
HALT_PARTS = ("since_ms", "kind", "count", "limit", "hash_prefix", "who", "reason", "tool")

# Field o: once-only calls that ran, oldest first, ONCE_ENTRY bytes each: the first ONCE_HASH bytes of the call
# hash | the call id (ID_BYTES) | Unix seconds (4 bytes big-endian); at most ONCE_ENTRIES, the oldest dropped.
ONCE_HASH = 8
ONCE_ENTRY = 17
ONCE_ENTRIES = 64

# Field h: the streak.
H_HASH_END = 16  # the call hash (16 bytes)
H_LAST_END = 21  # the last call id (5 bytes)
H_PREVIOUS_END = 26  # the previous call id of the streak (5 bytes; zeros when none)
H_TTL_END = 31  # the ttl in milliseconds, 5 bytes big-endian; then the count in decimal
H_JUDGED_MARK = b"/"  # after the count: ARGV[JUDGED] follows (to the end, or to HALTED)

# Field r: the last result of a progress-aware tool's streak.
R_HASH_END = 4  # the first 4 bytes of the call hash; then the result's digest
RESULT_BYTES = 8  # the result digest (ARGV[RESULT])

# ARGV[ABOUT] (and field s): the first byte is the tool name's length, plus this flag when the session id's
# UUIDs are packed (a zero byte and their 16 bytes each).
ABOUT_PACKED_UUID = 128

# Field c: the cycle ring.
RING_ENTRY = 6  # bytes of the call hash per ring entry (and 12 hex characters in a cycle reply)

# -- ARGV -----------------------------------------------------------------------------------------------
CALL = 1  # the call, or a run of k identical calls: hash | ttl | k call ids
MODE = 2  # what the script is asked to do (MODE_*)
LIMIT = 3  # max_repeats for this tool
TTL = 4  # the ttl in milliseconds
ABOUT = 5  # for inspection: the tool's length byte (+128: UUIDs packed), the tool name, the session id
WINDOW = 6  # the replay window in milliseconds (the brake's timeout)
JUDGED = 7  # what the check is judged by: "3", "5w2s", "5p" (see wire.judged_by)
RESULT = 8  # MODE_OBSERVE: the tool result's digest (RESULT_BYTES)
LONGEST = 8  # MODE_CYCLES: the longest cycle period looked for, 2..4
REPEATS = 9  # MODE_CYCLES: how many repetitions of a cycle deny, 2..10
LADDER = 8  # MODE_LADDER's only argument after JUDGED: LADDER_BYTES bytes (see wire.ladder_argv), 0: a rule off
# ARGV[LADDER]: once, enforce, cycle_halt_repeats, the longest cycle period, the cycle's repetitions (0 0: cycles
# off), a byte each; then halt_at, max_failures, max_calls, 4 bytes big-endian each (read by one string.byte)
LADDER_BYTES = 17
NOW = 9  # MODE_LADDER for a once-only tool: the worker's clock, Unix seconds, 4 bytes big-endian (its entry's time)
HALT_INFO = 1  # MODE_BLOCK: the field x to write (the same slot as CALL); ARGV[TTL] its ttl (>= 1 ms)

# ARGV[CALL]: the call hash, the ttl, then each call's id.
CALL_HASH_END = 16  # 16 bytes of the call hash
CALL_TTL_END = 21  # the ttl in milliseconds, 5 bytes big-endian; then ID_BYTES per call
ID_BYTES = 5  # a call id (5 bytes of its hash)
NO_ID = b"\0" * ID_BYTES  # in field h: no previous call id

# ARGV[MODE]
MODE_CHECK = b"c"  # a check (or a run of identical checks)
MODE_CYCLES = b"y"  # a check with the cycle rule on (never a run)
MODE_OBSERVE = b"o"  # an observation: the result of a progress-aware call
MODE_LADDER = b"l"  # a check with the ladder's rules (ARGV[LADDER]; cycles too when it has a longest period)
MODE_FAILED = b"f"  # an observation: whether a call of a tool with max_failures failed (ARGV[RESULT] b"1")
MODE_BLOCK = b"b"  # an operator's block of one session (ARGV[HALT_INFO], ARGV[TTL], ARGV[ABOUT] or b"")
MODE_UNBLOCK = b"u"  # lift a halt: the record is deleted (reply 1), only when the session is halted (else 0)

# -- replies ----------------------------------------------------------------------------------------------
# A check: count << REPLY_COUNT_SHIFT | REPLY_REPLAYED when a replay (the script counts, the rule model judges
# the count: no reply says whether a check is denied); for a run,
# the run's last call's (the earlier calls have the counts just below it). A check that completes a cycle
# gets an array instead, its items in the order of CYCLE_REPLY.
REPLY_COUNT = 4
REPLY_COUNT_SHIFT = REPLY_COUNT.bit_length() - 1  # (Python only: a reply's count is reply >> 2)
REPLY_REPLAYED = 1
CYCLE_REPLY = ("code", "period", "hashes", "tools")  # hashes: RING_ENTRY bytes each, as hex
# A check of a halted session: an array (REPLY_HALTED, the field x); nothing was counted.
REPLY_HALTED = 0
# A check in MODE_LADDER: an array, these items, then a cycle's period, hashes and tools when it completes one;
# when once_since, failures, calls and halts are all 0, the reply of MODE_CHECK (MODE_CYCLES with cycles) instead.
LADDER_REPLY = ("code", "once_since", "failures", "calls", "halts")
# An observation.
OBSERVE_IGNORED = 0  # the streak has moved on
OBSERVE_RECORDED = 1
OBSERVE_RESTARTED = 2  # the result changed: the streak's count is 1 again
