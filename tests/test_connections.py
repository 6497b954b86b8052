"""How many connections a brake opens, against a real redis-server: `?max_connections=N` holds on every path."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import hashlib
import threading
import time
from typing import Any

import pytest
import redis
from redis._parsers import _RESP2Parser

from distbrake import AsyncDistributedBrake, DistributedBrake, LoopBrakeError
from distbrake.redis.connect import CONNECTORS
from distbrake.redis.script import VARIANTS, script_source
from tests.backends import Brakes, Checker
from tests.servers import RedisServer


def peak_clients(server: RedisServer) -> int:
    """Clients connected now, besides the one asking."""
    return int(server.command("INFO", "clients").split("connected_clients:")[1].split()[0]) - 1


@pytest.mark.parametrize("limit", [1, 4])
def test_sync_threads_never_open_more_than_max_connections(server: RedisServer, limit: int) -> None:
    brake = DistributedBrake.from_url(f"{server.url}?max_connections={limit}", timeout_seconds=5.0)
    start, done, leave = threading.Barrier(64), threading.Barrier(65), threading.Barrier(65)
    decided: list[str] = []

    def work(i: int) -> None:
        start.wait()
        for j in range(20):
            decided.append(brake.check("search", {"j": j}, session_id=f"s{i}").decided_by)
        done.wait()  # every thread has checked and keeps whatever connection it holds
        leave.wait()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(64)]
    try:
        for thread in threads:
            thread.start()
        done.wait()
        peak = peak_clients(server)
        leave.wait()
        for thread in threads:
            thread.join()
        counts = [brake.check("search", {"j": 0}, session_id=f"s{i}").count for i in range(64)]
    finally:
        brake.close()
    print(f"\nsync, 64 threads, max_connections={limit}: {peak} server connections, "
          f"{len(decided)} checks decided by {sorted(set(decided))}")
    assert peak <= limit
    assert decided == ["redis"] * 64 * 20
    assert counts == [1] * 64  # each session's last call was j=19: j=0 starts a new streak


@pytest.mark.parametrize("limit", [1, 2])
async def test_async_burst_never_opens_more_than_max_connections(server: RedisServer, limit: int) -> None:
    brake = AsyncDistributedBrake.from_url(f"{server.url}?max_connections={limit}", timeout_seconds=5.0)
    try:
        verdicts = await asyncio.gather(
            *(brake.check("search", {}, session_id=f"s{i}") for i in range(300)),
            *(brake.inspect(f"s{i}") for i in range(20)),
        )
        peak = peak_clients(server)
    finally:
        await brake.aclose()
    decided = {v.decided_by for v in verdicts[:300]}  # type: ignore[union-attr]
    print(f"\nasync, 300 checks and 20 inspects at once, max_connections={limit}: "
          f"{peak} server connections, decided by {sorted(decided)}")
    assert peak <= limit
    assert decided == {"redis"}


def test_without_a_limit_each_checking_thread_opens_one_connection(server: RedisServer) -> None:
    """The documented default on a single node: one connection per thread that checks, kept for its life (and one
    of the pool for the kill switch's reader thread, issue 24)."""
    def received() -> int:
        return int(server.command("INFO", "stats").split("total_connections_received:")[1].split()[0])

    brake = DistributedBrake.from_url(server.url, timeout_seconds=Brakes.TIMEOUT)  # no timeout's reconnect counted
    before = received()

    def work(i: int) -> None:
        for j in range(50):
            brake.check("search", {"j": j}, session_id=f"s{i}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        opened = received() - before - 1  # the INFO that asks
    finally:
        brake.close()
    print(f"\nsync, 8 threads x 50 checks, no limit: {opened} connections opened")
    assert opened == 8 + 1


def test_a_checking_threads_connection_is_closed_when_the_thread_ends(server: RedisServer) -> None:
    """A framework running each tool call in a short-lived thread (CrewAI's hooks do) leaves no connection open
    behind it: the thread's connection closes when the thread ends, not at some later garbage collection (which
    left the socket open meanwhile and could close it first, warning of an unclosed socket)."""
    brake = DistributedBrake.from_url(server.url, timeout_seconds=Brakes.TIMEOUT)
    brake.check("search", {"q": "weather"}, session_id="warm")  # the kill switch's reader has its connection
    baseline = peak_clients(server) - 1  # less this thread's own

    def work(i: int) -> None:
        brake.check("search", {"q": "weather"}, session_id=f"t{i}")

    gc.disable()  # only the thread's end may close its connection
    try:
        for i in range(4):
            thread = threading.Thread(target=work, args=(i,))
            thread.start()
            thread.join()
        deadline = time.monotonic() + 10.0  # the server sees a close on its next turn
        while (left := peak_clients(server) - baseline - 1) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        gc.enable()
        brake.close()
    print(f"\nconnections left open by 4 ended threads: {left}")
    assert left == 0


def test_only_a_url_with_max_connections_gets_a_blocking_pool(server: RedisServer) -> None:
    """redis-py 8's own pool default (100) is not a limit of ours: the sync brake keeps its per-thread fast path."""
    import redis
    import redis.asyncio

    from distbrake import AsyncDistributedBrake

    with DistributedBrake.from_url(server.url) as plain, \
            DistributedBrake.from_url(f"{server.url}?max_connections=4") as limited:
        assert type(plain.client.connection_pool) is redis.ConnectionPool
        assert type(limited.client.connection_pool) is redis.BlockingConnectionPool
        assert limited.client.connection_pool.max_connections == 4
    lone = AsyncDistributedBrake.from_url(server.url)
    assert type(lone.client.connection_pool) is redis.asyncio.ConnectionPool


def test_async_checks_without_a_limit_share_two_connections_closed_with_the_brake(server: RedisServer) -> None:
    """The asyncio brake on a plain pool keeps two connections for its checks (a lane each, one batch on
    the wire per lane), opened once, and closes them on `aclose` and when `asyncio.run` ends the loop."""
    def received() -> int:
        return int(server.command("INFO", "stats").split("total_connections_received:")[1].split()[0])

    brake = AsyncDistributedBrake.from_url(server.url, timeout_seconds=5.0)

    async def work() -> tuple[int, int]:
        for j in range(100):  # one task at a time: each check is a batch of its own
            await brake.check("search", {"j": j % 2}, session_id="alone")
        await asyncio.gather(*(brake.check("search", {}, session_id=f"s{i}") for i in range(200)))
        return received(), peak_clients(server)

    before = received()
    after, peak = asyncio.run(work())  # the loop's end closes the brake's connections
    left = peak_clients(server)
    assert after - before - 1 <= 3  # the lanes' two connections (and the pool's, for loading the script)
    assert peak <= 3
    assert left == 0

    async def again() -> int:
        await brake.check("search", {}, session_id="alone")
        await brake.aclose()
        return peak_clients(server)

    assert asyncio.run(again()) == 0


def test_an_observation_first_on_a_new_loop_opens_and_closes_that_loops_connection(server: RedisServer) -> None:
    """`observe` as the first call on a loop binds the brake to it, like `check`: its connection closes with it."""
    from distbrake import ToolRules

    brake = AsyncDistributedBrake.from_url(
        server.url, timeout_seconds=5.0, tools={"poll": ToolRules(progress=True)})
    verdict = asyncio.run(brake.check("poll", {"job": 1}, session_id="s"))
    assert peak_clients(server) == 0
    asyncio.run(brake.observe(verdict, {"status": "running"}))
    assert peak_clients(server) == 0  # before the fix: the observation's connection was left open
    state = asyncio.run(brake.inspect("s"))
    asyncio.run(brake.aclose())
    assert state is not None and state.count == 1


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_backend_kind_can_give_its_brakes_a_variant_of_the_script(
    server: RedisServer, flavour: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The script is the brake's, chosen by its URL's connector when it is built: a variant (the text with a
    prefix, as some managed servers need) is what that brake's checks name, load after a NOSCRIPT, and run;
    another brake in the same process keeps the standard script."""
    monkeypatch.setitem(VARIANTS, "test-variant", "-- a variant of the script for a test server\n")
    standard = DistributedBrake.from_url(server.url, timeout_seconds=Brakes.TIMEOUT)
    monkeypatch.setitem(CONNECTORS, "redis", dataclasses.replace(
        CONNECTORS["redis"], script_variant=lambda parsed: "test-variant"))
    kind = DistributedBrake if flavour == "sync" else AsyncDistributedBrake
    brake = Checker(kind.from_url(server.url, max_repeats=3, timeout_seconds=Brakes.TIMEOUT))
    text = VARIANTS["test-variant"] + script_source()
    assert (brake.brake.script.variant, brake.brake.script.text) == ("test-variant", text)
    assert brake.brake.script.sha == hashlib.sha1(text.encode()).hexdigest() != standard.script.sha
    for n in (1, 2):
        server.command("SCRIPT", "FLUSH")  # each check loads the variant after its NOSCRIPT
        assert (await brake.check("search", {"q": 1}, session_id=f"variant-{flavour}")).count == n
        assert server.command("SCRIPT", "EXISTS", brake.brake.script.sha, standard.script.sha) == [1, 0]
    assert standard.check("search", {"q": 1}, session_id=f"standard-{flavour}").count == 1
    standard.close()
    await brake.close()


@pytest.mark.parametrize("shape", ["single", "cluster"])
async def test_a_run_of_identical_async_checks_names_the_brakes_own_script(
    shape: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The asyncio batcher sends identical checks of one session as one run (one script call): that call names
    the brake's own script, as a single check does. Before the fix a run named the standard script, so a brake
    with a variant (Upstash's) got NOSCRIPT again after each load of its own: on a single node the whole run fell
    to the failure policy (here `closed`: BrakeUnavailableError), on a Cluster it cost more round trips."""
    url = request.getfixturevalue("redis_url" if shape == "single" else "cluster_url")
    servers = [request.getfixturevalue("redis_server")] if shape == "single" else \
        request.getfixturevalue("redis_cluster").nodes
    connector = "redis" if shape == "single" else "cluster"

    async def bursts(brake: AsyncDistributedBrake, session: str) -> int:
        """Two bursts of 20 identical checks; the NOSCRIPT errors the servers replied meanwhile."""
        for server in servers:  # no script loaded (the brake loads its own)
            server.command("SCRIPT", "FLUSH")
            server.command("CONFIG", "RESETSTAT")
        for burst in (1, 2):
            verdicts = await asyncio.gather(*(brake.check("search", {"q": 1}, session_id=session) for _ in range(20)))
            assert sorted(v.count for v in verdicts) == list(range(burst * 20 - 19, burst * 20 + 1))
            assert {v.decided_by for v in verdicts} == {"redis"}
        await brake.aclose()
        return sum(int(server.info("errorstats").get("errorstat_NOSCRIPT", "count=0").split("=")[1])
                   for server in servers)

    # a 5 s timeout: a loaded machine must not reach the policy (the Cluster client is built and the script loaded
    # within the first check: past the default 0.5 s on a busy CI machine, QueueTimeout)
    options: dict[str, Any] = {"max_repeats": 100, "on_backend_error": "closed", "timeout_seconds": Brakes.TIMEOUT}
    standard = AsyncDistributedBrake.from_url(url, **options)
    monkeypatch.setitem(VARIANTS, "test-variant", "-- a variant of the script for a test server\n")
    monkeypatch.setitem(CONNECTORS, connector, dataclasses.replace(
        CONNECTORS[connector], script_variant=lambda parsed: "test-variant"))
    variant = AsyncDistributedBrake.from_url(url, **options)
    assert (standard.script.variant, variant.script.variant) == ("redis", "test-variant")
    # the variant's runs cost no more than the standard script's: no server is asked again for a script it lacks
    assert await bursts(variant, f"variant-{shape}") <= await bursts(standard, f"standard-{shape}")


@pytest.mark.parametrize(("threads", "limit"), [(2, 1), (8, 4), (16, 1)])
def test_threads_sharing_a_small_pool_are_served_in_turn_not_taken_for_an_outage(
    server: RedisServer, threads: int, limit: int, caplog: pytest.LogCaptureFixture,
) -> None:
    """`?max_connections=N` with more threads, at the default timeout: a thread that releases its connection
    does not retake it ahead of those waiting (no thread starves), and a wait for the pool is never an outage."""
    brake = DistributedBrake.from_url(f"{server.url}?max_connections={limit}")
    start = threading.Barrier(threads)
    decided: list[str] = []

    def work(i: int) -> None:
        start.wait()
        for j in range(1000):
            decided.append(brake.check("search", {"j": j}, session_id=f"s{i}").decided_by)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        health = brake.health()
    finally:
        brake.close()
    print(f"\nsync, {threads} threads, max_connections={limit}: {decided.count('redis')} of {len(decided)} "
          "checks decided by Redis")
    assert health.ok and not brake.failures.breaker.down
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert decided == ["redis"] * threads * 1000


@pytest.mark.parametrize("client_options", [
    {"parser_class": _RESP2Parser},  # no hiredis reader: every command goes redis-py's own way
    {"health_check_interval": 30},  # redis-py pings an idle connection first: its own way too
], ids=["python-parser", "health-checks"])
def test_a_client_the_direct_path_cannot_read_counts_the_same(
    server: RedisServer, client_options: dict[str, object],
) -> None:
    """A user's own client whose connection the brake's fast exchange does not read (no hiredis parser, or health
    checks on) still counts, replays and denies, and takes its NOSCRIPT reload, through redis-py's send and read."""
    client = redis.Redis.from_url(server.url, **client_options)  # type: ignore[arg-type]
    brake = DistributedBrake(client, max_repeats=3)
    try:
        client.script_flush()
        counts = [brake.check("search", {"q": 1}, session_id="own-client", call_id=f"c{n}").count for n in (1, 2)]
        assert counts == [1, 2]
        assert brake.check("search", {"q": 1}, session_id="own-client", call_id="c2").replayed  # a retry: once
        with pytest.raises(LoopBrakeError):
            brake.check("search", {"q": 1}, session_id="own-client", call_id="c3")
    finally:
        brake.clear("own-client")
        brake.close()
