"""What the fault tests share: brakes on explicit URLs, a server of the test's own behind a fault proxy, outcomes.

Registered as a plugin in `tests/conftest.py`, so its fixtures (`make`,
`server`, `proxy`) serve every fault-themed module.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from distbrake import (
    AsyncDistributedBrake,
    BrakeSettings,
    BrakeUnavailableError,
    DistributedBrake,
    LoopBrakeError,
    Verdict,
)
from tests.backends import Checker
from tests.fault_proxy import FaultProxy
from tests.servers import RedisServer

FLAVOURS = ["sync", "async"]
POLICIES = ["open", "closed", "local"]
# What decides a check under each failure policy while Redis is down (`Verdict.decided_by`).
DECIDED_BY_POLICY = {"local": "fallback", "open": "fail-open"}

# How long a recovery may take before the test fails (an upper bound, never a target).
RECOVERY_DEADLINE = 15.0


def build(flavour: str, url: str, **options: Any) -> Checker:
    """A sync or asyncio brake on `url`, behind the coroutine face of `tests.backends.Checker`."""
    settings = BrakeSettings.model_validate(options)
    if flavour == "sync":
        return Checker(DistributedBrake.from_url(url, settings=settings))
    return Checker(AsyncDistributedBrake.from_url(url, settings=settings))


BrakeFactory = Callable[..., Checker]


@pytest.fixture
async def make() -> AsyncIterator[BrakeFactory]:
    """`make(flavour, url, **settings)`; every brake made is closed after the test."""
    made: list[Checker] = []

    def factory(flavour: str, url: str, **options: Any) -> Checker:
        checker = build(flavour, url, **options)
        made.append(checker)
        return checker

    yield factory
    for checker in made:
        await checker.close()


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A redis-server of this test's own (tests here kill and restart it)."""
    with RedisServer(name="faults") as srv:
        yield srv


@pytest.fixture
def proxy(server: RedisServer) -> Iterator[FaultProxy]:
    with FaultProxy(server.address) as fault_proxy:
        yield fault_proxy


async def outcome(brake: Checker, tool: str, args: Any, **kw: Any) -> tuple[str, int]:
    """(decided_by or "denied" or "unavailable", count) of one check."""
    try:
        verdict = await brake.check(tool, args, **kw)
    except LoopBrakeError as error:
        return "denied", error.count
    except BrakeUnavailableError:
        return "unavailable", 0
    return verdict.decided_by, verdict.count


async def until_redis(brake: Checker, session: str, deadline: float = RECOVERY_DEADLINE) -> Verdict:
    """Check (new arguments each time, so nothing is denied) until Redis decides; bounded."""
    end = time.monotonic() + deadline
    attempt = 0
    last = "nothing yet"
    while time.monotonic() < end:
        attempt += 1
        try:
            verdict = await brake.check("probe", {"attempt": attempt}, session_id=session)
        except BrakeUnavailableError as error:
            last = repr(error)
        else:
            if verdict.decided_by == "redis":
                return verdict
            last = verdict.decided_by
        await asyncio.sleep(0.01)
    raise AssertionError(f"Redis never decided a check again within {deadline}s (last: {last})")


