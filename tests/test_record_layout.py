"""The session record stays small: UUIDs in session ids are packed, so realistic records keep Redis's compact encoding.

Redis keeps a hash as a listpack (the compact encoding) while every value
is at most `hash-max-listpack-value` (64) bytes; a longer field s would
make every record of the fleet about 120 bytes larger.
"""

from __future__ import annotations

import ast
import hashlib
import re
import time
import uuid
from pathlib import Path
from typing import cast

import pytest
import redis
import redis.exceptions

from distbrake import DistributedBrake, LoopBrakeError, LoopBrakeHalt, call_hash, session_key
from distbrake.core import PreparedCall
from distbrake.model import Halt, Rules
from distbrake.redis import contract, wire
from distbrake.redis.contract import JUDGED, LADDER, LADDER_BYTES, MODE, NOW, REPEATS, RESULT
from distbrake.redis.script import brake_script, contract_block, fold_contract, script_file, script_source
from distbrake.redis.wire import CheckEncoder, decode_reply, encode_call, resp_evalsha, script_sha
from tests.backends import ALL_BRAKES, Brakes, Checker, where

STORED_BRAKES = where(ALL_BRAKES, lambda kind: kind != "loop")
THREAD, RUN = "6f1c0d1e-7a55-4c1e-9d1b-2b0e8f6a9c3d", "0b7e2f4a-91c3-4d8e-a5f6-3c2d1e0f9a8b"
SESSIONS = [
    THREAD,
    f"{THREAD}/run/{RUN}",
    THREAD.upper(),  # not canonical: kept as it is
    f"a\x00{THREAD}",  # holds a zero byte: kept as it is
    "\u00e9" * 60 + THREAD,  # cut at 128 bytes, never inside a character
    "plain-session",
]


@pytest.mark.parametrize("kind", STORED_BRAKES)
async def test_session_ids_round_trip_through_the_record(kind: str, brakes: Brakes) -> None:
    brake = Checker(brakes(kind, timeout_seconds=10.0))
    for session in SESSIONS:
        await brake.check("get_weather_forecast", {"city": "Paris"}, session_id=session)
    shown = {state.session_id for state in await brake.sessions()}
    expected = {session.encode()[:128].decode("utf-8", "ignore") for session in SESSIONS}
    assert shown == expected
    state = await brake.inspect(f"{THREAD}/run/{RUN}")
    assert state is not None and (state.session_id, state.tool_name) == (f"{THREAD}/run/{RUN}", "get_weather_forecast")
    assert [found.session_id for found in await brake.sessions(f"{THREAD}/run/*")] == [state.session_id]


@pytest.mark.parametrize("tool", ["web_search_v2", "search_internal_document"])  # 13 and 24 characters
def test_realistic_records_keep_the_compact_encoding(redis_url: str, tool: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        with DistributedBrake.from_url(redis_url) as brake:
            for session in (str(uuid.uuid4()), f"{uuid.uuid4()}/run/{uuid.uuid4()}"):
                brake.check(tool, {"city": "Paris"}, session_id=session)
                brake.check(tool, {"city": "Paris"}, session_id=session)
                assert client.object("encoding", session_key(session)) == b"listpack", session
                assert max(len(value) for value in client.hgetall(session_key(session)).values()) <= 64
    finally:
        client.close()


def test_the_script_keeps_integer_counts_on_lua_5_4() -> None:
    """Lua 5.3+ divides to floats: a count must still be written as an integer ("2", never "2.0"), or
    `inspect` and `list` no longer read the record (fakeredis on Lua 5.4, Redis-compatible servers)."""
    import os
    import subprocess
    import sys

    code = (
        "from distbrake import DistributedBrake, LoopBrakeError\n"
        "brake = DistributedBrake.from_url('memory://lua54')\n"
        "brake.check('search', {'q': 1}, session_id='s')\n"
        "brake.check('search', {'q': 1}, session_id='s')\n"
        "raw = brake.client.hget(brake.key('s'), 'h')\n"
        "state = brake.inspect('s')\n"
        "print(raw[31:].decode(), state.count if state else None)\n"
        # the ladder's numbers too: a halt's x, a once-only call's time, a cap's count, a block's ttl
        "ladder = DistributedBrake.from_url('memory://lua54', key_prefix='l', halt_at=4,\n"
        "                                   tools={'mail': {'once': True, 'max_calls': 5}})\n"
        "for _ in range(4):\n"
        "    try: ladder.check('search', {}, session_id='h')\n"
        "    except LoopBrakeError: pass\n"
        "ladder.check('mail', {}, session_id='m')\n"
        "halt = ladder.inspect('h').halt\n"
        "fields = ladder.client.hgetall(ladder.key('m'))\n"
        "from distbrake.model import Halt\n"
        "ladder.block_key(ladder.key('b'), Halt('block', 1.0), 70000)\n"
        "print(halt.count, halt.limit, halt.since > 1e9, len(fields[b'o']), fields[b'nmail'].decode(),\n"
        "      ladder.client.hget(ladder.key('b'), 'h')[26:31] == (70000).to_bytes(5, 'big'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "FAKEREDIS_LUA_VERSION": "5.4"}, timeout=60)
    assert out.stdout.split() == ["2/3", "2", "4", "4", "True", "17", "1", "True"]  # "2/3": the count, judged by 3


def redis_py_packs(key: str, argv: tuple[bytes | int, ...]) -> bytes:
    """The same EVALSHA as redis-py's own connection packs it."""
    return b"".join(redis.Connection().pack_command("EVALSHA", script_sha(), 1, key, *argv))


@pytest.mark.parametrize("cycles", [None, (4, 3)])
@pytest.mark.parametrize("session", ["s", "thread-" + str(uuid.UUID(int=7)), "x" * 300, "é\n{*}"])
@pytest.mark.parametrize("tool", ["search", "t" * 300])
def test_a_checks_packed_evalsha_is_its_key_and_argv_on_the_wire(
    session: str, tool: str, cycles: tuple[int, int] | None,
) -> None:
    """`encode_call` packs the EVALSHA from its cached parts: the very bytes of `resp_evalsha(key, argv)`."""
    for call_id, warn_at, enforce, progress in ((None, None, True, False), ("c-1", 2, False, True)):
        for digest in ("ab" * 32, "abcd"):  # call_hash's, and one a caller could build by hand
            call = PreparedCall(tool, digest, session, call_id, Rules(5, warn_at, enforce, (), progress))
            for _ in range(2):  # made, then from the cache
                key, argv, packed = encode_call(call, "team", 60_000, 500, cycles)
                assert key == session_key(session, "team")
                assert packed == resp_evalsha(key, argv) == redis_py_packs(key, argv)
                # ARGV[CALL] .. ARGV[JUDGED], and with cycles ARGV[LONGEST] and ARGV[REPEATS]; the mode says which
                assert len(argv) == (7 if cycles is None else 9) == (JUDGED if cycles is None else REPEATS)
                assert argv[MODE - 1] == (b"c" if cycles is None else b"y")
                # an observation: the check's arguments in its own mode and the result's digest, never cycles
                seen, observed, packed = encode_call(call, "team", 60_000, 500, cycles, result=b"r" * 8)
                assert (seen, observed[1:]) == (key, (b"o", *argv[2:7], b"r" * 8))
                assert len(observed) == RESULT
                assert packed == resp_evalsha(seen, observed) == redis_py_packs(seen, observed)
                # a failure observation: the same, its mode and whether the call failed
                seen, observed, packed = encode_call(call, "team", 60_000, 500, cycles, failed=True)
                assert (seen, observed[1:]) == (key, (b"f", *argv[2:7], b"1"))
                assert packed == resp_evalsha(seen, observed) == redis_py_packs(seen, observed)
            # a tool with a rule of the ladder: MODE_LADDER, then ARGV[LADDER] alone: once, enforce, the cycle halt,
            # the cycle rule's longest period and repetitions (0 0: off), a byte each; halt_at, max_failures and
            # max_calls, 4 bytes big-endian each
            ladder = PreparedCall(tool, "ab" * 32, session, call_id, Rules(5, warn_at, enforce, (), progress, halt_at=7,
                                                                           once=True, max_calls=2**32 - 1))
            # and, the tool being once-only, ARGV[NOW]: this worker's clock (a once-only call's time)
            before = int(time.time())
            key, argv, packed = encode_call(ladder, "team", 60_000, 500, cycles, cycle_halt=4 if cycles else 0)
            assert len(argv) == NOW and argv[MODE - 1] == b"l"
            assert argv[LADDER - 1] == bytes((1, enforce, *((4, *cycles) if cycles else (0, 0, 0)))) + bytes.fromhex(
                "00000007" "00000000" "ffffffff")
            assert len(argv[LADDER - 1]) == LADDER_BYTES
            assert before <= int.from_bytes(cast(bytes, argv[NOW - 1]), "big") <= time.time()
            assert packed == resp_evalsha(key, argv) == redis_py_packs(key, argv)
            # the brake's own encoder packs the same (a tool not once-only: no ARGV[NOW])
            for rules in (ladder.rules, ladder.rules._replace(once=False)):
                made = ladder._replace(rules=rules)
                encoder = CheckEncoder("team", 60_000, 500, cycles, brake_script().evalsha_head, 4 if cycles else 0)
                mine = encoder(made)
                assert len(mine[1]) == (NOW if rules.once else LADDER)
                assert mine[2] == resp_evalsha(mine[0], mine[1]) == redis_py_packs(mine[0], mine[1])
            assert packed == resp_evalsha(key, argv) == redis_py_packs(key, argv)


def test_a_process_with_thousands_of_sessions_at_once_keeps_each_ones_encoding() -> None:
    """8,000 sessions checked in turn, again and again, are each encoded once (at 4096 tasks with a cache
    of 4,096, every check of a session missed: a fifth of the time at that load)."""
    calls = [PreparedCall("search", "cd" * 32, f"thread-{uuid.uuid4()}", None, Rules(3)) for _ in range(8000)]
    for call in calls:
        encode_call(call, "cache", 60_000, 500)
    before = wire._fixed.cache_info()
    for call in calls:
        encode_call(call, "cache", 60_000, 500)
    assert wire._fixed.cache_info().hits - before.hits == len(calls)


def test_the_lua_header_is_the_twin_of_contract_py() -> None:
    """Every name of the wire contract's block at the top of lua/brake.lua has the same value in
    distbrake/redis/contract.py, and every contract name (but Python's own helpers) is in that block."""
    text = (Path(__file__).resolve().parents[1] / "lua" / "brake.lua").read_text(encoding="utf-8")
    lua = {name: ast.literal_eval(value) for name, value in contract_block(text).items()}
    for name, value in lua.items():
        mine = getattr(contract, name)
        assert (mine.decode("latin-1") if isinstance(mine, bytes) else mine) == value, name
    python_only = {
        "FIELDS", "FIELD_JUDGED", "CYCLE_REPLY", "LADDER_REPLY", "HALT_PARTS", "REPLY_COUNT_SHIFT", "RESULT_BYTES",
    }
    assert set(contract.__all__) - python_only == set(lua)
    assert "argc" not in text and "#ARGV" not in text  # the mode argument says what is asked, not a count


def test_redis_runs_the_script_with_its_contract_folded_into_the_code() -> None:
    """What Redis runs is lua/brake.lua line for line, the contract block's lines empty and each of its names
    in the code replaced by its value as the block writes it; comments and string literals as they are."""
    text, names = script_file(), contract_block(script_file())
    assert script_source() == fold_contract(text) and brake_script().text == script_source()
    lines, folded = text.splitlines(), script_source().splitlines()
    assert len(folded) == len(lines)
    first = next(i for i, line in enumerate(lines) if line.startswith("-- The wire contract"))
    end = lines.index("", first)  # the block ends at the first empty line
    assert folded[:first + 1] == lines[:first + 1]  # the header comment and the block's title
    assert folded[first + 1:end] == [""] * (end - first - 1)
    code, mine = "\n".join(lines[end:]), "\n".join(folded[end:])
    kept = re.compile(r"--\[\[.*?\]\]|--[^\n]*|'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"", re.S)
    comments = [t for t in kept.findall(code) if t.startswith("--")]
    assert [t for t in kept.findall(mine) if t.startswith("--")] == comments  # comments as they are
    literals = iter(t for t in kept.findall(mine) if not t.startswith("--"))  # the code's string literals as they
    assert all(any(t == found for found in literals) for t in kept.findall(code) if not t.startswith("--"))  # are,
    assert set(literals) <= set(names.values())  # in order, among the folded values
    assert not set(re.findall(r"\b[A-Z][A-Z0-9_]*\b", kept.sub("", mine))) & set(names)  # no name left in the code
    assert "local call = ARGV[1]" in mine and "rcall('HGET', key, 'h')" in mine


def test_folding_replaces_whole_names_outside_comments_and_strings() -> None:
    text = "\n".join([
        "--[[ CALL in a long comment ]]",
        "-- The wire contract (a title).",
        "local CALL, CALL_END = 1, 16",
        "local MARK = '/'  -- CALL's mark",
        "",
        "local x = ARGV[CALL] .. 'CALL' .. \"CALL_END\"  -- CALL",
        "return sub(x, CALL_END + 1, CALL_END) .. MARK .. CALLS",
    ])
    assert fold_contract(text).splitlines() == [
        "--[[ CALL in a long comment ]]", "-- The wire contract (a title).", "", "", "",
        "local x = ARGV[1] .. 'CALL' .. \"CALL_END\"  -- CALL",
        "return sub(x, 16 + 1, 16) .. '/' .. CALLS",
    ]
    with pytest.raises(ValueError, match="not a line of the wire contract"):
        fold_contract(text.replace("local MARK", "MARK"))
    for long_bracket in ("local s = [[CALL]]", "local s = [==[CALL]==]", "--[==[ a comment\n CALL ]==]"):
        with pytest.raises(ValueError, match="long bracket"):  # its text would be folded silently: refused
            fold_contract(f"{text}\n{long_bracket}")


@pytest.mark.parametrize("count", [8, 9, 98, 99, 100, 998, 999, 1000, 12345])
@pytest.mark.parametrize("where", ["redis", "memory"])
def test_a_streak_goes_on_from_any_count(where: str, redis_url: str, count: int) -> None:
    """The count is kept in decimal (its digits made by string.char below 100) and read back as bytes (three
    by one call, then byte by byte): a streak goes on from every number of digits."""
    url = redis_url if where == "redis" else f"memory://counts-{uuid.uuid4().hex}"
    with DistributedBrake.from_url(url, max_repeats=100_000) as brake:
        session, tool, args = f"counts-{count}", "search", {"q": "paris"}
        digest = bytes.fromhex(call_hash(tool, args))[:16]
        brake.client.hset(brake.key(session), mapping={
            b"h": digest + b"\x01" * 5 + b"\x02" * 5 + (60_000).to_bytes(5, "big") + b"%d/100000" % count,
            b"s": bytes([len(tool)]) + tool.encode() + session.encode(),
        })
        brake.client.pexpire(brake.key(session), 60_000)
        assert [brake.check(tool, args, session_id=session).count for _ in range(3)] == [count + 1, count + 2,
                                                                                        count + 3]
        assert brake.client.hget(brake.key(session), "h").endswith(b"%d/100000" % (count + 3))
        brake.clear(session)


@pytest.mark.parametrize("ladder", [{}, {"halt_at": 4, "tools": {"search": {"once": True, "max_calls": 5}}}])
@pytest.mark.parametrize("where", ["redis", "memory"])
def test_a_record_of_the_previous_script_version_goes_on(where: str, redis_url: str, ladder: dict[str, object]) -> None:
    """A record as an earlier version of the script wrote it (field h: call hash 16 | last call id 5 | previous
    call id 5 | ttl 5 | count, with no H_JUDGED_MARK; s; j) is read by `inspect` and its streak continued by the
    next identical call (with the ladder's rules on too: its fields start empty); from then on h says what the
    streak was judged by, and the stale j is not read."""
    url = redis_url if where == "redis" else f"memory://previous-{uuid.uuid4().hex}"
    with DistributedBrake.from_url(url, max_repeats=3, **ladder) as brake:  # type: ignore[arg-type]
        session, tool, args = "previous-version", "search", {"q": "paris"}
        digest = bytes.fromhex(call_hash(tool, args))[:16]
        record = {
            b"h": digest + b"\x01" * 5 + b"\x00" * 5 + (60_000).to_bytes(5, "big") + b"2",
            b"s": bytes([len(tool)]) + tool.encode() + session.encode(),
            b"j": b"5",  # judged by another limit than this brake's: `inspect` shows j's until h has its own
        }
        brake.client.hset(brake.key(session), mapping=record)
        brake.client.pexpire(brake.key(session), 60_000)
        state = brake.inspect(session)
        assert state is not None
        assert (state.count, state.tool_name, state.session_id, state.max_repeats) == (2, tool, session, 5)
        with pytest.raises(LoopBrakeError) as denied:
            brake.check(tool, args, session_id=session)
        assert denied.value.count == 3
        assert brake.client.hget(brake.key(session), "h").endswith(b"3/3")
        state = brake.inspect(session)
        assert state is not None and (state.count, state.max_repeats) == (3, 3)
        brake.clear(session)


@pytest.mark.parametrize("where", ["redis", "memory"])
def test_an_older_halted_record_stays_halted(where: str, redis_url: str) -> None:
    """A session halted by an earlier version (h ending "5!": the count, no H_JUDGED_MARK) is refused, for any
    tool, by this script, and `inspect` reads its halt."""
    url = redis_url if where == "redis" else f"memory://old-halt-{uuid.uuid4().hex}"
    with DistributedBrake.from_url(url, max_repeats=3) as brake:
        session, tool, args = "old-halt", "search", {"q": "paris"}
        digest = bytes.fromhex(call_hash(tool, args))[:16]
        halt = wire.encode_halt(Halt("repeat", 1_700_000_000.0, tool, 5, 5, digest[:6].hex()))
        brake.client.hset(brake.key(session), mapping={
            b"h": digest + b"\x01" * 5 + b"\x02" * 5 + (60_000).to_bytes(5, "big") + b"5!",
            b"s": bytes([len(tool)]) + tool.encode() + session.encode(), b"j": b"3", b"x": halt,
        })
        brake.client.pexpire(brake.key(session), 60_000)
        for name, call in ((tool, args), ("other", {})):
            with pytest.raises(LoopBrakeHalt) as halted:
                brake.check(name, call, session_id=session)
            assert (halted.value.halt_rule, halted.value.count) == ("repeat", 5)
        state = brake.inspect(session)
        assert state is not None and state.halt is not None and (state.count, state.halt.kind) == (5, "repeat")
        assert brake.client.hget(brake.key(session), "h").endswith(b"5!")  # refused: nothing written
        brake.clear(session)


@pytest.mark.parametrize("tail", [b"", b"/3", b"x5/3"])
@pytest.mark.parametrize("where", ["redis", "memory"])
def test_a_record_with_no_count_starts_a_new_streak(where: str, redis_url: str, tail: bytes) -> None:
    """An h with this call's hash but no count (not a record this script wrote) is no streak to go on: the check
    starts one at 1, even with the very call id h names as its last (never a replay of count 0)."""
    url = redis_url if where == "redis" else f"memory://no-count-{uuid.uuid4().hex}"
    with DistributedBrake.from_url(url, max_repeats=3) as brake:
        session, tool, args = "no-count", "search", {"q": "paris"}
        digest = bytes.fromhex(call_hash(tool, args))[:16]
        last = hashlib.blake2b(b"call-1", digest_size=5).digest()  # the id of call_id="call-1" (wire's hash)
        brake.client.hset(brake.key(session), mapping={
            b"h": digest + last + b"\x00" * 5 + (60_000).to_bytes(5, "big") + tail,
            b"s": bytes([len(tool)]) + tool.encode() + session.encode(),
        })
        brake.client.pexpire(brake.key(session), 60_000)  # as if checked just now: within the replay window
        verdict = brake.check(tool, args, session_id=session, call_id="call-1")
        assert (verdict.count, verdict.replayed, verdict.decided_by) == (1, False, "redis")
        assert brake.client.hget(brake.key(session), "h").endswith(b"1/3")
        brake.clear(session)


@pytest.mark.parametrize("where", ["redis", "memory"])
def test_the_script_refuses_a_mode_it_does_not_know(where: str, redis_url: str) -> None:
    """The script does what ARGV[MODE] asks, never what the number of arguments suggests: a check's
    arguments with another mode are refused, and the record is left alone."""
    url = redis_url if where == "redis" else f"memory://mode-{uuid.uuid4().hex}"
    with DistributedBrake.from_url(url) as brake:
        call = PreparedCall("search", "ab" * 32, "mode-session", None, Rules(3))
        key, argv, _ = encode_call(call, brake.settings.key_prefix, 60_000, 500)
        brake.client.script_load(brake.script.text)
        unknown = (argv[0], b"x", *argv[contract.MODE:])
        with pytest.raises(redis.exceptions.ResponseError, match="unknown mode"):
            brake.client.evalsha(brake.script.sha, 1, key, *unknown)
        assert brake.client.exists(key) == 0
        assert decode_reply(brake.client.evalsha(brake.script.sha, 1, key, *argv))[0] == 1
        brake.clear("mode-session")
