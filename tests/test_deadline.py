"""`LazyDeadline`: the asyncio brake's deadlines, one timer for many bounds, with asyncio.timeout's semantics."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from distbrake.redis.deadline import LazyDeadline


async def never() -> None:
    await asyncio.get_running_loop().create_future()


async def test_a_bound_whose_deadline_passes_raises_timeout_error() -> None:
    deadline = LazyDeadline()
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        with deadline.bound(loop.time() + 0.02):
            await never()
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]  # our cancellation taken back
    assert not deadline.active


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    deadline = LazyDeadline()
    loop = asyncio.get_running_loop()

    async def bounded() -> None:
        with deadline.bound(loop.time() + 60):
            await never()

    task = asyncio.create_task(bounded())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not deadline.active


async def test_an_outer_timeout_that_expires_first_is_the_callers_own() -> None:
    deadline = LazyDeadline()
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.02) as outer:
            with deadline.bound(loop.time() + 60):
                await never()
    assert outer.expired()  # the caller's timeout raised it, not the bound
    assert not deadline.active


async def test_a_bound_that_ended_is_never_cancelled_later() -> None:
    deadline = LazyDeadline()
    loop = asyncio.get_running_loop()
    with deadline.bound(loop.time() + 0.01):
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)  # past the deadline of the bound that ended: the timer fires on nothing
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_each_bound_gets_its_own_deadline_when_they_overlap() -> None:
    deadline = LazyDeadline()
    loop = asyncio.get_running_loop()
    ended: list[str] = []

    async def bounded(name: str, seconds: float) -> None:
        try:
            with deadline.bound(loop.time() + seconds):
                await never()
        except TimeoutError:
            ended.append(name)

    late = asyncio.create_task(bounded("late", 0.2))
    await asyncio.sleep(0)
    early = asyncio.create_task(bounded("early", 0.02))  # earlier than the timer set for "late": moves it
    await early
    assert ended == ["early"] and not late.done()  # the timer, set again, still watches "late"
    await late
    assert ended == ["early", "late"]


async def test_many_bounds_in_a_row_share_one_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    deadline = LazyDeadline()
    loop = asyncio.get_running_loop()
    timers: list[float] = []
    call_at = loop.call_at

    def counted(when: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        timers.append(when)
        return call_at(when, callback, *args)

    monkeypatch.setattr(loop, "call_at", counted)
    for _ in range(1000):
        with deadline.bound(loop.time() + 30):
            await asyncio.sleep(0)
    assert len(timers) == 1  # each later deadline is after the timer's: it is left where it is


def test_a_bound_outside_a_task_is_refused() -> None:
    with pytest.raises(RuntimeError, match="no running event loop"):
        LazyDeadline().bound(0.0)
    loop = asyncio.new_event_loop()
    try:
        refused: list[BaseException] = []

        def in_a_callback() -> None:  # a running loop, but no task
            try:
                LazyDeadline().bound(0.0)
            except RuntimeError as error:
                refused.append(error)
            loop.stop()

        loop.call_soon(in_a_callback)
        loop.run_forever()
    finally:
        loop.close()
    assert "no task" in str(refused[0])


def test_a_deadline_used_again_on_a_new_loop_still_bounds() -> None:
    """A timer of an ended loop never fires: the first bound on the next loop sets a timer there."""
    deadline = LazyDeadline()

    async def bounded(seconds: float) -> str:
        try:
            with deadline.bound(asyncio.get_running_loop().time() + seconds):
                await never()
        except TimeoutError:
            return "bounded"
        return "returned"

    async def watched(seconds: float) -> str:
        try:
            return await asyncio.wait_for(bounded(seconds), timeout=5)
        except TimeoutError:
            return "unbounded"  # before the fix: the old loop's timer seemed earlier, so none was set

    async def quick() -> None:  # ends at once: its loop ends with the timer still set, for later
        with deadline.bound(asyncio.get_running_loop().time() + 0.02):
            await asyncio.sleep(0)

    asyncio.run(quick())
    assert asyncio.run(watched(0.05)) == "bounded"
