"""The one backend matrix: every kind of brake the behaviour tests run on, and the factory that builds them."""

# A kind is "loop" (the in-process LoopBrake, no store) or FACE-STORE: FACE is
# "sync" (DistributedBrake) or "async" (AsyncDistributedBrake), STORE is
# "memory" (the embedded backend), "redis" (the suite's real single node) or
# "cluster" (the suite's real 3-master cluster). ALL_BRAKES is the one list;
# every narrower list below is a filter of it, never written again.
#
# `Checker` gives every brake one coroutine face, so that each behaviour test
# is written once and `await`s whatever brake is underneath.

from __future__ import annotations

import functools
import inspect
import itertools
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pytest
from pytest import ParameterSet

from distbrake import AsyncDistributedBrake, DistributedBrake, LoopBrake, LoopBrakeError, SessionState, Verdict

AnyBrake = LoopBrake | DistributedBrake | AsyncDistributedBrake

ALL_BRAKES = [
    pytest.param(kind, id=kind)
    for kind in (
        "loop",
        "sync-memory",
        "async-memory",
        "sync-redis",
        "async-redis",
        "sync-cluster",
        "async-cluster",
    )
]


def face(kind: str) -> str:
    """``"loop"``, ``"sync"`` or ``"async"``."""
    return kind.partition("-")[0]


def store(kind: str) -> str | None:
    """``"memory"``, ``"redis"``, ``"cluster"``, or None for the in-process brake."""
    return kind.partition("-")[2] or None


def where(params: Iterable[ParameterSet], keep: Callable[[str], bool]) -> list[ParameterSet]:
    """The kinds of ``params`` that ``keep`` accepts (ids and marks unchanged)."""
    return [param for param in params if keep(str(param.values[0]))]


# The framework adapters: each face, on each store but the cluster (the rules run there).
ADAPTER_BRAKES = where(ALL_BRAKES, lambda kind: store(kind) != "cluster")
# What a synchronous run (run_sync, invoke) can call: no async face.
SYNC_ADAPTER_BRAKES = where(ADAPTER_BRAKES, lambda kind: face(kind) != "async")
# Both distributed faces on the real single node (several workers sharing one Redis).
REDIS_BRAKES = where(ALL_BRAKES, lambda kind: store(kind) == "redis")

# The fixture (in conftest.py) giving each store's URL, flushed before the test.
STORE_FIXTURES = {"redis": "redis_url", "cluster": "cluster_url"}

_names = itertools.count()


def memory_url() -> str:
    """A fresh embedded backend (fakeredis) nobody else uses."""
    return f"memory://test-{next(_names)}-{uuid.uuid4().hex[:6]}"


class Brakes:
    """``brakes(kind, url=None, **options)`` builds a brake of ``kind`` for one test; :meth:`close`
    closes every one it built.

    Without ``url`` a distributed brake is on the test's own backend of its store: one embedded
    store for the whole test ("memory"), or the suite's real server ("redis", "cluster").

    A brake gets a 5 s timeout unless the test gives one (a test about time gives its own): on a
    busy machine a check can take longer than the default 0.5 s and fall to the failure policy (a
    fresh in-process streak), and a sync Cluster brake's first use waits for its client at most
    0.9 of it (at 0.45 s, `inspect` on a loaded machine raised "the client was not built").
    """

    TIMEOUT = 5.0

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self._request = request
        self._memory = memory_url()
        self.made: list[AnyBrake] = []

    def url(self, kind: str) -> str | None:
        """Where brakes of ``kind`` go by default (None for the in-process brake)."""
        where_to = store(kind)
        if where_to is None:
            return None
        if where_to == "memory":
            return self._memory
        return str(self._request.getfixturevalue(STORE_FIXTURES[where_to]))

    def __call__(self, kind: str, url: str | None = None, **options: Any) -> AnyBrake:
        brake: AnyBrake
        if face(kind) == "loop":
            brake = LoopBrake(**options)
        else:
            options.setdefault("timeout_seconds", self.TIMEOUT)
            cls = DistributedBrake if face(kind) == "sync" else AsyncDistributedBrake
            brake = cls.from_url(url or str(self.url(kind)), **options)
        self.made.append(brake)
        return brake

    def of(self, kind: str) -> Callable[..., AnyBrake]:
        """``make(**options)``: brakes of one kind, all on one backend (looked up now, before the test)."""
        return functools.partial(self, kind, self.url(kind))

    async def close(self) -> None:
        await close_brakes(self.made)


class Checker:
    """Any brake behind coroutine methods: tests ``await`` them whatever the brake underneath."""

    def __init__(self, brake: Any) -> None:
        self.brake = brake

    async def _maybe(self, value: Any) -> Any:
        return await value if inspect.isawaitable(value) else value

    async def check(self, tool: str, args: Any, **kw: Any) -> Verdict:
        return await self._maybe(self.brake.check(tool, args, **kw))  # type: ignore[no-any-return]

    async def count(self, tool: str, args: Any, **kw: Any) -> int:
        """The count this call got, allowed or denied (-count when denied)."""
        try:
            return (await self.check(tool, args, **kw)).count
        except LoopBrakeError as error:
            return -error.count

    async def inspect(self, session_id: str) -> SessionState | None:
        return await self._maybe(self.brake.inspect(session_id))  # type: ignore[no-any-return]

    async def clear(self, session_id: str) -> bool:
        return bool(await self._maybe(self.brake.clear(session_id)))

    async def sessions(self, match: str | None = None) -> list[SessionState]:
        found = self.brake.sessions(match)
        if hasattr(found, "__aiter__"):
            return [state async for state in found]
        return list(found)

    async def close(self) -> None:
        closer = getattr(self.brake, "aclose", None) or getattr(self.brake, "close", None)
        if closer is not None:
            await self._maybe(closer())


async def close_brakes(brakes: list[Any]) -> None:
    """Close every brake a test made (sync `close()`, async `aclose()`, none for LoopBrake)."""
    for brake in brakes:
        await Checker(brake).close()


async def inspect_count(brake: Any, session_id: str) -> int | None:
    """The streak count of ``session_id``, or None when the brake holds no such session."""
    state = await Checker(brake).inspect(session_id)
    return None if state is None else int(state.count)


async def session_names(brake: Any) -> list[str]:
    """The ids of every session the brake holds, sorted."""
    return sorted(state.session_id for state in await Checker(brake).sessions())


def next_answer(answers: Iterator[Any]) -> Any:
    """A scripted tool's next answer: an exception is raised, anything else returned (the adapters' pollers)."""
    answer = next(answers)
    if isinstance(answer, BaseException):
        raise answer
    return answer
