"""Proof under faults: every failure promise of the distributed brakes, against real redis-server.

No mocks and no fixed sleeps in assertions: faults come from real processes
(killed, restarted, failed over) and from `tests/fault_proxy.py` (lost
replies, black holes, refused connections). Waits poll a condition under a
deadline; time bounds are generous upper bounds only.

What each test proves is listed in the README's "Guarantees" table.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import random
import statistics
import threading
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from distbrake import (
    BrakeUnavailableError,
    DistributedBrake,
    LoopBrakeError,
    Verdict,
)
from distbrake.redis.wire import FIELDS, decode_state
from tests.backends import Checker
from tests.fault_proxy import FaultProxy
from tests.faults import (
    DECIDED_BY_POLICY,
    FLAVOURS,
    POLICIES,
    RECOVERY_DEADLINE,
    BrakeFactory,
    outcome,
    until_redis,
)
from tests.servers import ClusterNodeInfo, RedisCluster, RedisServer, wait_replicated, wait_until
from tests.servers.resp import resp_end
from tests.waits import measured


def raw_count(server: RedisServer, brake: Checker, session: str) -> int | None:
    """The streak count stored in Redis for `session`, read with a client of our own (not the proxy)."""
    with server.client() as client:
        fields = client.hmget(brake.brake.key(session), list(FIELDS))
    state = decode_state(fields, -1, 0.0)
    return None if state is None else state.count


async def eventually(predicate: Callable[[], object], what: str, deadline: float = RECOVERY_DEADLINE) -> None:
    """Poll `predicate` (letting the event loop run) until it is true; bounded."""
    end = time.monotonic() + deadline
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline}s waiting for {what}")
        await asyncio.sleep(0.01)


# -- the proxy itself --------------------------------------------------------------------


def test_resp_end_finds_whole_values_only() -> None:
    """The proxy pairs commands and replies by RESP framing; partial values wait for more bytes."""
    assert resp_end(b"+OK\r\n") == 5
    assert resp_end(b":12\r\n:1") == 5
    assert resp_end(b"$3\r\nabc\r\n") == 9
    assert resp_end(b"$3\r\nab") is None
    assert resp_end(b"$-1\r\n") == 5
    assert resp_end(b"*2\r\n$1\r\na\r\n:5\r\n") == 15
    assert resp_end(b"*2\r\n$1\r\na\r\n") is None
    assert resp_end(b"%1\r\n+k\r\n:1\r\n") == 12
    assert resp_end(b"-NOSCRIPT No matching script\r\n") == len("-NOSCRIPT No matching script\r\n")
    assert resp_end(b"") is None


def test_proxy_passes_through_and_counts(server: RedisServer, proxy: FaultProxy) -> None:
    with server.client(port=proxy.port) as client:
        assert client.ping()
        client.set("k", "v")
        assert client.get("k") == b"v"
    assert proxy.connections >= 1
    assert proxy.commands >= 3


# -- 1. lost replies: a retried check is counted once --------------------------------------


@pytest.mark.parametrize("with_call_id", [True, False], ids=["host-call-id", "no-call-id"])
@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_lost_reply_is_counted_once(
    flavour: str, with_call_id: bool, server: RedisServer, proxy: FaultProxy, make: BrakeFactory
) -> None:
    """Redis runs the check, the reply is lost, redis-py retries with the same call id: one count."""
    brake = make(flavour, proxy.url, max_repeats=1000, on_backend_error="closed")
    faults = 8
    for n in range(1, faults + 1):
        proxy.drop_replies(1)
        call_id = f"call-{n}" if with_call_id else None
        verdict = await brake.check("search", {"q": "same"}, session_id="lost", call_id=call_id)
        assert (verdict.count, verdict.replayed, verdict.decided_by) == (n, True, "redis")
    assert proxy.dropped == faults
    assert raw_count(server, brake, "lost") == faults
    # and the streak goes on from there, without faults
    verdict = await brake.check("search", {"q": "same"}, session_id="lost")
    assert (verdict.count, verdict.replayed) == (faults + 1, False)


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_lost_replies_under_concurrency_count_each_call_once(
    flavour: str, server: RedisServer, proxy: FaultProxy, make: BrakeFactory
) -> None:
    """Bursts of concurrent checks (a pipeline for asyncio, threads for sync), one lost reply per burst."""
    brake = make(flavour, proxy.url, max_repeats=1000, on_backend_error="closed", timeout_seconds=2.0)
    sessions = [f"burst-{i}" for i in range(20)]
    rounds = 6
    for round_no in range(1, rounds + 1):
        proxy.drop_replies(1)
        checks = [
            (session, f"{session}-{round_no}" if i % 2 else None) for i, session in enumerate(sessions)
        ]
        if flavour == "async":
            verdicts = await asyncio.gather(
                *(brake.check("fetch", {"url": "x"}, session_id=s, call_id=c) for s, c in checks)
            )
        else:
            verdicts = await _in_threads(brake, [("fetch", {"url": "x"}, s, c) for s, c in checks])
        assert [v.count for v in verdicts] == [round_no] * len(sessions)
        assert {v.decided_by for v in verdicts} == {"redis"}
    assert proxy.dropped == rounds
    assert [raw_count(server, brake, s) for s in sessions] == [rounds] * len(sessions)


async def _in_threads(brake: Checker, calls: list[tuple[str, Any, str, str | None]]) -> list[Verdict]:
    """Run sync checks in threads at once (a barrier lines them up)."""
    barrier = threading.Barrier(len(calls))
    results: list[Verdict | BaseException | None] = [None] * len(calls)

    def run(index: int) -> None:
        tool, args, session, call_id = calls[index]
        barrier.wait()
        try:
            results[index] = brake.brake.check(tool, args, session_id=session, call_id=call_id)
        except BaseException as error:
            results[index] = error

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        await asyncio.to_thread(thread.join, 30)
    verdicts = []
    for result in results:
        if not isinstance(result, Verdict):
            raise AssertionError(f"a threaded check failed: {result!r}")
        verdicts.append(result)
    return verdicts


@pytest.mark.parametrize("copies", [2, 3, 5])
async def test_lost_pipeline_reply_counts_same_session_checks_once(
    copies: int, server: RedisServer, proxy: FaultProxy, make: BrakeFactory
) -> None:
    """Identical concurrent checks of one session coalesced into one pipeline whose reply is lost.

    redis-py resends the whole pipeline; each check must still be counted
    once: the counts are 1..copies, as without the fault.
    """
    brake = make("async", proxy.url, max_repeats=1000, on_backend_error="closed")
    await brake.check("warm", {}, session_id="warm")  # the script is loaded; the next batch is EVALSHAs only
    proxy.drop_replies(1)
    verdicts = await asyncio.gather(
        *(brake.check("search", {"q": "dup"}, session_id="dup") for _ in range(copies))
    )
    assert proxy.dropped == 1
    assert sorted(v.count for v in verdicts) == list(range(1, copies + 1))
    assert raw_count(server, brake, "dup") == copies


# -- 2. Redis killed, then back: each failure policy ---------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_redis_killed_mid_stream_then_back(
    flavour: str, policy: str, server: RedisServer, make: BrakeFactory
) -> None:
    brake = make(
        flavour, server.url, max_repeats=3, on_backend_error=policy,
        retry_after_seconds=0.05, timeout_seconds=0.5,
    )
    assert await outcome(brake, "search", {"q": 1}, session_id="s") == ("redis", 1)
    assert await outcome(brake, "search", {"q": 1}, session_id="s") == ("redis", 2)

    server.kill()
    during = [await outcome(brake, "search", {"q": 2}, session_id="outage") for _ in range(4)]
    if policy == "open":
        assert during == [("fail-open", 0)] * 4  # allowed, nothing counted: a loop runs free
    elif policy == "closed":
        assert during == [("unavailable", 0)] * 4  # the tool never runs
    else:
        # this process still brakes: the 3rd identical call in a row is denied
        assert during == [("fallback", 1), ("fallback", 2), ("denied", 3), ("denied", 4)]

    server.start()
    verdict = await until_redis(brake, "after")  # the same brake object, no restart
    assert verdict.decided_by == "redis"
    # Redis decides again: nothing survives a restart without persistence (see the AOF tests)
    assert await outcome(brake, "search", {"q": 1}, session_id="s") == ("redis", 1)
    assert await outcome(brake, "search", {"q": 1}, session_id="s") == ("redis", 2)
    assert await outcome(brake, "search", {"q": 1}, session_id="s") == ("denied", 3)


@pytest.mark.parametrize("graceful", [True, False], ids=["sigterm", "sigkill-after-fsync"])
@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_streak_survives_restart_with_aof(flavour: str, graceful: bool, make: BrakeFactory) -> None:
    """With AOF and `appendfsync always`, an acknowledged count is on disk: it survives even SIGKILL."""
    with RedisServer(appendonly=True, extra_config=["appendfsync always"], name="aof") as aof:
        assert aof.command("CONFIG", "GET", "appendfsync") == ["appendfsync", "always"]
        brake = make(flavour, aof.url, max_repeats=3, on_backend_error="closed")
        assert await outcome(brake, "search", {"q": 1}, session_id="s") == ("redis", 1)
        assert await outcome(brake, "search", {"q": 1}, session_id="s") == ("redis", 2)
        aof.restart(graceful=graceful)
        # policy "closed": a hidden failure would raise; the stale connection is replaced by the retry
        assert await outcome(brake, "search", {"q": 1}, session_id="s") == ("denied", 3)
        assert raw_count(aof, brake, "s") == 3


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_streak_is_lost_on_restart_without_persistence(
    flavour: str, server: RedisServer, make: BrakeFactory
) -> None:
    """No AOF, no RDB: a restart forgets every streak (the loop gets max_repeats - 1 more runs)."""
    brake = make(flavour, server.url, max_repeats=3, on_backend_error="closed")
    assert await outcome(brake, "search", {"q": 1}, session_id="s") == ("redis", 1)
    assert await outcome(brake, "search", {"q": 1}, session_id="s") == ("redis", 2)
    server.restart()
    assert raw_count(server, brake, "s") is None
    assert await outcome(brake, "search", {"q": 1}, session_id="s") == ("redis", 1)


# -- 3. black hole, refused connections, backoff -------------------------------------------


@pytest.mark.parametrize("connected", [False, True], ids=["cold", "warm"])
@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_black_hole_first_check_is_bounded(
    flavour: str, connected: bool, proxy: FaultProxy, make: BrakeFactory
) -> None:
    """Redis accepts and never answers: the first check gives up after timeout_seconds."""
    brake = make(flavour, proxy.url, timeout_seconds=0.3, on_backend_error="local")
    if connected:  # a pooled connection exists (a paused or wedged server)
        assert (await brake.check("warm", {}, session_id="s")).decided_by == "redis"
    proxy.black_hole()
    with measured() as took:  # less the time the thread stood ready to run on a loaded machine
        verdict = await brake.check("search", {"q": 1}, session_id="s")
    print(f"black hole, {flavour}, {'warm' if connected else 'cold'}: first check {took.seconds * 1000:.0f} ms")
    assert verdict.decided_by == "fallback"
    assert took.seconds < 1.0


@pytest.mark.parametrize("policy", ["local", "open"])
@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_black_hole_later_checks_do_not_wait(
    flavour: str, policy: str, proxy: FaultProxy, make: BrakeFactory
) -> None:
    """While Redis is known down, checks go straight to the policy: no timeout paid, no connection."""
    brake = make(flavour, proxy.url, timeout_seconds=0.3, on_backend_error=policy, retry_after_seconds=30)
    proxy.black_hole()
    assert (await brake.check("search", {"q": 0}, session_id="s")).decided_by == DECIDED_BY_POLICY[policy]
    connections = proxy.connections
    times = []
    for i in range(200):
        with measured() as took:
            verdict = await brake.check("search", {"q": i}, session_id="s")
        times.append(took.seconds)
        assert verdict.decided_by == DECIDED_BY_POLICY[policy]
    median = statistics.median(times)
    print(f"black hole, {flavour}, {policy}: median check while down {median * 1e6:.1f} us")
    assert median < 0.0005
    assert proxy.connections == connections  # Redis was not even dialled


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_black_hole_is_reprobed_on_a_backoff(
    flavour: str, proxy: FaultProxy, make: BrakeFactory
) -> None:
    """Redis is asked again after 0.05 s, 0.1 s, 0.2 s... (doubling): a few probes, not one per check."""
    first_pause, window = 0.05, 2.5
    brake = make(
        flavour, proxy.url, timeout_seconds=0.2, on_backend_error="local", retry_after_seconds=first_pause
    )
    proxy.black_hole()
    before = proxy.connections
    checks = probes = 0
    end = time.monotonic() + window
    while time.monotonic() < end:
        with measured() as took:
            verdict = await brake.check("search", {"q": checks}, session_id="s")
        probes += took.seconds > 0.1  # only a check that asked Redis waits the timeout
        checks += 1
        assert verdict.decided_by == "fallback"
        await asyncio.sleep(0.002)
    dialled = proxy.connections - before
    # pauses 0.05+0.1+0.2+0.4+0.8+1.6 > 2.5 s: at most 6 probes after the first failure, even with no delay
    most = 1 + 6
    print(f"black hole, {flavour}: {checks} checks, {probes} asked Redis, {dialled} connections")
    assert 2 <= probes <= most
    assert 1 < dialled <= 3 * most  # a probe dials at most (1 + retries) times, plus a reconnect
    assert dialled * 20 < checks

    proxy.pass_through()
    assert (await until_redis(brake, "s")).decided_by == "redis"


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_refused_connection_fails_fast_and_recovers(
    flavour: str, proxy: FaultProxy, make: BrakeFactory
) -> None:
    """A connection closed at once is an immediate failure (no timeout); Redis is used again after."""
    brake = make(flavour, proxy.url, timeout_seconds=5.0, on_backend_error="closed", retry_after_seconds=0.05)
    assert (await brake.check("search", {"q": 0}, session_id="s")).decided_by == "redis"
    proxy.refuse()
    start = time.perf_counter()
    with pytest.raises(BrakeUnavailableError):
        await brake.check("search", {"q": 1}, session_id="s")
    assert time.perf_counter() - start < 2.5  # well under timeout_seconds: nothing was waited for
    proxy.pass_through()
    assert (await until_redis(brake, "s")).decided_by == "redis"


async def test_cancelled_probe_does_not_keep_redis_shut_out(proxy: FaultProxy, make: BrakeFactory) -> None:
    """The host cancels the one check that was probing Redis; a later check must probe again."""
    brake = make("async", proxy.url, timeout_seconds=2.0, on_backend_error="local", retry_after_seconds=0.05)
    proxy.refuse()
    assert (await brake.check("search", {"q": 0}, session_id="s")).decided_by == "fallback"
    proxy.black_hole()
    probe_sent = proxy.connections
    await asyncio.sleep(0.1)  # the probe is due
    probe = asyncio.ensure_future(brake.check("search", {"q": 1}, session_id="s"))
    await eventually(lambda: proxy.connections > probe_sent, "the probe to dial Redis")
    await asyncio.sleep(0.05)
    probe.cancel()  # e.g. the host's own timeout around the tool call
    with pytest.raises(asyncio.CancelledError):
        await probe
    proxy.pass_through()
    proxy.close_connections()
    assert (await until_redis(brake, "s", deadline=5.0)).decided_by == "redis"


async def test_timed_out_async_check_leaves_no_unretrieved_exception(
    proxy: FaultProxy, make: BrakeFactory
) -> None:
    """A check that gave up must not leave asyncio an exception nobody retrieves (an ERROR log each time).

    On a pooled connection to a black hole, redis-py gives up later than the
    check (read timeout, then a reconnect whose handshake times out too): the
    check has returned when the pipeline's error arrives.
    """
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    try:
        brake = make("async", proxy.url, timeout_seconds=0.3, on_backend_error="local", retry_after_seconds=30)
        assert (await brake.check("warm", {}, session_id="s")).decided_by == "redis"
        proxy.black_hole()
        assert (await brake.check("search", {"q": 1}, session_id="s")).decided_by == "fallback"
        await eventually(lambda: len(asyncio.all_tasks()) == 1, "the brake's pipeline to give up")
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    assert [c.get("message") for c in unhandled] == []


# -- 4. cluster failover -------------------------------------------------------------------


@pytest.fixture(scope="module")
def failover_cluster() -> Iterator[RedisCluster]:
    """3 masters with a replica each, for this module only (the tests kill masters)."""
    with RedisCluster(masters=3, replicas_per_master=1) as cluster:
        yield cluster


def _owner_by_slot(cluster: RedisCluster) -> dict[int, int]:
    """Slot -> port of the master serving it, from one CLUSTER NODES view."""
    owners: dict[int, int] = {}
    view: list[ClusterNodeInfo] = cluster.view()
    for info in view:
        if not info.is_master or "fail" in info.flags:
            continue
        for spec in info.slots:
            if spec.startswith("["):
                continue
            lo, _, hi = spec.partition("-")
            for slot in range(int(lo), int(hi or lo) + 1):
                owners[slot] = info.port
    return owners


@pytest.mark.slow
@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_cluster_failover_keeps_streaks(
    flavour: str, failover_cluster: RedisCluster, make: BrakeFactory
) -> None:
    cluster = failover_cluster
    cluster.wait_healthy()
    for node in cluster.masters:
        node.command("FLUSHALL")
    brake = make(
        flavour, cluster.url, max_repeats=100, on_backend_error="local",
        retry_after_seconds=0.05, timeout_seconds=0.5,
    )
    owners = _owner_by_slot(cluster)
    sessions = [f"fo-{i}" for i in range(90)]
    port_of = {s: owners[key_slot(brake.brake.key(s).encode())] for s in sessions}
    masters = cluster.masters
    assert set(port_of.values()) == {m.port for m in masters}  # every master holds streaks
    assert len(owners) == 16384

    # The client's first use builds it (slot map, a connection per master): on a loaded machine that can take
    # more than the 0.5 s a check may wait, and the check goes to the fallback. Built first, apart.
    await until_redis(brake, "fo-built")
    for session in sessions:
        for n in (1, 2):
            assert await outcome(brake, "search", {"q": session}, session_id=session) == ("redis", n)
    for master in masters:
        wait_replicated(master, cluster.replicas_of(master))

    victim = masters[0 if flavour == "sync" else 1]
    probe_session = next(s for s in (f"probe-{i}" for i in range(10_000))
                         if owners[key_slot(brake.brake.key(s).encode())] == victim.port)
    promoted: list[RedisServer] = []
    failover = threading.Thread(target=lambda: promoted.append(cluster.kill_master_and_wait_failover(victim)))
    failover.start()
    seen: list[str] = []
    attempt = 0
    while failover.is_alive():  # checks go on during the failover: never an error
        attempt += 1
        verdict = await brake.check("probe", {"attempt": attempt}, session_id=probe_session)
        seen.append(verdict.decided_by)
        await asyncio.sleep(0.02)
    await asyncio.to_thread(failover.join)
    assert promoted, "the failover did not complete"
    assert set(seen) <= {"redis", "fallback"}
    assert "fallback" in seen  # the gap was bridged in-process

    assert (await until_redis(brake, probe_session)).decided_by == "redis"
    # every streak written before the failover continues where it was
    for session in sessions:
        assert await outcome(brake, "search", {"q": session}, session_id=session) == ("redis", 3)

    # give the cluster its lost replica back for the next test
    victim.start()
    cluster.wait_healthy(60)


# -- 5. script cache loss --------------------------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_script_cache_loss_is_invisible(flavour: str, server: RedisServer, make: BrakeFactory) -> None:
    """SCRIPT FLUSH, FLUSHALL and restarts between checks: no error reaches the caller (policy closed)."""
    brake = make(flavour, server.url, max_repeats=100, on_backend_error="closed")

    async def same() -> tuple[str, int]:
        return await outcome(brake, "search", {"q": "same"}, session_id="s")

    assert await same() == ("redis", 1)
    server.command("SCRIPT", "FLUSH")
    assert await same() == ("redis", 2)  # the script is loaded again; the streak is intact
    server.command("SCRIPT", "FLUSH")
    server.command("FLUSHALL")
    assert await same() == ("redis", 1)  # FLUSHALL took the streak with it
    server.restart()
    assert await same() == ("redis", 1)
    assert await same() == ("redis", 2)
    server.restart(graceful=False)
    assert await same() == ("redis", 1)

    # a burst after a flush: every check of the batch gets NOSCRIPT, and every one is sent again
    server.command("SCRIPT", "FLUSH")
    sessions = [f"burst-{i}" for i in range(30)]
    calls: list[Awaitable[tuple[str, int]]] = [
        outcome(brake, "search", {"q": 1}, session_id=s) for s in sessions
    ]
    results = await asyncio.gather(*calls) if flavour == "async" else [await c for c in calls]
    assert results == [("redis", 1)] * len(sessions)


# -- 6. soak ---------------------------------------------------------------------------------

SOAK_WORKERS = 2
SOAK_ROUNDS = 100
SOAK_OWNED = 450  # sessions per worker, no other worker touches them
SOAK_SHARED = 100  # sessions every worker hits with the same call
SOAK_SHARED_PER_ROUND = SOAK_SHARED // 2
SOAK_LIMIT = 3
# Long enough that no session expires between two of its checks (a round apart) even when another process hogs
# the cores: at 2 s a stalled worker's session expired mid-soak, and its count started again at 1.
SOAK_TTL = 10.0
SHARED_TOOL = "shared"

PlanStep = tuple[str, str, int, str | None]  # session, tool, argument, call id


def soak_plan(worker: int) -> list[PlanStep]:
    """The deterministic checks of one worker: rounds over its own sessions plus half the shared ones.

    Every round visits each session once (so no session idles anywhere near
    the TTL); owned sessions repeat, change or replay (same call id) their
    last call at random; shared sessions always get the same call.
    """
    rng = random.Random(f"distbrake-soak-{worker}")
    tools = ("search", "read_file", "fetch")
    last: dict[str, PlanStep] = {}
    before_last: dict[str, PlanStep] = {}
    plan: list[PlanStep] = []
    for round_no in range(SOAK_ROUNDS):
        owned = [f"w{worker}-{i}" for i in range(SOAK_OWNED)]
        rng.shuffle(owned)
        half = round_no % 2
        shared = [f"shared-{i}" for i in range(half * SOAK_SHARED_PER_ROUND, (half + 1) * SOAK_SHARED_PER_ROUND)]
        rng.shuffle(shared)
        every = SOAK_OWNED // SOAK_SHARED_PER_ROUND
        for index, session in enumerate(owned):
            previous = last.get(session)
            roll = rng.random()
            call_id = f"w{worker}-{round_no}-{index}" if rng.random() < 0.5 else None
            earlier = before_last.get(session)
            if previous is not None and roll < 0.1 and previous[3] is not None:
                step = previous  # the same call again: a replay of the last one
            elif (
                previous is not None and earlier is not None and roll < 0.15
                and earlier[3] is not None and earlier[1:3] == previous[1:3]
            ):
                step = earlier  # a replay of the one before (a retry overtaken by the next call)
            elif previous is not None and roll < 0.75:
                step = (session, previous[1], previous[2], call_id)  # repeats: the streak grows
            else:
                step = (session, rng.choice(tools), rng.randrange(3), call_id)
            if step != previous and previous is not None:
                before_last[session] = previous
            last[session] = step
            plan.append(step)
            if index % every == every - 1:
                shared_session = shared[index // every]
                shared_id = f"w{worker}-{round_no}-{shared_session}" if round_no % 4 < 2 else None
                plan.append((shared_session, SHARED_TOOL, 0, shared_id))
    return plan


def soak_expected(plan: list[PlanStep]) -> list[int | None]:
    """The count of every owned step (None for shared ones), by the streak rule of lua/brake.lua."""
    state: dict[str, tuple[str, int, str | None, str | None]] = {}  # call, count, last id, previous id
    expected: list[int | None] = []
    for session, tool, arg, call_id in plan:
        if tool == SHARED_TOOL:
            expected.append(None)
            continue
        call = f"{tool}:{arg}"
        slot = state.get(session)
        if slot is None or slot[0] != call:
            state[session] = (call, 1, call_id, None)
            expected.append(1)
            continue
        _, count, last_id, previous_id = slot
        if call_id is not None and call_id == last_id:
            expected.append(count)  # replay: counted once
            continue
        if call_id is not None and count > 1 and call_id == previous_id:
            expected.append(count - 1)
            continue
        state[session] = (call, count + 1, call_id, last_id)
        expected.append(count + 1)
    return expected


def _soak_worker(worker: int, url: str, barrier: Any, results: Any) -> None:
    """One process of the soak: run its plan, report (worker, signed counts, errors)."""
    plan = soak_plan(worker)
    counts: list[int] = []
    errors: list[str] = []
    brake = DistributedBrake.from_url(
        url, max_repeats=SOAK_LIMIT, ttl_seconds=SOAK_TTL, on_backend_error="closed",
        timeout_seconds=2.0, tool_max_repeats={SHARED_TOOL: 10**6},
    )
    try:
        brake.ping()
        barrier.wait(timeout=60)
        for session, tool, arg, call_id in plan:
            try:
                verdict = brake.check(tool, {"arg": arg}, session_id=session, call_id=call_id)
            except LoopBrakeError as error:
                counts.append(-error.count)
            except Exception as error:
                counts.append(0)
                if len(errors) < 20:
                    errors.append(repr(error))
            else:
                counts.append(verdict.count)
                if verdict.decided_by != "redis" and len(errors) < 20:
                    errors.append(f"decided by {verdict.decided_by}")
    finally:
        brake.close()
    results.put((worker, counts, errors))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_soak_two_processes_exact_counts_and_ttl() -> None:
    """2 processes x 50k checks over 1k sessions, TTL 10 s: no error, every count exact, all keys expire."""
    with RedisServer(name="soak") as soak_server:
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(SOAK_WORKERS)
        results = context.Queue()
        workers = [
            context.Process(target=_soak_worker, args=(w, soak_server.url, barrier, results), daemon=True)
            for w in range(SOAK_WORKERS)
        ]
        started = time.monotonic()
        for process in workers:
            process.start()
        try:
            reports = {}
            for _ in workers:
                worker, counts, errors = results.get(timeout=180)
                reports[worker] = (counts, errors)
        finally:
            for process in workers:
                process.join(timeout=30)
                if process.is_alive():
                    process.kill()
                    process.join()
            results.close()
            results.join_thread()
        took = time.monotonic() - started
        assert [p.exitcode for p in workers] == [0] * SOAK_WORKERS

        shared_counts: dict[str, list[int]] = defaultdict(list)
        total = 0
        for worker, (counts, errors) in sorted(reports.items()):
            assert errors == []
            plan = soak_plan(worker)
            assert len(counts) == len(plan) == SOAK_ROUNDS * (SOAK_OWNED + SOAK_SHARED_PER_ROUND)
            total += len(counts)
            expected = soak_expected(plan)
            for (session, _, _, _), want, got in zip(plan, expected, counts, strict=True):
                if want is None:
                    assert got > 0  # the shared tool is never denied
                    shared_counts[session].append(got)
                else:
                    assert got == (want if want < SOAK_LIMIT else -want), session
        assert total == SOAK_WORKERS * 50_000
        # every worker checked each shared session as often; across the fleet the counts are 1..N
        per_session = SOAK_WORKERS * SOAK_ROUNDS // 2
        assert len(shared_counts) == SOAK_SHARED
        for session, seen in shared_counts.items():
            assert sorted(seen) == list(range(1, per_session + 1)), session
        print(f"soak: {total} checks in {took:.1f} s")

        # What stays is the fleet view: one counter hash per minute of the run, each with its own TTL.
        def records_left() -> int:
            return int(soak_server.command("DBSIZE")) - len(soak_server.command("KEYS", "distbrake:fleet:*"))

        wait_until(
            lambda: records_left() == 0,
            timeout=SOAK_TTL + 20,
            message=lambda: f"{records_left()} keys left after the TTL",
        )
        fleet = soak_server.command("KEYS", "distbrake:fleet:*")
        assert 1 <= len(fleet) <= took / 60 + 2
        assert all(0 < int(soak_server.command("PTTL", key)) <= 3600_000 for key in fleet)
