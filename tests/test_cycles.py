"""The opt-in cycle rule (issue 10.6): A,B,A,B,A,B is denied at the sixth call, A,B,A,C never.

Written once and run on every brake (`tests.backends.ALL_BRAKES`); the
reference-model test in `test_rule_options.py` drives random sequences with
cycles on through every brake too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redis

from distbrake import (
    AsyncDistributedBrake,
    ConfigurationError,
    DistributedBrake,
    LoopBrake,
    LoopBrakeError,
    call_hash,
    session_key,
)
from tests.backends import ALL_BRAKES, REDIS_BRAKES, Brakes, Checker


@pytest.fixture(params=ALL_BRAKES)
def make(request: pytest.FixtureRequest, brakes: Brakes) -> Callable[..., Checker]:
    build = brakes.of(request.param)
    # a generous timeout: a check that fell to the failure policy on a busy machine would start a new ring
    return lambda **options: Checker(build(timeout_seconds=10.0, **options))


A, B, C, D = ("search", {"q": "a"}), ("fetch", {"url": "b"}), ("search", {"q": "c"}), ("read", {"p": "d"})


async def outcomes(brake: Checker, calls: list[tuple[str, dict[str, str]]], **kw: Any) -> list[object]:
    """Each call's count, or the denial's kind and period ("cycle2"), or "would" in shadow mode."""
    seen: list[object] = []
    for tool, args in calls:
        try:
            verdict = await brake.check(tool, args, session_id="s", **kw)
        except LoopBrakeError as error:
            seen.append(f"{error.kind}{error.period or ''}")
        else:
            seen.append("would" if verdict.would_deny else verdict.count)
    return seen


async def test_a_b_a_b_a_b_is_denied_at_the_sixth_call_and_every_call_that_goes_on(
    make: Callable[..., Checker],
) -> None:
    brake = make(max_cycle_period=2)
    assert await outcomes(brake, [A, B] * 4) == [1, 1, 1, 1, 1, "cycle2", "cycle2", "cycle2"]
    assert await outcomes(brake, [D]) == [1]  # a different call ends the cycle


async def test_a_b_a_c_is_never_a_cycle(make: Callable[..., Checker]) -> None:
    brake = make(max_cycle_period=4, cycle_repeats=3)
    assert await outcomes(brake, [A, B, A, D] * 2 + [A, B, A]) == [1] * 11
    assert await outcomes(brake, [D]) == ["cycle4"]  # the third A,B,A,D


async def test_the_error_names_the_tools_the_period_and_hash_prefixes_only(make: Callable[..., Checker]) -> None:
    brake = make(max_cycle_period=3, cycle_repeats=2)
    for tool, args in [A, B, D, A, B]:
        await brake.check(tool, args, session_id="s")
    with pytest.raises(LoopBrakeError) as denied:
        await brake.check(*D, session_id="s")
    error = denied.value
    assert (error.kind, error.period, error.cycle_repeats) == ("cycle", 3, 2)
    assert error.cycle_hash_prefixes == tuple(call_hash(tool, args)[:12] for tool, args in [A, B, D])
    assert error.cycle_tools == ("search", "fetch", "read")
    assert (error.tool_name, error.hash_prefix) == ("read", call_hash(*D)[:12])
    prefixes = ", ".join(f"{call_hash(tool, args)[:12]}\u2026" for tool, args in [A, B, D])
    assert str(error) == (
        f'loop brake: tools "search", "fetch", "read" called in a cycle of 3 calls repeated 2 times in a row '
        f"(calls {prefixes}); the call was denied before it ran. Change the arguments, call a different tool, "
        "or stop."
    )
    assert "url" not in str(error) and '"b"' not in str(error)


async def test_one_tool_alternating_its_arguments_is_a_cycle_too(make: Callable[..., Checker]) -> None:
    brake = make(max_cycle_period=2)
    assert await outcomes(brake, [A, C] * 3) == [1, 1, 1, 1, 1, "cycle2"]
    with pytest.raises(LoopBrakeError, match=r'^loop brake: tool "search" called in a cycle of 2 calls'):
        await brake.check(*A, session_id="s")


async def test_the_streak_rule_comes_first(make: Callable[..., Checker]) -> None:
    # A,A,B repeated: the A,A streak never reaches 3, so only the cycle rule denies ...
    brake = make(max_cycle_period=3)
    assert await outcomes(brake, [A, A, B] * 3) == [1, 2, 1] * 2 + [1, 2, "cycle3"]
    # ... and a call at the limit is a repeat, whatever ring it ends
    brake = make(max_cycle_period=2, max_repeats=2)
    await brake.clear("s")
    assert await outcomes(brake, [A, B, A, B, A, A]) == [1, 1, 1, 1, 1, "repeat"]


async def test_replays_are_counted_once_and_get_the_same_denial(make: Callable[..., Checker]) -> None:
    brake = make(max_cycle_period=2)
    seen = []
    for index, (tool, args) in enumerate([A, B] * 3):
        for _ in range(2):  # every call passes two seams with one call id: it enters the ring once
            try:
                seen.append((await brake.check(tool, args, session_id="s", call_id=f"c{index}")).count)
            except LoopBrakeError as error:
                seen.append(error.kind)
    assert seen == [1] * 10 + ["cycle", "cycle"]


async def test_shadow_mode_reports_would_deny_where_enforcing_denies(make: Callable[..., Checker]) -> None:
    brake = make(max_cycle_period=2, enforce=False)
    assert await outcomes(brake, [A, B] * 4) == [1, 1, 1, 1, 1, "would", "would", "would"]
    brake = make(max_cycle_period=2, tools={"fetch": {"enforce": False}})
    await brake.clear("s")
    assert await outcomes(brake, [A, B] * 4) == [1, 1, 1, 1, 1, "would", "cycle2", "would"]


async def test_cycles_are_off_by_default(make: Callable[..., Checker]) -> None:
    brake = make()
    assert await outcomes(brake, [A, B] * 10) == [1] * 20


async def test_sessions_keep_their_own_rings(make: Callable[..., Checker]) -> None:
    brake = make(max_cycle_period=2)
    for tool, args in [A, B] * 2 + [A]:
        await brake.check(tool, args, session_id="s")
        await brake.check(tool, args, session_id="other")
    await brake.check(*D, session_id="other")
    assert await outcomes(brake, [B]) == ["cycle2"]
    assert (await brake.check(*B, session_id="other")).count == 1


@pytest.mark.parametrize("kind", REDIS_BRAKES)
async def test_only_sessions_with_cycles_on_keep_a_bounded_ring(kind: str, brakes: Brakes, redis_url: str) -> None:
    plain, cycling = brakes(kind, redis_url), brakes(kind, redis_url, max_cycle_period=4, cycle_repeats=10)
    for index in range(100):
        for brake, session in ((plain, "plain"), (cycling, "cycling")):
            await Checker(brake).check("search", {"q": index}, session_id=session)
    client = redis.Redis.from_url(redis_url)
    try:
        assert set(client.hkeys(session_key("plain"))) == {b"h", b"s"}
        ring = client.hget(session_key("cycling"), "c")
        assert ring is not None and ring[2] == 40  # 4 * 10 entries of 6 bytes, and the last 5 tools
        assert len(ring) == 3 + 40 * 6 + 5 * len(b"\x06search")
    finally:
        client.close()


async def test_an_async_burst_of_one_session_keeps_its_order(brakes: Brakes, redis_url: str) -> None:
    brake = brakes("async-redis", redis_url, max_cycle_period=2)
    assert isinstance(brake, AsyncDistributedBrake)

    async def one(tool: str, args: dict[str, str]) -> object:
        try:
            return (await brake.check(tool, args, session_id="burst")).count
        except LoopBrakeError as error:
            return error.kind

    # started in one tick: the coalescer batches them, and never as a run (cycles need each call's ring step)
    results = await asyncio.gather(*(one(tool, args) for tool, args in [A, B] * 4))
    assert results == [1, 1, 1, 1, 1, "cycle", "cycle", "cycle"]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"max_cycle_period": 1}, ["max_cycle_period", "argument", "2..4"]),
        ({"max_cycle_period": 5}, ["max_cycle_period", "argument", "2..4"]),
        ({"max_cycle_period": True}, ["max_cycle_period", "integer"]),
        ({"max_cycle_period": 2, "cycle_repeats": 1}, ["cycle_repeats", "2..10"]),
        ({"max_cycle_period": 2, "cycle_repeats": 11}, ["cycle_repeats", "2..10"]),
    ],
)
def test_bad_cycle_options_fail_at_build(options: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ConfigurationError) as failed:
        LoopBrake(**options)
    assert all(word in str(failed.value) for word in words), str(failed.value)


def test_cycle_options_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTBRAKE_MAX_CYCLE_PERIOD", "3")
    monkeypatch.setenv("DISTBRAKE_CYCLE_REPEATS", "2")
    with DistributedBrake.from_url("memory://cycles-env") as brake:
        assert (brake.settings.max_cycle_period, brake.settings.cycle_repeats) == (3, 2)
    monkeypatch.setenv("DISTBRAKE_MAX_CYCLE_PERIOD", "9")
    with pytest.raises(ConfigurationError, match="environment variable DISTBRAKE_MAX_CYCLE_PERIOD"):
        LoopBrake()


def test_a_client_that_decodes_replies_reads_a_cycle_denial_too(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=5)
    brake = DistributedBrake(client, max_cycle_period=2, cycle_repeats=2, on_backend_error="closed")
    try:
        for tool, args in [A, B, A]:
            brake.check(tool, args, session_id="decoding")
        with pytest.raises(LoopBrakeError) as denied:
            brake.check(*B, session_id="decoding")
        assert denied.value.cycle_hash_prefixes == (call_hash(*A)[:12], call_hash(*B)[:12])
        assert denied.value.cycle_tools == ("search", "fetch")
    finally:
        brake.clear("decoding")
        brake.close()
