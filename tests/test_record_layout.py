"""The session record stays small: UUIDs in session ids are packed, so realistic records keep Redis's compact encoding.

Redis keeps a hash as a listpack (the compact encoding) while every value
is at most `hash-max-listpack-value` (64) bytes; a longer field s would
make every record of the fleet about 120 bytes larger.
"""

from __future__ import annotations

import uuid

import pytest
import redis

from distbrake import DistributedBrake, session_key
from distbrake.core import PreparedCall
from distbrake.model import Rules
from distbrake.redis import wire
from distbrake.redis.wire import encode_call, resp_evalsha, script_sha
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
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "FAKEREDIS_LUA_VERSION": "5.4"}, timeout=60)
    assert out.stdout.split() == ["2", "2"]


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
                assert len(argv) == (6 if cycles is None else 8)
                # an observation: the check's first six arguments and the result's digest, never cycles
                seen, observed, packed = encode_call(call, "team", 60_000, 500, cycles, result=b"r" * 8)
                assert (seen, observed[1:]) == (key, (*argv[1:6], b"r" * 8))
                assert packed == resp_evalsha(seen, observed) == redis_py_packs(seen, observed)


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
