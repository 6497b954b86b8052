"""Shared fixtures: real redis-server processes (owned by the suite) and brakes on every backend.

Servers are started once per test session on free ports (never the system
Redis on 6379) and flushed between tests. `redis-server` must be on PATH:
`.ci/run` installs it with apt-get when it is missing, and the suite fails
(never skips) without it.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator

import pytest

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
