"""One `AsyncDistributedBrake` across event loops: scripts and tests that call `asyncio.run` again and again.

A brake's Redis connections belong to the loop they were opened on. When
that loop ends, the brake moves to the next one by itself: `asyncio.run`
closes the brake's connections while its loop still runs, so none is left
open behind it; a loop closed by hand leaves them to be dropped (never
awaited on a closed loop). `aclose` from a later loop neither raises nor
leaks. Where the brake cannot move (its loop still runs in another thread;
a Redis Cluster client of the caller's own holding a closed loop's
connections), it raises `EventLoopError`, a `DistbrakeError` that says what
to do. Every test runs on real servers: a single node, a 3-master cluster,
and a Sentinel-managed master. Connections are counted on the servers:
every client of the brake is named (`?client_name=`), and the sentinel's
clients are counted too.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio
import redis.asyncio.cluster

from distbrake import AsyncDistributedBrake, DistbrakeError, SessionState
from distbrake.errors import EventLoopError
from tests.servers import RedisCluster, RedisServer, SentinelSetup, wait_until

KINDS = ["single", "cluster", "sentinel"]
SETTLE = 10.0  # how long the servers may take to see a closed connection go (an upper bound)
# These tests are about event loops, not time: a check in a new loop of a worker stalled on a loaded machine must not
# reach the failure policy (at 5 s one did: the loop ran the deadline late, a QueueTimeout, on a cluster).
TIMEOUT = 30


@pytest.fixture(scope="module")
def sentinel() -> Iterator[SentinelSetup]:
    with SentinelSetup(service_name="loops") as setup:
        yield setup


@dataclass
class Deployment:
    kind: str
    url: str
    name: str  # the client name every connection of the brake carries
    data_nodes: list[RedisServer]
    sentinels: list[RedisServer]

    def open_connections(self) -> int:
        """The brake's connections the servers see now: named ones on the data nodes, any on the sentinels."""
        count = 0
        for node in self.data_nodes:
            count += sum(f" name={self.name} " in f" {line} " for line in node.command("CLIENT", "LIST").splitlines())
        for node in self.sentinels:  # the sentinel's clients but the one asking it now
            count += sum("cmd=client|list" not in line for line in node.command("CLIENT", "LIST").splitlines())
        return count

    def wait_closed(self) -> None:
        wait_until(lambda: self.open_connections() == 0, timeout=SETTLE,
                   message=lambda: f"{self.open_connections()} connection(s) of the brake stay open")


@pytest.fixture(params=KINDS)
def deployment(request: pytest.FixtureRequest) -> Deployment:
    name = f"loops-{uuid.uuid4().hex[:10]}"
    kind = str(request.param)
    if kind == "single":
        server: RedisServer = request.getfixturevalue("redis_server")
        return Deployment(kind, f"{server.url}?client_name={name}", name, [server], [])
    if kind == "cluster":
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        return Deployment(kind, f"{cluster.url}?client_name={name}", name, list(cluster.nodes), [])
    setup: SentinelSetup = request.getfixturevalue("sentinel")
    return Deployment(kind, f"{setup.sentinel_url}?client_name={name}", name, setup.data_nodes,
                      list(setup.sentinels))


def run(make: Callable[[], Any]) -> Any:
    """`asyncio.run` of the coroutine `make()` gives (a new loop each time)."""
    async def main() -> Any:
        return await make()

    return asyncio.run(main())


async def listed(brake: AsyncDistributedBrake, match: str) -> list[str]:
    return [state.session_id async for state in brake.sessions(match)]


def resource_warnings(seen: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)]


# -- a new asyncio.run for every call -----------------------------------------------------------------


def test_one_brake_serves_one_asyncio_run_after_another(deployment: Deployment) -> None:
    """Every operation in a loop of its own: right answers, and nothing left open after each loop."""
    session = f"s-{uuid.uuid4().hex}"
    brake = AsyncDistributedBrake.from_url(deployment.url, on_backend_error="closed", timeout_seconds=TIMEOUT)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")

        def check() -> Any:
            return brake.check("search", {"q": 1}, session_id=session)

        first, second = run(check), run(check)
        assert (first.count, second.count, first.decided_by, second.decided_by) == (1, 2, "redis", "redis")
        deployment.wait_closed()  # asyncio.run closed the brake's connections as its loop ended
        state = run(lambda: brake.inspect(session))
        assert isinstance(state, SessionState) and state.count == 2
        deployment.wait_closed()
        assert run(brake.ping) is True
        assert run(lambda: listed(brake, session)) == [session]
        assert run(lambda: brake.clear(session)) is True
        assert run(check).count == 1
        assert run(brake.clear_all) >= 1
        deployment.wait_closed()
        run(brake.aclose)
        deployment.wait_closed()
        gc.collect()
    assert resource_warnings(seen) == []


def test_aclose_in_a_new_loop_after_check_neither_raises_nor_leaks(deployment: Deployment) -> None:
    """The reported case: `asyncio.run(brake.aclose())` after `asyncio.run(brake.check(...))`."""
    brake = AsyncDistributedBrake.from_url(deployment.url, on_backend_error="closed", timeout_seconds=TIMEOUT)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert run(lambda: brake.check("search", {}, session_id=uuid.uuid4().hex)).decided_by == "redis"
        run(brake.aclose)
        deployment.wait_closed()
        gc.collect()
    assert resource_warnings(seen) == []


def test_a_loop_closed_by_hand_is_left_behind(deployment: Deployment) -> None:
    """A loop closed without `shutdown_asyncgens` keeps its connections: the brake drops them and goes on."""
    session = uuid.uuid4().hex
    brake = AsyncDistributedBrake.from_url(deployment.url, on_backend_error="closed", timeout_seconds=TIMEOUT)
    loop = asyncio.new_event_loop()
    assert loop.run_until_complete(brake.check("search", {}, session_id=session)).count == 1
    loop.close()  # by hand: the brake's connection stays open, on a loop that can never close it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # the dropped ones, when they are garbage
        second = run(lambda: brake.check("search", {}, session_id=session))
        assert (second.count, second.decided_by) == (2, "redis")
        assert run(lambda: brake.inspect(session)).count == 2
        run(brake.aclose)
        gc.collect()
    deployment.wait_closed()  # once dropped and collected, nothing of the brake stays open


# -- where the brake cannot move ------------------------------------------------------------------------


def test_a_loop_still_open_is_a_clear_error_until_it_is_closed(deployment: Deployment) -> None:
    """An idle loop may run again, with its connections: the brake refuses to leave it, and says how.

    Closed by hand as `asyncio.run` closes a loop (`shutdown_asyncgens`, then
    `close`), it takes the brake's connections with it, and the brake moves on.
    """
    session = uuid.uuid4().hex
    brake = AsyncDistributedBrake.from_url(
        deployment.url, on_backend_error="closed", timeout_seconds=TIMEOUT, max_repeats=100
    )
    idle = asyncio.new_event_loop()
    try:
        assert idle.run_until_complete(brake.check("search", {}, session_id=session)).count == 1
        for operation in (lambda: brake.check("search", {}, session_id=session),
                          lambda: brake.inspect(session), brake.ping, brake.aclose):
            with pytest.raises(EventLoopError, match="still open") as caught:
                run(operation)
            assert isinstance(caught.value, DistbrakeError) and isinstance(caught.value, RuntimeError)
            assert "shutdown_asyncgens" in str(caught.value)
        assert idle.run_until_complete(brake.check("search", {}, session_id=session)).count == 2
    finally:
        idle.run_until_complete(idle.shutdown_asyncgens())
        idle.close()
    deployment.wait_closed()  # closed with the loop
    assert run(lambda: brake.check("search", {}, session_id=session)).count == 3  # and the brake moves on
    run(brake.aclose)
    deployment.wait_closed()


def test_a_loop_still_running_in_another_thread_is_a_clear_error(redis_server: RedisServer) -> None:
    brake = AsyncDistributedBrake.from_url(redis_server.url, on_backend_error="closed", timeout_seconds=TIMEOUT)
    session = uuid.uuid4().hex
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:
        first = asyncio.run_coroutine_threadsafe(brake.check("search", {}, session_id=session), other).result(10)
        assert first.count == 1
        for operation in (lambda: brake.check("search", {}, session_id=session),
                          lambda: brake.inspect(session), brake.clear_all, brake.aclose):
            with pytest.raises(EventLoopError, match="another thread") as caught:
                run(operation)
            assert isinstance(caught.value, DistbrakeError) and isinstance(caught.value, RuntimeError)
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(10)
        other.run_until_complete(other.shutdown_asyncgens())  # what asyncio.run does last
        other.close()
    # that loop has ended: the brake moves on, the streak intact
    assert run(lambda: brake.check("search", {}, session_id=session)).count == 2
    run(brake.aclose)


# -- a client of the caller's own ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["single", "cluster"])
def test_a_brake_on_a_client_of_yours_moves_from_loop_to_loop(
    kind: str, request: pytest.FixtureRequest
) -> None:
    client: Any
    if kind == "single":
        server: RedisServer = request.getfixturevalue("redis_server")
        client = redis.asyncio.Redis(host=server.host, port=server.port, socket_timeout=1)
    else:
        cluster: RedisCluster = request.getfixturevalue("redis_cluster")
        host, port = cluster.startup_nodes[0]
        client = redis.asyncio.cluster.RedisCluster(host=host, port=port, socket_timeout=1)
    brake = AsyncDistributedBrake(client, on_backend_error="closed", timeout_seconds=TIMEOUT)
    session = uuid.uuid4().hex
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for expected in (1, 2):
            verdict = run(lambda: brake.check("search", {}, session_id=session))
            assert (verdict.count, verdict.decided_by) == (expected, "redis")
        assert run(lambda: brake.inspect(session)).count == 2
        assert run(lambda: brake.clear(session)) is True
        run(brake.aclose)
        gc.collect()
    assert resource_warnings(seen) == []


def test_a_cluster_client_of_yours_on_a_loop_closed_by_hand_is_a_clear_error(redis_cluster: RedisCluster) -> None:
    """Only a client the brake built can be replaced; a cluster client's connections of a closed loop
    cannot be dropped without awaiting: `check` says what to do, the operations and `aclose` cope."""
    name = f"loops-{uuid.uuid4().hex[:10]}"
    deployment = Deployment("cluster", redis_cluster.url, name, list(redis_cluster.nodes), [])

    def scenario() -> None:
        host, port = redis_cluster.startup_nodes[0]
        client = redis.asyncio.cluster.RedisCluster(host=host, port=port, socket_timeout=1, client_name=name)
        brake = AsyncDistributedBrake(client, on_backend_error="closed", timeout_seconds=TIMEOUT)
        session = uuid.uuid4().hex
        loop = asyncio.new_event_loop()
        assert loop.run_until_complete(brake.check("search", {}, session_id=session)).count == 1
        loop.close()
        with pytest.raises(EventLoopError, match="from_url") as caught:
            run(lambda: brake.check("search", {}, session_id=session))
        assert isinstance(caught.value, DistbrakeError)
        assert run(lambda: brake.inspect(session)).count == 1  # an operation drops them and goes on
        assert run(lambda: brake.check("search", {}, session_id=session)).count == 2  # and so can checks
        run(brake.aclose)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)  # the dropped ones, when they are garbage
        scenario()
        gc.collect()
    deployment.wait_closed()
