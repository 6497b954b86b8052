"""Bursts on one session (asyncio), against a real redis-server behind a proxy that adds network latency.

Identical concurrent checks of one session go as one run (one script call),
so a burst costs one round trip, counts exactly, and a lost reply for it is
still counted once; time spent queued behind the brake's own batches is never
taken for a Redis failure. Each test prints its figures.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import itertools
import time
from pathlib import Path
from typing import Any

import pytest

import distbrake
from distbrake import AsyncDistributedBrake, LoopBrake, LoopBrakeError, Verdict
from distbrake.redis.wire import session_key
from tests.backends import ALL_BRAKES, Brakes, Checker, face, inspect_count, where
from tests.fault_proxy import FaultProxy
from tests.servers import RedisCluster, RedisServer
from tests.waits import Stopwatch, measured

RTT = 0.005
PACKAGE = str(Path(distbrake.__file__).parent)
TIMEOUT = 0.5
# For the tests about order and counts, not time: thousands of checks at once on a machine whose cores another
# process hogs must not reach the failure policy (5 s did, on a cluster).
ORDER_TIMEOUT = 60.0


async def counts_of(brake: AsyncDistributedBrake, calls: list[dict[str, int]], session: str = "default") -> list[int]:
    """The count each concurrent check got (negative when denied), in the order they were made."""
    async def one(args: dict[str, int]) -> int:
        try:
            verdict: Verdict = await brake.check("search", args, session_id=session)
        except LoopBrakeError as error:
            return -error.count
        assert verdict.decided_by == "redis", verdict.decided_by
        return verdict.count

    return list(await asyncio.gather(*(one(args) for args in calls)))


@pytest.mark.parametrize("n", [100, 200])
async def test_a_burst_of_one_session_is_decided_by_redis_in_one_round_trip(n: int, proxy: FaultProxy) -> None:
    proxy.latency(RTT)
    brake = AsyncDistributedBrake.from_url(proxy.url, max_repeats=10_000, timeout_seconds=TIMEOUT)
    try:
        await brake.check("warm", {}, session_id="w")
        commands = proxy.commands
        with measured() as took:  # less the time the loop's thread stood ready to run on a loaded machine
            counts = await counts_of(brake, [{"q": 1}] * n)
        sent = proxy.commands - commands
    finally:
        await brake.aclose()
    print(f"\n{n} concurrent identical checks of one session, {RTT * 1000:.0f} ms round trips: "
          f"{took.seconds * 1000:.1f} ms (wall {took.wall * 1000:.1f} ms), {sent} script call(s), "
          f"counts {min(counts)}..{max(counts)}")
    assert counts == list(range(1, n + 1))
    assert took.seconds < TIMEOUT / 2
    assert not brake.failures.breaker.down


async def test_a_lost_reply_for_a_burst_is_counted_once(proxy: FaultProxy, server: RedisServer) -> None:
    brake = AsyncDistributedBrake.from_url(proxy.url, max_repeats=3, timeout_seconds=TIMEOUT)
    try:
        await brake.check("warm", {}, session_id="w")
        proxy.drop_replies(1)
        counts = await counts_of(brake, [{"q": 1}] * 50, session="s")
        stored = await brake.inspect("s")
    finally:
        await brake.aclose()
    print(f"\n50 identical checks, the reply of their script call lost: {proxy.dropped} reply dropped, "
          f"stored count {stored.count if stored else None}")
    assert proxy.dropped == 1
    assert counts == [1, 2] + [-n for n in range(3, 51)]
    assert stored is not None and stored.count == 50


async def test_a_burst_keeps_the_order_of_a_sessions_calls(redis_url: str) -> None:
    """A, A, B, B, A, C, C at once counts exactly as made one by one (a session's calls are never reordered)."""
    sequence = [{"q": q} for q in "AABBACCA"]
    reference = LoopBrake(max_repeats=100)
    expected = [reference.check("search", args).count for args in sequence]
    brake = AsyncDistributedBrake.from_url(redis_url, max_repeats=100)
    try:
        counts = await counts_of(brake, sequence, session="ordered")
    finally:
        await brake.aclose()
    assert counts == expected == [1, 2, 1, 2, 1, 1, 2, 1]


async def test_time_queued_behind_the_brakes_own_batches_is_not_a_redis_failure(proxy: FaultProxy) -> None:
    """200 different calls of one session go one round trip each: those that run out of time while queued are
    decided by the policy, and Redis is never marked down."""
    # 200 round trips of 20 ms in a row take 4 s: past the 1 s timeout most calls are still queued, while the
    # first ones are answered with room to spare even when another process hogs the cores (at 0.2 s and 5 ms
    # round trips, a loaded machine's first answer came too late and no call was decided by Redis).
    rtt = 0.02
    proxy.latency(rtt)
    brake = AsyncDistributedBrake.from_url(proxy.url, timeout_seconds=1.0, on_backend_error="local")
    try:
        await brake.check("warm", {}, session_id="w")
        verdicts = await asyncio.gather(*(brake.check("search", {"i": i}, session_id="s") for i in range(200)))
        decided = [v.decided_by for v in verdicts]
        after = await brake.check("search", {"i": "after"}, session_id="other")
    finally:
        await brake.aclose()
    print(f"\n200 different calls of one session at once, {rtt * 1000:.0f} ms round trips: "
          f"{decided.count('redis')} decided by Redis, {decided.count('fallback')} by the policy (queued "
          "too long); Redis marked down: no")
    assert decided.count("redis") > 0 and decided.count("fallback") > 0
    assert set(decided) <= {"redis", "fallback"}
    assert not brake.failures.breaker.down
    assert after.decided_by == "redis"


async def test_a_long_burst_shares_two_lanes_and_keeps_each_sessions_order(proxy: FaultProxy) -> None:
    """1,500 sessions each calling A, B, B, A at once: the queue is shared by two lanes (two connections, a
    batch on the wire on each), a session never has two runs on the wire, so each counts as made one by one."""
    sequence = [{"q": q} for q in "ABBA"]
    reference = LoopBrake(max_repeats=100)
    expected = [reference.check("search", args).count for args in sequence]
    brake = AsyncDistributedBrake.from_url(proxy.url, max_repeats=100, timeout_seconds=ORDER_TIMEOUT)
    try:
        await brake.check("warm", {}, session_id="w")
        connections = proxy.connections
        results = await asyncio.gather(*(counts_of(brake, sequence, session=f"s{i}") for i in range(1500)))
        opened = proxy.connections - connections
    finally:
        await brake.aclose()
    print(f"\n1,500 sessions x A, B, B, A at once: {opened} more connection(s), counts {expected} in every session")
    assert expected == [1, 1, 2, 1]
    assert all(counts == expected for counts in results)
    assert opened == 1  # the second lane's (the first one's was opened by the warm-up check)


async def test_checks_go_on_after_a_host_cancels_every_other_task(proxy: FaultProxy) -> None:
    """A host that cancels every task (its own checks and the brake's senders with them) and then goes on:
    the checks queued then are dropped with their tasks, and later checks are sent and decided by Redis."""
    proxy.latency(0.05)
    brake = AsyncDistributedBrake.from_url(proxy.url, timeout_seconds=5.0)
    try:
        await brake.check("warm", {}, session_id="w")
        tasks = [asyncio.create_task(brake.check("search", {"i": i}, session_id=f"s{i}")) for i in range(40)]
        await asyncio.sleep(0.01)  # one check on the wire, the others queued behind it
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        proxy.latency(0)
        later = await asyncio.wait_for(  # before the fix: never sent (no sender started again)
            asyncio.gather(*(brake.check("search", {}, session_id=f"n{i}") for i in range(3))), timeout=4.0)
    finally:
        await brake.aclose()
    assert [verdict.decided_by for verdict in later] == ["redis"] * 3


async def test_a_long_burst_on_a_cluster_keeps_each_sessions_order(cluster_url: str) -> None:
    """The same on a 3-master Cluster: two lanes, each batch split per master, written to every master
    before any reply is read; every session counts as made one by one."""
    sequence = [{"q": q} for q in "ABBA"]
    brake = AsyncDistributedBrake.from_url(cluster_url, max_repeats=100, timeout_seconds=ORDER_TIMEOUT)
    try:
        results = await asyncio.gather(*(counts_of(brake, sequence, session=f"s{i}") for i in range(1500)))
        again = await counts_of(brake, [{"q": "A"}], session="s7")
    finally:
        await brake.aclose()
    assert all(counts == [1, 1, 2, 1] for counts in results)
    assert again == [2]


async def test_a_queued_check_keeps_one_coroutine_and_few_objects_alive(redis_url: str) -> None:
    """Each object a check in flight keeps alive is one more for Python's garbage collector to walk,
    again and again while thousands of checks wait at once (at 4096 tasks it was a quarter of the
    time). A queued check holds one coroutine of the brake's (its `check`), its future and what that
    needs; the host's task and coroutine come on top. Fails with a wrapper coroutine per check."""
    brake = AsyncDistributedBrake.from_url(redis_url, key_prefix="objects")  # the fleet view on: a watch
    tasks = 1000
    try:
        await brake.check("warm", {}, session_id="w")
        await brake.clear_all()

        async def host_task(index: int) -> None:
            await brake.check("search", {"q": index}, session_id=f"s{index}")

        gc.collect()
        before = len(gc.get_objects())
        running = [asyncio.ensure_future(host_task(i)) for i in range(tasks)]
        await asyncio.sleep(0)  # every task has made its check and waits on it; nothing is sent yet
        alive = gc.get_objects()
        ours = [o for o in alive if inspect.iscoroutine(o) and o.cr_code.co_filename.startswith(PACKAGE)]
        per_check = (len(alive) - before) / tasks
        del alive
        await asyncio.gather(*running)
        await brake.clear_all()
    finally:
        await brake.aclose()
    print(f"\na queued check: {len(ours) / tasks:.2f} coroutines of distbrake, "
          f"{per_check:.2f} GC-tracked objects with the host's task")
    assert tasks <= len(ours) <= tasks + 16  # one per check, and the brake's few own tasks (its senders)
    # the host's task, its coroutine, their contexts, its weak reference and wake-up (6), and ours:
    # the check's coroutine, future and its iterator, the prepared call, the queue's entry (5)
    assert per_check <= 12, per_check


# -- call ids inside a run (issue 23, item 1) ----------------------------------------------------------------------

DISTRIBUTED = where(ALL_BRAKES, lambda kind: face(kind) != "loop")


async def _answers(
    checker: Checker, calls: list[str | None], session: str, *, together: bool,
) -> list[tuple[int, bool]]:
    """(count, replayed) of each check of `calls` (call ids, None: no call id), made at once or one by one."""
    async def one(call_id: str | None) -> tuple[int, bool]:
        verdict = await checker.check("search", {"q": 1}, session_id=session, call_id=call_id)
        assert verdict.decided_by in ("redis", "in-process"), verdict.decided_by
        return verdict.count, verdict.replayed

    if together:
        return list(await asyncio.gather(*(one(call_id) for call_id in calls)))
    return [await one(call_id) for call_id in calls]


@pytest.mark.parametrize("kind", DISTRIBUTED)
@pytest.mark.parametrize(("first", "burst"), [
    ([], ["X", "X", "X", "X"]),  # one call, seen four times at once: counted once
    (["X"], ["X", "X", "X"]),  # the first alone, its three retries at once
    (["X"], ["Y", "X"]),  # a new call racing a retry of the last one
    (["W", "X"], [None, "X", "W", "Z", "Z"]),  # retries of the last two among new calls
])
async def test_checks_of_one_run_with_repeated_call_ids_count_as_one_by_one(
    kind: str, first: list[str], burst: list[str | None], brakes: Brakes,
) -> None:
    """Concurrent identical checks go as one run; a call id seen again in it (or the last ones of the record)
    is a replay, exactly as the checks made one by one (and LoopBrake) count them: never a raw error."""
    reference = Checker(LoopBrake(max_repeats=10))
    expected = await _answers(reference, first + burst, "s", together=False)
    checker = Checker(brakes(kind, max_repeats=10))
    got = await _answers(checker, first, "s", together=False)
    # three checks at once first (the first goes alone, two queue together): then the whole burst queues
    await asyncio.gather(*(checker.check("warm", {}, session_id=f"w{i}") for i in range(3)))
    got += await _answers(checker, burst, "s", together=True)
    assert got == expected
    assert await inspect_count(checker.brake, "s") == max(abs(count) for count, _ in expected)


# -- the brake's own delays (issue 23, items 2, 3, 12) ------------------------------------------------------------

ASYNC_STORES = where(ALL_BRAKES, lambda kind: face(kind) == "async")


_warm = itertools.count()


def hold_the_loop(seconds: float) -> None:
    """The event loop busy with other work (a host's CPU-bound step) for `seconds`: the fault injected."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


async def queue_together(brake: Any) -> None:
    """Three checks at once (the first goes alone, two queue together): the next checks queue, none goes alone."""
    await asyncio.gather(*(brake.check("warm", {"n": next(_warm)}, session_id=f"warm{i}") for i in range(3)))


@pytest.mark.parametrize("kind", ASYNC_STORES)
async def test_a_check_late_in_the_brakes_own_queue_leaves_no_fallback_state(kind: str, brakes: Brakes) -> None:
    """A, B, A, B... with each A queued while the loop is busy past the timeout: the A's are decided by the
    policy as fresh calls (never counted toward a later fallback streak) and still counted by Redis (the tool ran);
    Redis is not marked down, health stays ok."""
    brake = brakes(kind, timeout_seconds=0.2, on_backend_error="local")
    verdicts = []
    for _ in range(4):
        await queue_together(brake)
        late = asyncio.ensure_future(brake.check("search", {"q": "A"}, session_id="s"))
        await asyncio.sleep(0)  # the check starts and queues
        hold_the_loop(0.3)
        verdicts.append(await late)
        verdicts.append(await brake.check("search", {"q": "B"}, session_id="s"))
    a_verdicts = verdicts[::2]
    assert [(v.decided_by, v.count) for v in a_verdicts] == [("fallback", 1)] * 4
    # Redis counted the late A's all the same (the tool ran): B is 1 each time, never "3 in a row"
    assert [(v.decided_by, v.count) for v in verdicts[1::2]] == [("redis", 1)] * 4
    assert not brake.failures.breaker.down and brake.health().ok
    assert brake.failures.local.inspect("s") is None  # nothing left in the fallback


@pytest.mark.parametrize("kind", ASYNC_STORES)
async def test_a_check_cancelled_before_it_was_sent_is_not_counted(kind: str, brakes: Brakes) -> None:
    """The host cancels a check while it waits in the brake's queue: never written, never counted (the tool never
    ran); the session's next identical call counts 1."""
    brake = brakes(kind, max_repeats=2)
    await queue_together(brake)
    cancelled = asyncio.ensure_future(brake.check("search", {"q": 1}, session_id="s"))
    await asyncio.sleep(0)  # the check starts and queues; the batch is not sent yet
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await queue_together(brake)  # the sender has run
    assert await brake.inspect("s") is None
    assert (await brake.check("search", {"q": 1}, session_id="s")).count == 1


def senders() -> list[asyncio.Task[Any]]:
    """The brake's sender tasks running now (what a host's watchdog or shutdown hook may cancel as strays)."""
    return [task for task in asyncio.all_tasks() if task.get_coro().__qualname__.startswith("Batcher.")]  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", ASYNC_STORES)
@pytest.mark.parametrize("when", ["before it starts", "with a batch on the wire"])
async def test_queued_checks_are_decided_when_a_host_cancels_the_brakes_senders(
    kind: str, when: str, brakes: Brakes,
) -> None:
    """A host cancels the brake's sender tasks, not the checks: no queued check waits past its timeout (they are
    sent by a new sender, or decided by the policy), none raises CancelledError, and Redis is not marked down."""
    timeout = 0.5
    brake = brakes(kind, timeout_seconds=timeout, max_repeats=10**6)
    await queue_together(brake)
    tasks = [asyncio.ensure_future(brake.check("search", {"i": i}, session_id=f"s{i % 50}")) for i in range(3000)]
    await asyncio.sleep(0)  # every check starts and queues; the sender is not started yet
    if when == "with a batch on the wire":
        while not brake._batcher._on_wire:
            await asyncio.sleep(0)
    assert senders()
    for task in senders():
        task.cancel()
    # At most 4 timeouts, not counting the time the loop's thread stood ready to run while other processes had
    # the cores (tests/waits.py): on a loaded machine 2 s of wall time did not even run 3,000 checks to their end.
    watch, pending = Stopwatch(), set(tasks)
    while pending and watch.seconds < timeout * 4:
        _, pending = await asyncio.wait(pending, timeout=0.05)
    for task in pending:
        task.cancel()
    assert not pending, f"{len(pending)} checks still waiting after {watch.seconds:.2f} s (wall {watch.wall:.2f} s)"
    done = set(tasks)
    assert all(not task.cancelled() and task.exception() is None for task in done)
    assert {task.result().decided_by for task in done} <= {"redis", "fallback"}
    assert not brake.failures.breaker.down
    assert (await brake.check("after", {}, session_id="after")).decided_by == "redis"


@pytest.mark.parametrize("kind", ASYNC_STORES)
@pytest.mark.parametrize("how", ["alone", "in a batch"])
async def test_a_reply_unread_while_the_loop_is_busy_is_not_an_outage(
    kind: str, how: str, brakes: Brakes, caplog: pytest.LogCaptureFixture,
) -> None:
    """A check on the wire while the host keeps the event loop busy past its timeout: Redis answered in time, the
    loop ran the deadline late; the policy decides that check, Redis is not marked down (issue 23, item 3)."""
    brake = brakes(kind, timeout_seconds=0.2, on_backend_error="local")
    await brake.check("warm", {}, session_id="w")  # connected
    if how == "in a batch":
        await queue_together(brake)
    checks = [asyncio.ensure_future(brake.check("search", {"i": i}, session_id=f"s{i}")) for i in range(3)]
    while not brake._batcher._on_wire and brake._batcher._inline is None:
        await asyncio.sleep(0)
    await asyncio.sleep(0)  # written
    hold_the_loop(0.3)
    verdicts = await asyncio.gather(*checks)
    assert {verdict.decided_by for verdict in verdicts} <= {"redis", "fallback"}
    assert not brake.failures.breaker.down and brake.health().ok
    assert not [record for record in caplog.records if record.levelname == "ERROR"]
    assert (await brake.check("after", {}, session_id="after")).decided_by == "redis"


async def test_a_cluster_batch_answers_each_masters_checks_without_waiting_for_the_slowest(
    redis_cluster: RedisCluster, cluster_url: str, brakes: Brakes,
) -> None:
    """One batch over the three masters of a Cluster, one master's scripts held (CLIENT PAUSE WRITE): the checks
    the other two answered are answered then, not when the held master is; its check is answered once it goes
    on, counted once. (A batch used to answer every check when its slowest master replied.)"""
    brake = brakes("async-cluster", cluster_url, timeout_seconds=30)
    await queue_together(brake)  # connected, the script loaded, and the next checks queue as one batch
    sessions: dict[int, str] = {}  # by master's port: a session whose record is on it
    for n in itertools.count():
        master = redis_cluster.node_for_key(session_key(f"s{n}"))
        sessions.setdefault(master.port, f"s{n}")
        if len(sessions) == 3:
            break
    held_port, *free_ports = sessions
    held = next(node for node in redis_cluster.nodes if node.port == held_port)
    held.command("CLIENT", "PAUSE", "60000", "WRITE")
    try:
        checks = {port: asyncio.ensure_future(brake.check("search", {"q": port}, session_id=session))
                  for port, session in sessions.items()}
        done, _ = await asyncio.wait([checks[port] for port in free_ports], timeout=15)
        answered_first = {port for port in free_ports if checks[port] in done}
        held_waiting = not checks[held_port].done()
    finally:
        held.command("CLIENT", "UNPAUSE")
    verdicts = {port: await check for port, check in checks.items()}
    print(f"\nanswered while master {held_port} was held: {sorted(answered_first)}")
    assert answered_first == set(free_ports) and held_waiting
    assert {port: (v.decided_by, v.count) for port, v in verdicts.items()} == dict.fromkeys(sessions, ("redis", 1))
