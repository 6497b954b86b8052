"""The circuit breaker and the failure policy, against a real redis-server behind the fault proxy.

One outage moves the backoff one step however many checks were in flight;
the `local` policy's fallback streaks end with the outage; a key that is not
a streak record is that session's problem, never the backend's health; and
`clear_all` deletes streak records only. Each test prints its figures.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from distbrake import AsyncDistributedBrake, BrakeUnavailableError, DistributedBrake, session_key
from tests.backends import Checker
from tests.fault_proxy import FaultProxy
from tests.faults import FLAVOURS, BrakeFactory, outcome, until_redis
from tests.servers import RedisServer

RETRY_AFTER = 0.2
TIMEOUT = 0.3


def in_flight_sync(brake: DistributedBrake, n: int) -> list[str]:
    """`n` checks started together from `n` threads; what decided each."""
    barrier = threading.Barrier(n)
    decided: list[str] = []

    def one(i: int) -> None:
        barrier.wait()
        decided.append(brake.check("search", {"i": i}, session_id=f"s{i}").decided_by)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return decided


@pytest.mark.parametrize("n", [1, 8, 64])
@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_one_blip_moves_the_backoff_one_step(
    flavour: str, n: int, proxy: FaultProxy, make: BrakeFactory
) -> None:
    """A blip that catches n checks in flight opens the breaker once, with the first pause."""
    brake = make(
        flavour, proxy.url, retry_after_seconds=RETRY_AFTER, timeout_seconds=TIMEOUT,
        on_backend_error="local",
    )
    assert (await brake.check("warm", {}, session_id="w")).decided_by == "redis"
    proxy.black_hole()
    if flavour == "sync":
        decided = await asyncio.to_thread(in_flight_sync, brake.brake, n)
    else:
        verdicts = await asyncio.gather(
            *(brake.check("search", {"i": i}, session_id=f"s{i}") for i in range(n))
        )
        decided = [v.decided_by for v in verdicts]
    proxy.pass_through()
    health = brake.brake.failures.breaker
    print(f"\n{flavour}: {n} checks in flight during the blip; pause after it {health.pause:.2f}s "
          f"(first pause {RETRY_AFTER}s)")
    assert decided == ["fallback"] * n
    assert health.down and health.pause == RETRY_AFTER
    started = time.monotonic()
    assert (await until_redis(brake, "after", deadline=RETRY_AFTER + 4 * TIMEOUT + 1.0)).decided_by == "redis"
    print(f"{flavour}: decided by Redis again {time.monotonic() - started:.2f}s after the blip")
    assert health.pause == RETRY_AFTER and not health.down


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_a_failed_probe_doubles_the_pause_once(flavour: str, proxy: FaultProxy, make: BrakeFactory) -> None:
    brake = make(flavour, proxy.url, retry_after_seconds=0.05, timeout_seconds=TIMEOUT)
    proxy.refuse()
    assert (await brake.check("t", {}, session_id="a")).decided_by == "fallback"
    health = brake.brake.failures.breaker
    assert health.pause == 0.05
    deadline = time.monotonic() + 5
    while health.pause == 0.05 and time.monotonic() < deadline:  # the next due probe fails
        await brake.check("t", {"n": time.monotonic()}, session_id="a")
        await asyncio.sleep(0.01)
    assert health.pause == 0.1


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_fallback_streaks_end_with_the_outage(flavour: str, proxy: FaultProxy, make: BrakeFactory) -> None:
    """X on Redis; outage: X, X (fallback 1, 2); back: Y X Z Y W; second outage: X is 1, not denied at 3."""
    brake = make(flavour, proxy.url, retry_after_seconds=0.05, timeout_seconds=TIMEOUT, max_repeats=3)
    x, y, z, w = ({"q": name} for name in "xyzw")
    assert await outcome(brake, "search", x, session_id="s") == ("redis", 1)
    proxy.refuse()
    assert [await outcome(brake, "search", x, session_id="s") for _ in range(2)] == [("fallback", 1), ("fallback", 2)]
    proxy.pass_through()
    await until_redis(brake, "probe")
    assert [await outcome(brake, "search", args, session_id="s") for args in (y, x, z, y, w)] == [
        ("redis", 1), ("redis", 1), ("redis", 1), ("redis", 1), ("redis", 1)
    ]
    proxy.refuse()
    assert await outcome(brake, "search", x, session_id="s") == ("fallback", 1)


async def foreign_key_checks(brake: Checker, server: RedisServer) -> tuple[list[str], list[str]]:
    """Poison one session's key with a string; what decides it, and what decides 50 healthy sessions after."""
    with server.client() as admin:
        admin.set(session_key("poisoned"), "not a record")
    poisoned = [(await outcome(brake, "search", {"i": i}, session_id="poisoned"))[0] for i in range(3)]
    healthy = [(await outcome(brake, "search", {"i": i}, session_id=f"ok{i}"))[0] for i in range(50)]
    return poisoned, healthy


@pytest.mark.parametrize("policy", ["closed", "local", "open"])
@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_a_foreign_value_at_one_key_is_that_sessions_problem(
    flavour: str, policy: str, server: RedisServer, make: BrakeFactory
) -> None:
    brake = make(flavour, server.url, on_backend_error=policy, timeout_seconds=TIMEOUT)
    poisoned, healthy = await foreign_key_checks(brake, server)
    expected = {"closed": "unavailable", "local": "fallback", "open": "fail-open"}[policy]
    print(f"\n{flavour}/{policy}: poisoned session -> {poisoned}; healthy sessions decided by "
          f"{sorted(set(healthy))}")
    assert poisoned == [expected] * 3
    assert healthy == ["redis"] * 50
    assert not brake.brake.failures.breaker.down


async def test_a_foreign_value_under_closed_says_what_is_wrong(server: RedisServer) -> None:
    brake = DistributedBrake.from_url(server.url, on_backend_error="closed")
    with server.client() as admin:
        admin.set(session_key("poisoned"), "not a record")
    try:
        with pytest.raises(BrakeUnavailableError) as caught:
            brake.check("search", {"secret": "hunter2"}, session_id="poisoned")
    finally:
        brake.close()
    text = str(caught.value)
    assert session_key("poisoned") in text and "not a streak record" in text and "WRONGTYPE" in text
    assert "hunter2" not in text


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_clear_all_deletes_streak_records_only(flavour: str, server: RedisServer, make: BrakeFactory) -> None:
    brake = make(flavour, server.url)
    for i in range(3):
        await brake.check("search", {}, session_id=f"s{i}")
    foreign = "distbrake:" + "x" * 18  # matches the records' SCAN pattern, but is someone else's string
    with server.client() as admin:
        admin.set(foreign, "keep me")
        admin.hset("distbrake:" + "y" * 18, "other", "hash")
        cleared = await brake._maybe(brake.brake.clear_all())
        assert cleared == 3
        assert admin.get(foreign) == b"keep me"
        assert admin.hget("distbrake:" + "y" * 18, "other") == b"hash"
        assert admin.dbsize() == 2


async def test_from_url_refuses_an_empty_url() -> None:
    from distbrake import InvalidURLError

    with pytest.raises(InvalidURLError):
        DistributedBrake.from_url("")
    with pytest.raises(InvalidURLError):
        AsyncDistributedBrake.from_url("")
