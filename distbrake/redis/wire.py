"""The Redis step without I/O: key derivation, ARGV in, reply out, RESP packing.

Everything the sync and async distributed brakes share about talking to
Redis lives here, so the two only send and receive. Every ARGV slot, byte
range and reply code is named in `contract.py` (the twin of lua/brake.lua's
header); the script itself is `script.py`'s.
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
import re
import struct
import time
import uuid
from collections.abc import Sequence
from functools import lru_cache
from typing import cast

from ..core import Counted, Cycle, PreparedCall, SessionState
from ..errors import ScriptReplyError
from ..model import (
    NO_FACTS,
    REASON_CHARS,
    WHO_CHARS,
    Facts,
    Halt,
    HaltKind,
    Rules,
    new_counted,
    once_second,
    operator_text,
)
from .contract import (
    ABOUT_PACKED_UUID,
    CALL_HASH_END,
    CALL_TTL_END,
    FIELDS,
    H_JUDGED_MARK,
    H_PREVIOUS_END,
    H_TTL_END,
    HALTED,
    ID_BYTES,
    MODE_BLOCK,
    MODE_CHECK,
    MODE_CYCLES,
    MODE_FAILED,
    MODE_LADDER,
    MODE_OBSERVE,
    MODE_UNBLOCK,
    REPLY_COUNT,
    REPLY_COUNT_SHIFT,
    REPLY_HALTED,
    REPLY_REPLAYED,
    RING_ENTRY,
)
from .script import brake_script, bulk, script_source

__all__ = [
    "FIELDS",
    "SESSION_BYTES",
    "TOOL_BYTES",
    "CheckEncoder",
    "Encoded",
    "block_argv",
    "check_mode",
    "decode_halt",
    "decode_reply",
    "decode_state",
    "encode_call",
    "encode_halt",
    "encode_run",
    "key_pattern",
    "redis_time",
    "resp_evalsha",
    "resp_script_load",
    "run_replies",
    "script_sha",
    "script_source",
    "session_key",
    "unblock_argv",
]

SESSION_BYTES = 128  # longest session id kept for inspection (the key is always a hash)
TOOL_BYTES = 64  # longest tool name kept for inspection
KEY_CHARS = 18  # base64url characters of sha256(session id) in the key: 108 bits
PREFIX_BYTES = 6  # bytes of the call hash shown as its hash prefix (12 hex characters)
_HASH_HEX = 2 * CALL_HASH_END  # hex characters of the digest kept in ARGV[CALL]
_ID_BITS = 8 * ID_BYTES


def script_sha() -> str:
    """SHA1 of the standard script (`lua/brake.lua` as Redis runs it, its contract folded in: see script.py): what
    EVALSHA names it by, the same on every server."""
    return brake_script().sha


_bulk = bulk


def resp_evalsha(key: str, argv: tuple[bytes | int, ...], head: bytes | None = None) -> bytes:
    """One `EVALSHA <sha> 1 key argv...` in Redis's wire format: what the brakes write straight to a
    connection (a check's and an observation's come packed from `encode_call`; a run's from here).
    `head`: the script's `evalsha_head` (see script.py; the standard script's by default)."""
    return b"".join((
        _array(4 + len(argv)), head or brake_script().evalsha_head, _bulk(key.encode("utf-8")),
        _bulk(cast(bytes, argv[0])), _packed_rest(argv[1:]),
    ))


def _packed_rest(rest: tuple[bytes | int, ...]) -> bytes:
    """ARGV[2:] in wire format."""
    return b"".join(_bulk(arg if isinstance(arg, bytes) else b"%d" % arg) for arg in rest)


def resp_script_load() -> bytes:
    """`SCRIPT LOAD <source>` of the standard script in wire format."""
    return brake_script().load_command


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def session_key(session_id: str, key_prefix: str = "distbrake") -> str:
    """The Redis key of a session's record: `<prefix>:<18 chars of base64url(sha256(id))>`.

    Bounded in length and distinct for any session id (empty, huge, with
    braces, globs, newlines, any Unicode); it holds no hash tag, so sessions
    spread over every Cluster slot.
    """
    return _derive_key(session_id, key_prefix)


def _derive_key(session_id: str, key_prefix: str) -> str:
    digest = hashlib.sha256(_utf8(session_id)).digest()
    return f"{key_prefix}:{base64.urlsafe_b64encode(digest[:15]).decode('ascii')[:KEY_CHARS]}"


def key_pattern(key_prefix: str) -> str:
    """The SCAN pattern that matches every record under `key_prefix` and nothing else."""
    return f"{key_prefix}:" + "?" * KEY_CHARS


# Random call ids without a syscall per check: a generator of our own (never the `random`
# module's, which a host may seed), seeded from os.urandom, and again in a forked child.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def _call_id_bytes(call_id: str | None) -> bytes:
    # Without a host call id, each check gets a random one, so that a retry
    # of this very check after a lost reply is still counted once.
    if call_id is None:
        return _ids.getrandbits(_ID_BITS).to_bytes(ID_BYTES, "big")
    return hashlib.blake2b(_utf8(call_id), digest_size=ID_BYTES).digest()


def _cut(text: str, limit: int) -> bytes:
    """At most `limit` bytes of UTF-8, never splitting a character."""
    data = _utf8(text)
    if len(data) <= limit:
        return data
    return _utf8(data[:limit].decode("utf-8", "ignore"))


CACHED_CALLS = 8192  # the (session, tool, rules) whose encoding `encode_call` keeps (see `_fixed`)
CACHED_TEXT = 256  # a session id or tool name longer than this (in characters) is encoded afresh each time

Encoded = tuple[str, tuple[bytes | int, ...], bytes]


def encode_call(
    call: PreparedCall, key_prefix: str, ttl_ms: int, window_ms: int, cycles: tuple[int, int] | None = None,
    result: bytes | None = None, head: bytes | None = None, failed: bool | None = None, cycle_halt: int = 0,
) -> Encoded:
    """KEYS[1], ARGV and the packed EVALSHA (as `resp_evalsha` packs it) of a check (see contract.py).

    Of ARGV, only the call hash and the call id in ARGV[CALL] change between the
    checks of one session and tool: the key, the rest of ARGV and their packed
    parts are made once and kept for the last CACHED_CALLS (session, tool,
    rules), one look-up per check. `cycles`: (max_cycle_period,
    cycle_repeats) when the cycle rule is on: MODE_CYCLES, with ARGV[LONGEST] and ARGV[REPEATS].
    A tool with a rule of the ladder (`Rules.ladder`), or any tool when `cycle_halt` (cycle_halt_repeats)
    is set: MODE_LADDER, with ARGV[LADDER] (which holds the cycle rule's two numbers too), and for a
    once-only tool ARGV[NOW] (this worker's clock: the time a once-only call that runs is kept with).
    `result`: the tool result's digest of an observation (MODE_OBSERVE, ARGV[RESULT]; no cycle arguments then).
    `failed`: an observation of whether the call failed (MODE_FAILED, ARGV[RESULT] b"1" or b"0").
    `head`: the brake's script's `evalsha_head` (see script.py; the standard script's by default).
    """
    session, tool, rules = call.session_id, call.tool_name, call.rules
    extra: tuple[bytes | int, ...] = ()
    last: bytes | None = None
    if result is not None:
        mode, last = MODE_OBSERVE, result
    elif failed is not None:
        mode, last = MODE_FAILED, b"1" if failed else b"0"
    else:
        mode, extra = check_mode(rules, cycles, cycle_halt)
        if rules.once:
            last = now_argument()[0]
    fixed = _fixed if len(session) <= CACHED_TEXT and len(tool) <= CACHED_TEXT else _fixed.__wrapped__
    key, rest, ttl, body, tail = fixed(
        session, tool, rules.max_repeats, rules.warn_at, rules.enforce, rules.progress, key_prefix, ttl_ms, window_ms,
        mode, extra, head or brake_script().evalsha_head)
    first = _call_argument(call.digest, ttl, call.call_id)
    argv: tuple[bytes | int, ...] = (first, *rest) if last is None else (first, *rest, last)
    if len(first) != CALL_BYTES:  # a digest of another length than call_hash's: packed the general way
        return key, argv, resp_evalsha(key, argv, head)
    packed = b"".join((_array(4 + len(argv)), body, first, tail))
    return key, argv, packed if last is None else packed + _bulk(last)


def _call_argument(digest: str, ttl: bytes, call_id: str | None) -> bytes:
    """ARGV[CALL] of one check: the call hash's first CALL_HASH_END bytes, the ttl's bytes, the call id's."""
    return bytes.fromhex(digest[:_HASH_HEX]) + ttl + _call_id_bytes(call_id)


def check_mode(
    rules: Rules, cycles: tuple[int, int] | None, cycle_halt: int,
) -> tuple[bytes, tuple[bytes | int, ...]]:
    """ARGV[MODE] of a check, and the ARGV after JUDGED its mode takes (see `encode_call`)."""
    if cycle_halt or rules.ladder:
        return MODE_LADDER, (ladder_argv(rules, cycles, cycle_halt if cycles else 0),)
    if cycles is not None:
        return MODE_CYCLES, cycles
    return MODE_CHECK, ()


# What `CheckEncoder` keeps per (session, tool): the rules it was made for, KEYS[1], ARGV[2:], the ttl's
# bytes, the packed EVALSHA up to ARGV[CALL]'s bytes (from its array's length) and after them.
_Parts = tuple[Rules, str, tuple[bytes | int, ...], bytes, bytes, bytes]


class CheckEncoder:
    """`encode_call` of one brake's checks, its settings bound once: the same bytes, cheaper per check.

    What `_fixed` makes for a (session, tool) is kept with the rules it was made for (and the array's
    length, which a check's ARGV fixes), for the last CACHED_CALLS pairs (the dict starts over when full):
    a check looks up one pair, not `_fixed`'s twelve arguments. A call with other rules for the pair (a
    call another brake prepared) is made again; a session id or tool name longer than CACHED_TEXT is never kept.
    """

    __slots__ = ("_cycle_halt", "_cycles", "_head", "_key_prefix", "_parts", "_ttl_ms", "_window_ms")

    def __init__(
        self, key_prefix: str, ttl_ms: int, window_ms: int, cycles: tuple[int, int] | None, head: bytes,
        cycle_halt: int,
    ) -> None:
        self._key_prefix, self._ttl_ms, self._window_ms = key_prefix, ttl_ms, window_ms
        self._cycles, self._head, self._cycle_halt = cycles, head, cycle_halt
        self._parts: dict[tuple[str, str], _Parts] = {}

    def __call__(self, call: PreparedCall) -> Encoded:
        """KEYS[1], ARGV and the packed EVALSHA of a check of `call`: `encode_call`'s, with this brake's settings."""
        tool, digest, session, call_id, rules = call
        parts = self._parts.get((session, tool))
        if parts is None or (parts[0] is not rules and parts[0] != rules):
            parts = self._made(session, tool, rules)
        first = _call_argument(digest, parts[3], call_id)
        if len(first) != CALL_BYTES:  # a digest of another length than call_hash's: packed the general way
            return encode_call(call, self._key_prefix, self._ttl_ms, self._window_ms, self._cycles, head=self._head,
                               cycle_halt=self._cycle_halt)
        if rules.once:  # ARGV[NOW] last (the array's length in parts[4] counts it)
            now, packed_now = now_argument()
            return parts[1], (first, *parts[2], now), b"".join((parts[4], first, parts[5], packed_now))
        return parts[1], (first, *parts[2]), b"".join((parts[4], first, parts[5]))

    def _made(self, session: str, tool: str, rules: Rules) -> _Parts:
        mode, extra = check_mode(rules, self._cycles, self._cycle_halt)
        key, rest, ttl, body, tail = _fixed.__wrapped__(
            session, tool, rules.max_repeats, rules.warn_at, rules.enforce, rules.progress, self._key_prefix,
            self._ttl_ms, self._window_ms, mode, extra, self._head)
        parts = (rules, key, rest, ttl, _array(5 + len(rest) + rules.once) + body, tail)
        if len(session) <= CACHED_TEXT and len(tool) <= CACHED_TEXT:
            if len(self._parts) >= CACHED_CALLS:
                self._parts = {}
            self._parts[session, tool] = parts
        return parts


_LADDER = struct.Struct(">5B3I")  # ARGV[LADDER]'s layout: contract.LADDER_BYTES
_NOW = struct.Struct(">I")
_now: tuple[int | None, bytes, bytes] = (None, b"", b"")  # the second ARGV[NOW] was made for, it and its bulk string


def now_argument() -> tuple[bytes, bytes]:
    """ARGV[NOW] and its bulk string: this worker's clock, Unix seconds, 4 bytes big-endian (a once-only
    call's time), made once a second."""
    global _now  # one tuple, replaced whole: a thread reads an old one or the new one
    second = int(time.time())
    made = _now
    if second != made[0]:
        argument = _NOW.pack(once_second(second))
        made = _now = (second, argument, _bulk(argument))
    return made[1], made[2]


@lru_cache(maxsize=256)
def ladder_argv(rules: Rules, cycles: tuple[int, int] | None, cycle_halt: int) -> bytes:
    """ARGV[LADDER] (contract.LADDER_BYTES): once, enforce, cycle_halt_repeats, the cycle rule's longest period
    and repetitions (0 0: off), a byte each; halt_at, max_failures, max_calls, 4 bytes big-endian each (0: off;
    each at most MAX_COUNT, as validated)."""
    longest, repeats = cycles or (0, 0)
    return _LADDER.pack(rules.once, rules.enforce, cycle_halt, longest, repeats, rules.halt_at or 0,
                        rules.max_failures or 0, rules.max_calls or 0)



@lru_cache(maxsize=CACHED_CALLS)
def _fixed(
    session_id: str, tool_name: str, max_repeats: int, warn_at: int | None, enforce: bool, progress: bool,
    key_prefix: str, ttl_ms: int, window_ms: int, mode: bytes, extra: tuple[bytes | int, ...], head: bytes,
) -> tuple[str, tuple[bytes | int, ...], bytes, bytes, bytes]:
    """What `encode_call` makes once per (session, tool, rules): key, ARGV[2:], the ttl's bytes, and the
    packed EVALSHA's parts around ARGV[CALL] (after the array's length; from the key to its length, and
    the rest). About 0.9 KB with a UUID session id and a short tool name, up to ~3 KB for names near
    CACHED_TEXT characters. `extra`: ARGV after JUDGED (the mode's: cycles, the ladder)."""
    key = session_key(session_id, key_prefix)
    # ARGV[MODE:JUDGED] (see contract.py), in order
    rest: tuple[bytes | int, ...] = (
        mode, max_repeats, ttl_ms, about(tool_name, session_id), window_ms,
        judged_by(max_repeats, warn_at, enforce, progress), *extra,
    )
    body = head + _bulk(key.encode("utf-8")) + b"$%d\r\n" % CALL_BYTES
    return key, rest, ttl_ms.to_bytes(CALL_TTL_END - CALL_HASH_END, "big"), body, b"\r\n" + _packed_rest(rest)


HALT_KINDS: tuple[HaltKind, ...] = ("repeat", "cycle", "block", "kill")


def encode_halt(halt: Halt) -> bytes:
    """The field x of a halted session (and the value of the fleet's halt-all key): contract.HALT_PARTS joined
    by NUL bytes; who and reason without NUL and bounded (WHO_CHARS, REASON_CHARS), the tool last."""
    return b"\0".join((
        b"%d" % round(halt.since * 1000), halt.kind.encode("ascii"), b"%d" % halt.count, b"%d" % halt.limit,
        _utf8(halt.hash_prefix[:2 * PREFIX_BYTES]), _utf8(operator_text(halt.who, WHO_CHARS)),
        _utf8(operator_text(halt.reason, REASON_CHARS)), _cut(halt.tool_name, TOOL_BYTES),
    ))


def decode_halt(value: object) -> Halt:
    """The field x (or the halt-all key's value) as a `Halt`; what cannot be read is left empty (an operator's
    block of unknown time), never an error: a halted session stays halted."""
    data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
    parts = data.split(b"\0", 7) if isinstance(data, bytes) else []
    since, kind, count, limit, prefix, who, reason, tool = (*parts, *([b""] * 8))[:8]
    shown = kind.decode("ascii", "replace")
    return Halt(
        shown if shown in HALT_KINDS else "block", int(since) / 1000 if since.isdigit() else 0.0,
        _text(tool), int(count) if count.isdigit() else 0, int(limit) if limit.isdigit() else 0,
        _text(prefix), _text(who), _text(reason),
    )


def block_argv(halt: Halt, ttl_ms: int, session_id: str | None = None) -> tuple[bytes | int, ...]:
    """ARGV of an operator's block of one session (MODE_BLOCK): its halt (field x), the ttl (>= 1 ms: a halt
    always ends), and, for a session without a record, the session id to keep in s (`inspect`, `list`)."""
    if ttl_ms < 1:
        raise ValueError(f"a block's ttl must be at least 1 ms, not {ttl_ms}")
    shown = b"" if session_id is None else about("", session_id)
    return encode_halt(halt), MODE_BLOCK, 0, ttl_ms, shown


def unblock_argv() -> tuple[bytes | int, ...]:
    """ARGV of lifting a halt (MODE_UNBLOCK): the record is deleted when the session is halted."""
    return b"", MODE_UNBLOCK


@lru_cache(maxsize=16)
def _array(size: int) -> bytes:
    """The head of a RESP array of `size` items (one shared object per size)."""
    return b"*%d\r\n" % size


UUID_TEXT = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PACKED_UUID = ABOUT_PACKED_UUID  # in ARGV[ABOUT]'s first byte: the session id's UUIDs are packed (tool <= 64 bytes)


def about(tool_name: str, session_id: str) -> bytes:
    """ARGV[ABOUT], the field s: the tool's length byte, the tool name (<= 64 bytes), the session id (<= 128 bytes).

    Every canonical lowercase UUID in the session id is kept as a zero byte
    and its 16 bytes (flagged by PACKED_UUID in the first byte), which keeps
    a record of UUID sessions (or "<thread>/run/<run>" ids of them) small
    enough for Redis's compact hash encoding; an id holding a zero byte is
    kept as it is.
    """
    tool = _cut(tool_name, TOOL_BYTES)
    session = _cut(session_id, SESSION_BYTES)
    flag = 0
    if b"\x00" not in session and UUID_TEXT.search(session):
        session = UUID_TEXT.sub(_packed_uuid, session)
        flag = PACKED_UUID
    return bytes((len(tool) | flag,)) + tool + session


def _packed_uuid(found: re.Match[bytes]) -> bytes:
    return b"\x00" + bytes.fromhex(found.group().replace(b"-", b"").decode("ascii"))


def _unpack_session(data: bytes) -> bytes:
    """The session id of a packed field s (see `about`)."""
    parts, at = [], 0
    while (zero := data.find(b"\x00", at)) >= 0:
        parts.append(data[at:zero])
        raw = data[zero + 1:zero + 17]
        parts.append(str(uuid.UUID(bytes=raw.ljust(16, b"\x00"))).encode())
        at = zero + 17
    parts.append(data[at:])
    return b"".join(parts)


@lru_cache(maxsize=256)
def judged_by(max_repeats: int, warn_at: int | None, enforce: bool, progress: bool = False) -> bytes:
    """ARGV[JUDGED]: what a check is judged by, as the record keeps it ("3", "5w2s", "5p" for a progress-aware tool)."""
    return b"%d%s%s%s" % (
        max_repeats, b"w%d" % warn_at if warn_at else b"", b"" if enforce else b"s", b"p" if progress else b""
    )


_JUDGED = re.compile(rb"([0-9]{1,18})(?:w([0-9]{1,18}))?(s?)p?")


CALL_HEAD = CALL_TTL_END  # bytes of ARGV[CALL] before the call ids: call hash and ttl
CALL_BYTES = CALL_HEAD + ID_BYTES  # ARGV[CALL] of one check: and its call id


def encode_run(argvs: Sequence[tuple[bytes | int, ...]]) -> tuple[bytes | int, ...]:
    """The ARGV of a run: several `encode_call` ARGVs of one session and call, sent as one script call."""
    first = argvs[0]
    if len(argvs) == 1:
        return first
    calls = cast(bytes, first[0]) + b"".join(cast(bytes, argv[0])[CALL_HEAD:] for argv in argvs[1:])
    return (calls, *first[1:])


def run_replies(reply: object, size: int) -> list[object]:
    """The script's reply to a run of `size` calls, as the reply each call would have had alone."""
    if size == 1:
        return [reply]
    if isinstance(reply, list) and len(reply) == size and reply[0] != REPLY_HALTED:
        return reply  # counted call by call (call ids repeat, see the script)
    if not isinstance(reply, int) or isinstance(reply, bool):
        return [reply] * size
    last, replayed = reply >> REPLY_COUNT_SHIFT, reply & REPLY_REPLAYED
    return [((last - size + 1 + i) << REPLY_COUNT_SHIFT) | replayed for i in range(size)]


def decode_reply(reply: object, repeats: int = 0) -> Counted:
    """The script's reply as the model's `Counted` (count, replayed, the cycle the call completes, the ladder's
    facts; or the halt of a halted session); else `ScriptReplyError`.

    An integer is a plain answer; an array of two (REPLY_HALTED, x) is a halted
    session's; of four (cycles on, `repeats` = cycle_repeats) adds the cycle:
    its period, its calls' hash prefixes (hex) and their tools; of five or
    eight, MODE_LADDER's (contract.LADDER_REPLY, then the cycle's parts).
    """
    if type(reply) is int and reply >= REPLY_COUNT:  # the common case: a plain answer
        return new_counted(Counted, (reply >> REPLY_COUNT_SHIFT, reply & REPLY_REPLAYED != 0, None, NO_FACTS, None))
    cycle = None
    facts = NO_FACTS
    if isinstance(reply, list):
        size = len(reply)
        if size == 2 and reply[0] == REPLY_HALTED:
            return Counted(0, halt=decode_halt(reply[1]))
        if size in (5, 8):
            code, once_since, failures, calls, halts = reply[:5]
            if not all(isinstance(item, int) for item in (once_since, failures, calls, halts)):
                raise ScriptReplyError("unexpected ladder reply from the brake script")
            facts = Facts(once_since, failures, calls)
            if size == 8:
                code, cycle = _decode_cycle([code, *reply[5:]], repeats)
                cycle = cycle._replace(halts=bool(halts))
            reply = code
        else:
            reply, cycle = _decode_cycle(reply, repeats)
    if not isinstance(reply, int) or isinstance(reply, bool) or reply < REPLY_COUNT:
        raise ScriptReplyError(f"unexpected reply from the brake script: {type(reply).__name__}")
    return new_counted(Counted, (reply >> REPLY_COUNT_SHIFT, bool(reply & REPLY_REPLAYED), cycle, facts, None))



def _decode_cycle(reply: list[object], repeats: int) -> tuple[object, Cycle]:
    code, period, entries, names = (*reply, None, None, None, None)[:4]  # contract.CYCLE_REPLY
    # Hex and names as bytes, or as str from a client that decodes replies (decode_responses=True).
    hex_text = entries.decode("ascii", "replace") if isinstance(entries, bytes) else entries
    packed = names.encode("utf-8", "surrogatepass") if isinstance(names, str) else names
    if not (
        isinstance(period, int) and period >= 2 and isinstance(hex_text, str)
        and len(hex_text) == 2 * RING_ENTRY * period and isinstance(packed, bytes)
    ):
        raise ScriptReplyError("unexpected cycle reply from the brake script")
    tools, at = [], 0
    while at < len(packed):
        tools.append(_text(packed[at + 1:at + 1 + packed[at]]))
        at += 1 + packed[at]
    if len(tools) != period:
        raise ScriptReplyError("unexpected cycle reply from the brake script")
    prefixes = tuple(hex_text[i:i + 2 * RING_ENTRY] for i in range(0, len(hex_text), 2 * RING_ENTRY))
    return code, Cycle(period, repeats, prefixes, tuple(tools))


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def decode_state(fields: Sequence[object], pttl_ms: object, now: float) -> SessionState | None:
    """A record's HMGET reply (s, h, j, x: contract.FIELDS), its PTTL and Redis's TIME as a `SessionState`.

    None when there is no record (or the key is not one of ours). What the
    streak was judged by follows the count in h (an earlier version's record
    keeps it in j; one older still has no limit of its own). A halted one (h
    ends with HALTED) has its halt, read from x.
    """
    packed, record, older_judged, halt = (*fields, None, None)[:4]
    if not isinstance(record, bytes):
        return None
    counted = record[H_TTL_END:]
    halted = counted.endswith(HALTED)
    if halted:
        counted = counted[:-1]
    counted, marked, own = counted.partition(H_JUDGED_MARK)
    judged = own if marked else older_judged
    if len(record) <= H_TTL_END or not counted.isdigit():
        return None
    field = packed if isinstance(packed, bytes) and packed else b"\x00"
    tool_end = 1 + (field[0] & ~PACKED_UUID)
    session = field[tool_end:]
    if field[0] & PACKED_UUID:
        session = _unpack_session(session)
    left_ms = pttl_ms if isinstance(pttl_ms, int) and pttl_ms >= 0 else None
    ttl_ms = int.from_bytes(record[H_PREVIOUS_END:H_TTL_END], "big")
    # The last check set the expiry to its own time + ttl, on Redis's clock.
    updated = now - (ttl_ms - left_ms) / 1000 if left_ms is not None else now
    match = _JUDGED.fullmatch(judged) if isinstance(judged, bytes) else None
    return SessionState(
        session_id=_text(session),
        tool_name=_text(field[1:tool_end]),
        hash_prefix=record[:PREFIX_BYTES].hex(),
        count=int(counted),
        ttl_seconds=None if left_ms is None else left_ms / 1000,
        updated_at=round(updated, 3),
        max_repeats=int(match.group(1)) if match else None,
        warn_at=int(match.group(2)) if match and match.group(2) else None,
        enforcing=(not match.group(3)) if match else None,
        halt=decode_halt(halt) if halted else None,
    )


def redis_time(reply: object) -> float:
    """TIME's reply (seconds, microseconds) as Unix seconds."""
    if isinstance(reply, (tuple, list)) and len(reply) == 2:
        return int(reply[0]) + int(reply[1]) / 1e6
    raise ScriptReplyError(f"unexpected reply to TIME: {type(reply).__name__}")
