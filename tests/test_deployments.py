"""Every deployment shape, sync and async, on real redis-server processes.

The same short behaviour everywhere: two identical checks allowed, the third
denied, `inspect` shows the streak, `sessions` lists it, `clear` forgets it.
Shapes: redis:// single node, redis+unix:// and unix:// sockets, rediss://
TLS, redis+cluster:// (3 masters), redis+sentinel:// (also across a
failover), redis:// with a password and with an ACL user, and a database
number. Then exactness under load: 500 concurrent async checks on one node
and on the cluster, and 4 processes x 300 checks on one session.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import secrets
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from distbrake import (
    AsyncDistributedBrake,
    BrakeSettings,
    BrakeUnavailableError,
    DistributedBrake,
    LoopBrakeError,
)
from tests.servers import (
    HOST,
    RedisServer,
    SentinelSetup,
    TLSRedisServer,
    free_port,
    wait_replicated,
)

PASSWORD = "pw-" + secrets.token_hex(8)
BRAKE_PASSWORD = "brake-" + secrets.token_hex(8)
# The minimal ACL user of the README (see tests/test_security.py), plus SELECT for databases other than 0.
BRAKE_ACL = ("~distbrake:* resetchannels -@all +evalsha +script|load +hget +hset +time +pexpire "
             "+hmget +pttl +scan +del +ping +select")
DEPLOYMENTS = ["single", "redis+unix", "unix", "tls", "cluster", "sentinel", "password", "acl", "db3"]
FAILOVER_DEADLINE = 20.0


# -- servers owned by this module ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TLSRedisServer]:
    with TLSRedisServer(name="tls-deploy") as server:
        yield server


@pytest.fixture(scope="module")
def sentinel() -> Iterator[SentinelSetup]:
    with SentinelSetup(service_name="brakes") as setup:
        yield setup


@pytest.fixture(scope="module")
def auth_server() -> Iterator[RedisServer]:
    with RedisServer(password=PASSWORD, acl_users=[f"brake on >{BRAKE_PASSWORD} {BRAKE_ACL}"],
                     name="auth-deploy") as server:
        yield server


def tls_url(server: TLSRedisServer) -> str:
    return (f"rediss://{HOST}:{server.port}?ssl_ca_certs={server.ca_path}"
            "&ssl_cert_reqs=required&ssl_check_hostname=false")


@pytest.fixture(params=DEPLOYMENTS)
def deployment(request: pytest.FixtureRequest) -> str:
    """The URL of one deployment shape (each test uses its own session ids: no flush needed)."""
    kind = str(request.param)
    if kind in ("single", "redis+unix", "unix", "db3"):
        server: RedisServer = request.getfixturevalue("redis_server")
        return {
            "single": server.url,
            "redis+unix": f"redis+unix://{server.unix_socket}?db=0",
            "unix": f"unix://{server.unix_socket}",
            "db3": f"{server.url}/3",
        }[kind]
    if kind == "tls":
        return tls_url(request.getfixturevalue("tls_server"))
    if kind == "cluster":
        return str(request.getfixturevalue("cluster_url"))
    if kind == "sentinel":
        return str(request.getfixturevalue("sentinel").sentinel_url)
    auth: RedisServer = request.getfixturevalue("auth_server")
    if kind == "password":
        return f"redis://:{PASSWORD}@{HOST}:{auth.port}/0"
    return f"redis://brake:{BRAKE_PASSWORD}@{HOST}:{auth.port}/1"


async def aclose(brake: AsyncDistributedBrake) -> None:
    """`aclose`, then the sentinels' own clients too: a no-op once `aclose` closes them itself
    (test_async_sentinel_brake_closes_its_sentinel_connections); until then it keeps the leak
    from surfacing as a ResourceWarning in whichever later test the garbage collector runs."""
    await brake.aclose()
    manager = getattr(getattr(brake.client, "connection_pool", None), "sentinel_manager", None)
    for client in getattr(manager, "sentinels", ()):
        await client.aclose()


# -- the same short behaviour everywhere ---------------------------------------------------------------------


def behave_sync(brake: DistributedBrake, token: str) -> None:
    a, b = f"{token}-a", f"{token}-b"
    assert brake.ping()
    first = brake.check("search", {"q": token}, session_id=a)
    second = brake.check("search", {"q": token}, session_id=a)
    assert (first.count, second.count, first.decided_by, second.decided_by) == (1, 2, "redis", "redis")
    with pytest.raises(LoopBrakeError) as denied:
        brake.check("search", {"q": token}, session_id=a)
    assert (denied.value.count, denied.value.session_id) == (3, a)
    assert brake.check("fetch", {"q": token}, session_id=b).count == 1
    state = brake.inspect(a)
    assert state is not None and (state.session_id, state.tool_name, state.count) == (a, "search", 3)
    assert state.hash_prefix == first.hash_prefix and state.ttl_seconds is not None and state.ttl_seconds > 0
    assert sorted(s.session_id for s in brake.sessions(f"{token}-*")) == [a, b]
    assert brake.clear(a) and brake.inspect(a) is None and brake.clear(b)
    assert brake.check("search", {"q": token}, session_id=a).count == 1  # a fresh streak
    assert brake.clear(a)


async def behave_async(brake: AsyncDistributedBrake, token: str) -> None:
    a, b = f"{token}-a", f"{token}-b"
    assert await brake.ping()
    first = await brake.check("search", {"q": token}, session_id=a)
    second = await brake.check("search", {"q": token}, session_id=a)
    assert (first.count, second.count, first.decided_by, second.decided_by) == (1, 2, "redis", "redis")
    with pytest.raises(LoopBrakeError) as denied:
        await brake.check("search", {"q": token}, session_id=a)
    assert (denied.value.count, denied.value.session_id) == (3, a)
    assert (await brake.check("fetch", {"q": token}, session_id=b)).count == 1
    state = await brake.inspect(a)
    assert state is not None and (state.session_id, state.tool_name, state.count) == (a, "search", 3)
    assert state.hash_prefix == first.hash_prefix and state.ttl_seconds is not None and state.ttl_seconds > 0
    assert sorted([s.session_id async for s in brake.sessions(f"{token}-*")]) == [a, b]
    assert await brake.clear(a) and await brake.inspect(a) is None and await brake.clear(b)
    assert (await brake.check("search", {"q": token}, session_id=a)).count == 1
    assert await brake.clear(a)


def test_the_behaviour_sync(deployment: str) -> None:
    with DistributedBrake.from_url(deployment, on_backend_error="closed", timeout_seconds=5) as brake:
        behave_sync(brake, uuid.uuid4().hex)


async def test_the_behaviour_async(deployment: str) -> None:
    brake = AsyncDistributedBrake.from_url(deployment, on_backend_error="closed", timeout_seconds=5)
    try:
        await behave_async(brake, uuid.uuid4().hex)
    finally:
        await aclose(brake)


async def test_sync_and_async_share_streaks(deployment: str) -> None:
    token = uuid.uuid4().hex
    with DistributedBrake.from_url(deployment, on_backend_error="closed", timeout_seconds=5) as sync:
        aio = AsyncDistributedBrake.from_url(deployment, on_backend_error="closed", timeout_seconds=5)
        try:
            assert sync.check("t", {"x": 1}, session_id=token).count == 1
            assert (await aio.check("t", {"x": 1}, session_id=token)).count == 2
            with pytest.raises(LoopBrakeError):
                sync.check("t", {"x": 1}, session_id=token)
            assert await aio.clear(token)
        finally:
            await aclose(aio)


# -- databases --------------------------------------------------------------------------------------------------


async def test_a_database_number_isolates(redis_server: RedisServer, redis_url: str) -> None:
    urls = {0: f"{redis_url}/0", 3: f"{redis_url}/3", 5: f"redis+unix://{redis_server.unix_socket}?db=5"}
    brakes = {db: DistributedBrake.from_url(url, on_backend_error="closed") for db, url in urls.items()}
    aio = AsyncDistributedBrake.from_url(urls[3], on_backend_error="closed")
    try:
        for db, brake in brakes.items():
            assert brake.check("t", {}, session_id="same").count == 1, db
        assert (await aio.check("t", {}, session_id="same")).count == 2
        assert brakes[0].check("t", {}, session_id="only-in-0").count == 1
        assert [s.session_id for s in brakes[3].sessions()] == ["same"]
        assert sorted(s.session_id for s in brakes[0].sessions()) == ["only-in-0", "same"]
        assert brakes[5].clear_all() == 1
        assert brakes[0].inspect("same") is not None and await aio.inspect("same") is not None
        keyspace = redis_server.info("keyspace")
        assert {db: keyspace.get(f"db{db}", "keys=0").split(",")[0] for db in (0, 3, 5)} == {
            0: "keys=2", 3: "keys=1", 5: "keys=0"}
    finally:
        for brake in brakes.values():
            brake.close()
        await aio.aclose()


# -- sentinel failover ---------------------------------------------------------------------------------------


def _poll(attempt: Any, deadline: float) -> Any:
    """Call `attempt` until it stops raising BrakeUnavailableError, within `deadline` seconds."""
    end = time.monotonic() + deadline
    while True:
        try:
            return attempt()
        except BrakeUnavailableError:
            assert time.monotonic() < end, "the brake did not recover within the deadline"
            time.sleep(0.02)


async def _apoll(attempt: Any, deadline: float) -> Any:
    end = time.monotonic() + deadline
    while True:
        try:
            return await attempt()
        except BrakeUnavailableError:
            assert time.monotonic() < end, "the brake did not recover within the deadline"
            await asyncio.sleep(0.02)


async def test_sentinel_failover_keeps_the_brake_working() -> None:
    settings = BrakeSettings(on_backend_error="closed", timeout_seconds=1, retry_after_seconds=0.05)
    with SentinelSetup(service_name="failover") as setup:
        sync = DistributedBrake.from_url(setup.sentinel_url, settings=settings)
        aio = AsyncDistributedBrake.from_url(setup.sentinel_url, settings=settings)
        try:
            assert sync.check("t", {"s": 1}, session_id="sync-streak").count == 1
            assert sync.check("t", {"s": 1}, session_id="sync-streak").count == 2
            assert (await aio.check("t", {"a": 1}, session_id="async-streak")).count == 1
            assert (await aio.check("t", {"a": 1}, session_id="async-streak")).count == 2
            wait_replicated(setup.master, setup.replicas)  # the streaks are on the replica too
            old = setup.master
            new = setup.kill_master_and_wait_failover()
            assert new is not old

            probes = iter(range(10**6))
            verdict = _poll(lambda: sync.check("probe", {}, session_id=f"p{next(probes)}"), FAILOVER_DEADLINE)
            assert verdict.decided_by == "redis"
            averdict = await _apoll(lambda: aio.check("probe", {}, session_id=f"a{next(probes)}"), FAILOVER_DEADLINE)
            assert averdict.decided_by == "redis"
            # the promoted replica had the streaks: the third identical call is denied there
            with pytest.raises(LoopBrakeError) as denied:
                sync.check("t", {"s": 1}, session_id="sync-streak")
            with pytest.raises(LoopBrakeError) as adenied:
                await aio.check("t", {"a": 1}, session_id="async-streak")
            assert denied.value.count == adenied.value.count == 3
            assert setup.current_master_address()[1] == new.port
            state = sync.inspect("async-streak")
            assert state is not None and state.count == 3
        finally:
            sync.close()
            await aclose(aio)


async def test_async_sentinel_brake_closes_its_sentinel_connections(sentinel: SentinelSetup) -> None:
    """`aclose` closes every connection the brake opened, the ones to the sentinels included."""
    brake = AsyncDistributedBrake.from_url(sentinel.sentinel_url, on_backend_error="closed")
    assert (await brake.check("t", {}, session_id=uuid.uuid4().hex)).decided_by == "redis"
    await brake.aclose()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        del brake
        gc.collect()
    leaks = [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]
    assert leaks == []


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_check_keeps_its_time_budget_when_every_sentinel_is_down(kind: str) -> None:
    """timeout_seconds bounds a check on Sentinel too (redis-py's default retry would take seconds)."""
    url = f"redis+sentinel://{HOST}:{free_port()}/mymaster"
    budget = 0.5
    started = time.monotonic()
    if kind == "sync":
        with DistributedBrake.from_url(url, on_backend_error="closed", timeout_seconds=budget) as brake:
            with pytest.raises(BrakeUnavailableError, match=r"MasterNotFoundError|ConnectionError|TimeoutError"):
                brake.check("t", {}, session_id="s")
    else:
        abrake = AsyncDistributedBrake.from_url(url, on_backend_error="closed", timeout_seconds=budget)
        try:
            with pytest.raises(BrakeUnavailableError):
                await abrake.check("t", {}, session_id="s")
        finally:
            await aclose(abrake)
    assert time.monotonic() - started < 3 * budget


# -- a cluster that is down when the brake is built ---------------------------------------------------------


@pytest.mark.parametrize("policy", ["local", "open", "closed"])
async def test_a_cluster_down_at_build_time_gets_the_failure_policy(policy: str) -> None:
    """Building a brake does no I/O on any deployment; a cluster nobody answers for applies the policy."""
    url = f"redis+cluster://{HOST}:{free_port()},{HOST}:{free_port()}"
    sync = DistributedBrake.from_url(url, on_backend_error=policy, timeout_seconds=0.5)  # type: ignore[arg-type]
    aio = AsyncDistributedBrake.from_url(url, on_backend_error=policy, timeout_seconds=0.5)  # type: ignore[arg-type]
    try:
        if policy == "closed":
            with pytest.raises(BrakeUnavailableError):
                sync.check("t", {}, session_id="s")
            with pytest.raises(BrakeUnavailableError):
                await aio.check("t", {}, session_id="s")
        else:
            decided_by = {"local": "fallback", "open": "fail-open"}[policy]
            assert sync.check("t", {}, session_id="s").decided_by == decided_by
            assert (await aio.check("t", {}, session_id="s")).decided_by == decided_by
    finally:
        sync.close()
        await aio.aclose()


# -- exact counts under load ------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["single", "cluster"])
async def test_500_concurrent_async_checks_get_exact_counts(request: pytest.FixtureRequest, backend: str) -> None:
    url = str(request.getfixturevalue("redis_url" if backend == "single" else "cluster_url"))
    async with AsyncDistributedBrake.from_url(url, max_repeats=10**6, on_backend_error="closed",
                                              timeout_seconds=20) as brake:
        verdicts = await asyncio.gather(*(brake.check("t", {"same": 1}, session_id="crowd") for _ in range(500)))
        assert sorted(v.count for v in verdicts) == list(range(1, 501))
        assert {v.decided_by for v in verdicts} == {"redis"}
        # and 500 sessions at once, one check each
        verdicts = await asyncio.gather(*(brake.check("t", {}, session_id=f"s{i}") for i in range(500)))
        assert {v.count for v in verdicts} == {1}
        state = await brake.inspect("crowd")
        assert state is not None and state.count == 500
        assert len([s async for s in brake.sessions()]) == 501


PROCESSES = 4
CHECKS_PER_PROCESS = 300


def _check_many(url: str, barrier: Any, results: Any) -> None:
    """One worker process: wait for the others, then 300 identical checks on one session."""
    brake = DistributedBrake.from_url(url, max_repeats=10**6, on_backend_error="closed", timeout_seconds=10)
    try:
        barrier.wait(timeout=60)
        counts = [brake.check("t", {"same": 1}, session_id="fleet").count for _ in range(CHECKS_PER_PROCESS)]
        results.put(counts)
    finally:
        brake.close()


def test_processes_sharing_one_session_get_exact_counts(redis_url: str) -> None:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(PROCESSES)
    results = context.Queue()
    workers = [context.Process(target=_check_many, args=(redis_url, barrier, results)) for _ in range(PROCESSES)]
    for worker in workers:
        worker.start()
    try:
        per_process = [results.get(timeout=60) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=30)
        results.close()
        results.join_thread()
    assert [worker.exitcode for worker in workers] == [0] * PROCESSES
    for counts in per_process:
        assert len(counts) == CHECKS_PER_PROCESS and counts == sorted(counts)  # each process sees its counts rise
    assert sorted(c for counts in per_process for c in counts) == list(range(1, PROCESSES * CHECKS_PER_PROCESS + 1))
    with DistributedBrake.from_url(redis_url) as brake:
        state = brake.inspect("fleet")
        assert state is not None and state.count == PROCESSES * CHECKS_PER_PROCESS
