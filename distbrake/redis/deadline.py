"""Deadlines for the asyncio brake's awaits, at the price of one timer per timeout, not one per await.

`asyncio.timeout_at` schedules a timer when its block starts and cancels it
when the block ends: about 10 µs per check when one task checks at a time.
`LazyDeadline.bound` keeps one timer for every bound of one event loop and
moves it only when a new deadline comes before it; a timer that fires early
(its bound has ended, or a later one runs) is set again for the nearest
deadline still bounded. A bound whose deadline passes has its task cancelled,
and the block raises `TimeoutError`, as `asyncio.timeout_at` would; a
cancellation from anyone else stays a cancellation.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

__all__ = ["LazyDeadline"]


class _Bound:
    """One block bounded by `when` (the loop's clock), in `task`."""

    __slots__ = ("cancelling", "expired", "owner", "task", "when")

    def __init__(self, owner: LazyDeadline, task: asyncio.Task[object], when: float) -> None:
        self.owner = owner
        self.task = task
        self.when = when
        self.cancelling = task.cancelling()
        self.expired = False

    def __enter__(self) -> None:
        self.owner.enter(self)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None,
    ) -> None:
        self.owner.active.discard(self)
        # Our cancellation is taken back (uncancel, first), and is a TimeoutError unless another is pending too.
        if self.expired and self.task.uncancel() <= self.cancelling and kind is asyncio.CancelledError:
            raise TimeoutError from error


class LazyDeadline:
    """The deadlines of one event loop's bounded blocks, watched by one timer."""

    def __init__(self) -> None:
        self.active: set[_Bound] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's (an ended loop's never fires)

    def bound(self, when: float) -> _Bound:
        """A `with` block of the running task that raises `TimeoutError` once the loop's clock reaches `when`."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a deadline bounds a task's block: no task is running")
        return _Bound(self, task, when)

    def enter(self, bound: _Bound) -> None:
        self.active.add(bound)
        timer, loop = self._timer, asyncio.get_running_loop()
        if timer is None or timer.when() > bound.when or self._loop is not loop:
            if timer is not None:
                timer.cancel()
            self._timer, self._loop = loop.call_at(bound.when, self._fire, bound.when), loop

    def _fire(self, at: float) -> None:
        self._timer = None
        nearest = None
        for bound in list(self.active):
            if bound.expired:
                continue
            if bound.when <= at:  # the loop runs a timer once its time has come
                bound.expired = True
                bound.task.cancel()
            elif nearest is None or bound.when < nearest:
                nearest = bound.when
        if nearest is not None:
            self._timer = asyncio.get_running_loop().call_at(nearest, self._fire, nearest)
