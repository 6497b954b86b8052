"""The server's streak-file steps: the checks that arrive together share one SQLite transaction.

A `FileBrake` check is a few statements and a commit (about 0.1 ms), so a
server that handed each check to a thread of its own would spend more on the
hand-off than on the check. Instead one worker thread takes every check waiting
in the queue, steps them all in one transaction (`StreakFile.step_many`: one
lock, one commit, each check counted exactly as alone and in arrival order), and
hands each result back to its request on the event loop. The loop never blocks
on the file; the file's lock wait (the brake's timeout) bounds each batch.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any

from ..core import PreparedCall
from ..model import Cycle, CycleRule
from ..streakfile import StreakFile

__all__ = ["StepQueue"]

MAX_BATCH = 256
Counted = tuple[int, bool, Cycle | None]
_Item = tuple[PreparedCall, "asyncio.Future[Counted]", asyncio.AbstractEventLoop]


class StepQueue:
    """Steps `PreparedCall`s in `store`, batched by one worker thread (started on first use)."""

    def __init__(self, store: StreakFile, cycles: CycleRule | None) -> None:
        self.store, self.cycles = store, cycles
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()

    async def step(self, call: PreparedCall) -> Counted:
        """(count, replayed, cycle) of `call`, as `StreakFile.step` gives it."""
        if self._thread is None:
            with self._start:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._work, name="distbrake-steps", daemon=True)
                    self._thread.start()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Counted] = loop.create_future()
        self._queue.put((call, future, loop))
        return await future

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < MAX_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)  # stop after this batch
                    break
                batch.append(item)
            try:
                results: list[Any] = self.store.step_many(
                    [(c.session_id, c.digest, c.call_id, c.tool_name, c.rules) for c, _, _ in batch], self.cycles
                )
            except Exception as error:  # the file failed (locked past the timeout, unwritable): the whole batch
                for _, future, loop in batch:
                    loop.call_soon_threadsafe(_fail, future, error)
                continue
            for (_, future, loop), result in zip(batch, results, strict=True):
                loop.call_soon_threadsafe(_done, future, result)


def _done(future: asyncio.Future[Counted], result: Counted) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Counted], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
