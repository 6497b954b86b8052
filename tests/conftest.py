"""Shared fixtures: real redis-server processes (owned by the suite) and brakes on every backend.

Servers are started once per test session on free ports (never the system
Redis on 6379) and flushed between tests. `redis-server` must be on PATH:
`.ci/run` installs it with apt-get when it is missing, and the suite fails
(never skips) without it.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from distbrake import AsyncDistributedBrake, DistributedBrake, LoopBrake
from tests.brakes import close_brakes
from tests.redis_servers import RedisCluster, RedisServer

_names = itertools.count()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One real single-node redis-server for the whole run (unix socket too)."""
    with RedisServer(unix_socket=True, name="single") as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The single node's URL, flushed before the test."""
    redis_server.command("FLUSHALL")
    redis_server.command("SCRIPT", "FLUSH")
    return redis_server.url


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A real 3-master Redis Cluster for the whole run."""
    with RedisCluster(masters=3) as cluster:
        yield cluster


@pytest.fixture
def cluster_url(redis_cluster: RedisCluster) -> str:
    for node in redis_cluster.nodes:
        node.command("FLUSHALL")
    return redis_cluster.url


def memory_url() -> str:
    """A fresh embedded backend (fakeredis) nobody else uses."""
    return f"memory://test-{next(_names)}-{uuid.uuid4().hex[:6]}"


BRAKE_KINDS = ["loop", "sync-memory", "async-memory", "sync-redis", "async-redis"]
AnyBrake = LoopBrake | DistributedBrake | AsyncDistributedBrake


@pytest.fixture(params=BRAKE_KINDS)
async def make_brake(request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., AnyBrake]]:
    """Brakes of one kind (in-process, or sync/async on the embedded store or a real
    single node); every brake a test makes shares one backend, and is closed after it."""
    kind: str = request.param
    url = str(request.getfixturevalue("redis_url")) if kind.endswith("redis") else memory_url()
    made: list[AnyBrake] = []

    def make(**options: Any) -> AnyBrake:
        brake: AnyBrake
        if kind == "loop":
            brake = LoopBrake(**options)
        elif kind.startswith("sync"):
            brake = DistributedBrake.from_url(url, **options)
        else:
            brake = AsyncDistributedBrake.from_url(url, **options)
        made.append(brake)
        return brake

    yield make
    await close_brakes(made)


@pytest.fixture
def brakes(request: pytest.FixtureRequest) -> Iterator[Callable[..., Any]]:
    """make(kind, url=None) for kind in loop / memory / memory-async / redis; the sync
    distributed ones are closed afterwards."""
    made: list[DistributedBrake] = []

    def make(kind: str, url: str | None = None) -> Any:
        if kind == "loop":
            return LoopBrake()
        if kind == "memory-async":
            return AsyncDistributedBrake.from_url(url or memory_url())
        if kind == "redis":
            url = url or str(request.getfixturevalue("redis_url"))
        brake = DistributedBrake.from_url(url or memory_url())
        made.append(brake)
        return brake

    yield make
    for brake in made:
        brake.close()
