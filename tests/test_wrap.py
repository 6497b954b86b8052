"""Wrappers, the decorator, copies of definitions, session binding, thread safety."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
from typing import Any

import pytest

from distbrake import (
    AsyncDistributedBrake,
    DistributedBrake,
    LoopBrake,
    LoopBrakeError,
    bind_session,
    decorate_tool,
    wrap_execute,
)
from tests.backends import memory_url


def test_wrap_execute_sync_keeps_signature_and_never_runs_body_on_denial() -> None:
    ran: list[Any] = []

    def execute(args: dict[str, Any], context: Any = None) -> str:
        """Search the web."""
        ran.append(args)
        return "ok"

    braked = wrap_execute(execute, LoopBrake(), tool="search")
    assert braked.__name__ == "execute" and braked.__doc__ == "Search the web."
    assert inspect.signature(braked) == inspect.signature(execute)
    assert not inspect.iscoroutinefunction(braked)
    assert braked({"q": "w"}) == "ok" and braked({"q": "w"}) == "ok"
    with pytest.raises(LoopBrakeError):
        braked({"q": "w"})
    assert len(ran) == 2


async def test_wrap_execute_async_stays_async() -> None:
    ran = 0

    async def execute(args: dict[str, Any], context: Any = None) -> str:
        nonlocal ran
        ran += 1
        return "ok"

    for brake in (LoopBrake(), DistributedBrake.from_url(memory_url()),
                  AsyncDistributedBrake.from_url(memory_url())):
        ran = 0
        braked = wrap_execute(execute, brake, tool="search")
        assert inspect.iscoroutinefunction(braked)
        assert await braked({"q": 1}, {"session_id": "s"}) == "ok"
        assert await braked({"q": 1}, context={"session_id": "s"}) == "ok"
        with pytest.raises(LoopBrakeError):
            await braked({"q": 1}, {"session_id": "s"})
        assert await braked({"q": 1}, {"session_id": "other"}) == "ok"
        assert ran == 3


def test_sync_tool_with_async_brake_is_refused_at_wrap_time() -> None:
    def execute(args: Any) -> None:
        return None

    with pytest.raises(TypeError, match="async"):
        wrap_execute(execute, AsyncDistributedBrake.from_url(memory_url()), tool="t")


def test_guard_decorator_on_functions_and_methods() -> None:
    brake = LoopBrake()
    calls: list[str] = []

    @brake.guard("lookup")
    def lookup(q: str, limit: int = 10) -> str:
        calls.append(q)
        return q

    lookup("a")
    lookup(q="a", limit=10)  # same call: defaults applied, keywords bound
    with pytest.raises(LoopBrakeError) as caught:
        lookup("a", 10)
    assert caught.value.tool_name == "lookup" and calls == ["a", "a"]

    class Agent:
        def __init__(self, name: str) -> None:
            self.name = name

        @brake.guard
        def fetch(self, url: str, context: Any = None) -> str:
            return url

    first, second = Agent("1"), Agent("2")
    first.fetch("u", context={"session_id": "m"})
    second.fetch("u", context={"session_id": "m"})  # self is not part of the call
    with pytest.raises(LoopBrakeError) as caught:
        first.fetch("u", context={"session_id": "m"})
    assert caught.value.tool_name == "fetch" and caught.value.session_id == "m"


async def test_guard_async_function() -> None:
    brake = AsyncDistributedBrake.from_url(memory_url(), max_repeats=2)

    @brake.guard("ask", session_id="fixed")
    async def ask(question: str) -> str:
        return question

    assert await ask("x") == "x"
    with pytest.raises(LoopBrakeError) as caught:
        await ask("x")
    assert caught.value.session_id == "fixed"


def test_decorate_tool_returns_a_copy_and_leaves_the_original() -> None:
    def execute(args: Any, context: Any = None) -> str:
        return "ran"

    @dataclasses.dataclass(frozen=True)
    class Tool:
        name: str
        execute: Any
        description: str = ""

    class Plain:
        def __init__(self) -> None:
            self.name, self.execute = "plain", execute

    brake = LoopBrake(max_repeats=2)
    for definition in ({"name": "search", "execute": execute, "extra": 1},
                       Tool("search", execute, "d"), Plain()):
        braked = decorate_tool(definition, brake)
        assert braked is not definition
        original = definition["execute"] if isinstance(definition, dict) else definition.execute
        assert original is execute
        new_execute = braked["execute"] if isinstance(braked, dict) else braked.execute
        assert new_execute({"a": 1}, {"session_id": str(id(definition))}) == "ran"
        with pytest.raises(LoopBrakeError):
            new_execute({"a": 1}, {"session_id": str(id(definition))})
    with pytest.raises(TypeError):
        decorate_tool({"name": "x"}, brake)


def test_wrapping_twice_does_not_halve_the_limit() -> None:
    ran = 0

    def execute(args: Any, context: Any = None) -> None:
        nonlocal ran
        ran += 1

    brake = LoopBrake()
    once = wrap_execute(execute, brake, tool="t")
    assert wrap_execute(once, brake, tool="t") is once
    # A different wrapper layer around the braked one (e.g. another seam) still counts once.
    def outer(args: Any, context: Any = None) -> None:
        once(args, context)

    twice = wrap_execute(outer, brake, tool="t")
    twice({"x": 1})
    twice({"x": 1})
    with pytest.raises(LoopBrakeError) as caught:
        twice({"x": 1})
    assert caught.value.count == 3 and ran == 2


async def test_bind_session_is_task_local() -> None:
    brake = LoopBrake()

    async def agent(name: str) -> list[int]:
        counts = []
        with bind_session(name):
            for _ in range(2):
                counts.append(brake.check("t", 1).count)
                await asyncio.sleep(0)
        return counts

    results = await asyncio.gather(*(agent(f"a{i}") for i in range(5)))
    assert results == [[1, 2]] * 5
    assert brake.check("t", 1).session_id == "default"
    with brake.session("explicit") as bound:
        assert bound == "explicit"
        assert brake.check("t", 1).session_id == "explicit"
        assert brake.check("t", 1, session_id="arg").session_id == "arg"


def test_threads_get_exact_counts() -> None:
    brake = LoopBrake(max_repeats=10**9)
    counts: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker() -> None:
        barrier.wait()
        mine = [brake.check("t", {"same": True}, session_id="s").count for _ in range(500)]
        with lock:
            counts.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(counts) == list(range(1, 4001))


async def test_asyncio_tasks_get_exact_counts() -> None:
    brake = LoopBrake(max_repeats=10**9)

    async def one() -> int:
        await asyncio.sleep(0)
        return brake.check("t", 1, session_id="s").count

    counts = await asyncio.gather(*(one() for _ in range(1000)))
    assert sorted(counts) == list(range(1, 1001))


def test_loop_brake_forgets_idle_sessions_and_stays_bounded() -> None:
    now = [0.0]
    brake = LoopBrake(ttl_seconds=10, clock=lambda: now[0])
    for i in range(1000):
        brake.check("t", 1, session_id=f"s{i}")
    assert brake.inspect("s0") is not None
    now[0] = 11.0
    brake.check("t", 1, session_id="fresh")
    assert brake.inspect("s0") is None and len(list(brake.sessions())) == 1
    assert brake.check("t", 1, session_id="s5").count == 1  # expired: starts from nothing
    for _ in range(1000):  # one slot per session however long it runs
        brake.check("t", {"n": _}, session_id="long")
    assert len(list(brake.sessions())) == 3
    brake.reset()
    assert list(brake.sessions()) == []
