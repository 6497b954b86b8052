"""Shared fixtures: real redis-server processes (owned by the suite) and brakes on every backend.

Servers are started once per test session on free ports (never the system
Redis on 6379) and flushed between tests. `redis-server` must be on PATH:
`.ci/run` installs it with apt-get when it is missing, and the suite fails
(never skips) without it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from tests.backends import ADAPTER_BRAKES, AnyBrake, Brakes
from tests.servers import RedisCluster, RedisServer

# Adapters whose framework cannot share the main environment (crewai and strands pin an mcp
# the mcp extra cannot use): their modules are collected only where the framework is
# installed. `.ci/run` runs each in its own environment and fails unless it passed with no skip.
SEPARATE_ENVIRONMENTS = {"crewai": "test_integration_crewai.py", "strands": "test_integration_strands.py"}
collect_ignore = [module for framework, module in SEPARATE_ENVIRONMENTS.items()
                  if importlib.util.find_spec(framework) is None]

# The fault tests' fixtures (make, server, proxy) for every fault-themed module.
pytest_plugins = ["tests.faults"]


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


@pytest.fixture
async def brakes(request: pytest.FixtureRequest) -> AsyncIterator[Brakes]:
    """`brakes(kind, url=None, **options)`: brakes of any kind in `tests.backends`, closed after the test."""
    made = Brakes(request)
    yield made
    await made.close()


@pytest.fixture(params=ADAPTER_BRAKES)
def make_brake(request: pytest.FixtureRequest, brakes: Brakes) -> Callable[..., AnyBrake]:
    """`make_brake(**options)`: brakes of one kind of `ADAPTER_BRAKES`; all a test makes share one backend."""
    return brakes.of(request.param)
