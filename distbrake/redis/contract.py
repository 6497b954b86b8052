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

    h  the streak: call hash | last call id | previous call id | ttl in milliseconds | the count in decimal
    s  ARGV[ABOUT] of the check that started the streak (tool name and session id, for inspection)
    j  ARGV[JUDGED] of the last check (the limit, warn_at and enforcement it was judged by)
    r  progress-aware tools only: 4 bytes of the call hash | the 8 bytes of the last result's digest
    c  cycles only: two period bytes | one count byte n | the ring (n entries) | the tools

The record's layout is unchanged by the mode argument (which changed ARGV,
and so the script's SHA, only): a record the previous version of the script
wrote is read, and its streak continued, as it is.

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
reuses `call_0` every turn is braked only by newer workers. Counts and denials
are otherwise the same.
"""

from __future__ import annotations

__all__ = [
    "ABOUT", "ABOUT_PACKED_UUID", "CALL", "CALL_HASH_END", "CALL_TTL_END", "CYCLE_REPLY", "FIELDS",
    "FIELD_ABOUT", "FIELD_JUDGED", "FIELD_RESULT", "FIELD_RING", "FIELD_STREAK", "H_HASH_END", "H_LAST_END",
    "H_PREVIOUS_END", "H_TTL_END", "ID_BYTES", "JUDGED", "LIMIT", "LONGEST", "MODE", "MODE_CHECK",
    "MODE_CYCLES", "MODE_OBSERVE", "NO_ID", "OBSERVE_IGNORED", "OBSERVE_RECORDED", "OBSERVE_RESTARTED",
    "REPEATS", "REPLY_COUNT", "REPLY_COUNT_SHIFT", "REPLY_DENIED", "REPLY_REPLAYED", "RESULT", "RESULT_BYTES",
    "RING_ENTRY", "R_HASH_END", "TTL", "WINDOW",
]

# -- the record's fields ------------------------------------------------------------------------------
FIELD_STREAK = b"h"
FIELD_ABOUT = b"s"
FIELD_JUDGED = b"j"
FIELD_RESULT = b"r"
FIELD_RING = b"c"
FIELDS = (FIELD_ABOUT, FIELD_STREAK, FIELD_JUDGED)  # what `inspect` reads (HMGET), in this order

# Field h: the streak.
H_HASH_END = 16  # the call hash (16 bytes)
H_LAST_END = 21  # the last call id (5 bytes)
H_PREVIOUS_END = 26  # the previous call id of the streak (5 bytes; zeros when none)
H_TTL_END = 31  # the ttl in milliseconds, 5 bytes big-endian; then the count in decimal to the end

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
MODE = 2  # what the script is asked to do: MODE_CHECK, MODE_CYCLES or MODE_OBSERVE
LIMIT = 3  # max_repeats for this tool
TTL = 4  # the ttl in milliseconds
ABOUT = 5  # for inspection: the tool's length byte (+128: UUIDs packed), the tool name, the session id
WINDOW = 6  # the replay window in milliseconds (the brake's timeout)
JUDGED = 7  # what the check is judged by: "3", "5w2s", "5p" (see wire.judged_by)
RESULT = 8  # MODE_OBSERVE: the tool result's digest (RESULT_BYTES)
LONGEST = 8  # MODE_CYCLES: the longest cycle period looked for, 2..4
REPEATS = 9  # MODE_CYCLES: how many repetitions of a cycle deny, 2..10

# ARGV[CALL]: the call hash, the ttl, then each call's id.
CALL_HASH_END = 16  # 16 bytes of the call hash
CALL_TTL_END = 21  # the ttl in milliseconds, 5 bytes big-endian; then ID_BYTES per call
ID_BYTES = 5  # a call id (5 bytes of its hash)
NO_ID = b"\0" * ID_BYTES  # in field h: no previous call id

# ARGV[MODE]
MODE_CHECK = b"c"  # a check (or a run of identical checks)
MODE_CYCLES = b"y"  # a check with the cycle rule on (never a run)
MODE_OBSERVE = b"o"  # an observation: the result of a progress-aware call

# -- replies ----------------------------------------------------------------------------------------------
# A check: count << REPLY_COUNT_SHIFT | REPLY_DENIED when denied | REPLY_REPLAYED when a replay; for a run,
# the run's last call's (the earlier calls have the counts just below it). A check that completes a cycle
# gets an array instead, its items in the order of CYCLE_REPLY.
REPLY_COUNT = 4
REPLY_COUNT_SHIFT = REPLY_COUNT.bit_length() - 1  # (Python only: a reply's count is reply >> 2)
REPLY_DENIED = 2
REPLY_REPLAYED = 1
CYCLE_REPLY = ("code", "period", "hashes", "tools")  # hashes: RING_ENTRY bytes each, as hex
# An observation.
OBSERVE_IGNORED = 0  # the streak has moved on
OBSERVE_RECORDED = 1
OBSERVE_RESTARTED = 2  # the result changed: the streak's count is 1 again
