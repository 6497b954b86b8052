"""Shared fixtures: real redis-server processes (owned by the suite) and brakes on every backend.

Servers are started once per test session on free ports (never the system
Redis on 6379) and flushed between tests. `redis-server` must be on PATH:
`.ci/run` installs it with apt-get when it is missing, and the suite fails
(never skips) without it.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from tests.adapters import SEPARATE_ENVIRONMENTS, collected
from tests.backends import ADAPTER_BRAKES, AnyBrake, Brakes
from tests.servers import RedisCluster, RedisServer

# The adapters of SEPARATE_ENVIRONMENTS (tests/adapters.py) are collected only where their framework is
# installed: here their modules; tests/test_adapter_contract.py leaves out their cases the same way.
collect_ignore = [f"test_integration_{adapter}.py" for adapter in SEPARATE_ENVIRONMENTS if not collected(adapter)]

# The fault tests' fixtures (make, server, proxy) for every fault-themed module.
pytest_plugins = ["tests.faults"]

# The CLI's piped output is as wide as COLUMNS says (200 without it), and the tests run the CLI with this
# process's environment: a terminal size inherited from whatever started the run (pytest-xdist's workers
# get COLUMNS=80 LINES=24) wrapped the rows of `list` and `doctor` that the tests read.
for _size in ("COLUMNS", "LINES"):
    os.environ.pop(_size, None)

# CrewAI keeps the last kickoff's task outputs in a SQLite file under ~/.local/share/<CREWAI_STORAGE_DIR, else the
# working directory's name>. Its table changed within 1.15 (a task_key column), and an older crewai reading a file
# a newer one wrote fails (JSONDecodeError: CI's crewai floor cell, run after its newest, failed 8 tests so):
# each crewai release the suite runs keeps a directory of its own (also for the README examples' subprocesses).
try:
    os.environ.setdefault("CREWAI_STORAGE_DIR", f"distbrake-tests-crewai-{importlib.metadata.version('crewai')}")
except importlib.metadata.PackageNotFoundError:  # not installed here
    pass


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The long proofs (marked slow) first: with parallel workers, none of them starts last and alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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
