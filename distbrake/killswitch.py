"""The fleet's kill switch as one brake knows it: read in the background, consulted by every check for free.

`brake.block_all()` (`distbrake block --all`) sets one key, `<prefix>:halt-all`
(a Cluster routes it like any key). A brake never reads it inside a check (no
round trip more per check): it is read in the background, at most every
READ_SECONDS while checks happen, and a check tests one attribute, `pending`:

* None: the switch is not set, and no read is due;
* `Stop`: the switch is set: the check raises `LoopBrakeHalt` (halt_rule
  "kill", the operator's who and reason), exempt tools too;
* NOTE: the next check takes the slow path once (it notes that checks happen,
  and starts a read when one is due). Each read sets it again, so one check
  per read takes a lock.

A sync brake's reader is a daemon thread, started by the first check, reading
every READ_SECONDS and pausing after IDLE_SECONDS without a check; `close`
ends it. An asyncio brake keeps no task between reads: a check starts a read
(a short task of its loop) when one is due, and a timer makes the next one
due READ_SECONDS after it; its first read on a loop comes READ_SECONDS after
its first check; `aclose` cancels what is pending.

Staleness, stated: a check never waits for a read; it is judged by the
switch as last read. A worker that keeps checking sees a switch within
READ_SECONDS plus a round trip or two. A read that fails (Redis down) keeps
the last value: a set switch stays in force (until its TTL, counted on the
brake's clock from the read that saw it), an unset one stays unset (and the
checks go to the failure policy anyway). After a pause (a sync reader idle
IDLE_SECONDS, an asyncio brake between checks), the first checks are judged
by the last read until the next read (one round trip later; an asyncio
brake's first read on a loop, READ_SECONDS after its first check). A forked
child starts a reader of its own.

An in-process brake's switch is its own (`block_all` sets it, no reader);
a `FileBrake` reads the streak file's switch itself, at most every
READ_SECONDS (a local read, no round trip), and each of its steps reads it too.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from .model import Halt

if TYPE_CHECKING:  # (asyncio is imported by the asyncio brake only: `distbrake hook` starts without it)
    import asyncio

    from .core import PreparedCall, Verdict

__all__ = ["IDLE_SECONDS", "NOTE", "READ_SECONDS", "AsyncReader", "FileSwitch", "KillSwitch", "Stop", "ThreadReader"]

logger = logging.getLogger("distbrake")

READ_SECONDS = 0.5  # a reader reads the switch at most this often
IDLE_SECONDS = 60.0  # a reader pauses after this long without a check


class Stop(NamedTuple):
    """A set kill switch: its halt, and when it lapses on the brake's monotonic clock (None: never)."""

    halt: Halt
    until: float | None = None

    @property
    def seconds_left(self) -> float | None:
        return None if self.until is None else max(0.0, self.until - time.monotonic())


class _Note:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOTE"


NOTE = _Note()  # `pending` for "the next check takes the slow path once"


def stop_of(halt: Halt | None, ttl_ms: object) -> Stop | None:
    """A read switch (its halt, and the key's PTTL) as a `Stop`; None when it is not set."""
    if halt is None:
        return None
    left = ttl_ms if isinstance(ttl_ms, int) and ttl_ms > 0 else None
    return Stop(halt, None if left is None else time.monotonic() + left / 1000)


def live(stop: Stop | None) -> Stop | None:
    """`stop` unless its TTL ran out on this brake's clock."""
    return stop if stop is not None and (stop.until is None or time.monotonic() < stop.until) else None


def refusal(halt: Halt, call: PreparedCall | Verdict, decided_by: str) -> Exception:
    """The `LoopBrakeHalt` of a check refused by the kill switch."""
    from .core import halt_error

    return halt_error(halt, call.tool_name, call.session_id, call.max_repeats, decided_by)


class KillSwitch:
    """A brake's kill switch: `pending` (see the module's doc), and the slow path of a check, `consult`.

    This base is set and lifted by hand (the in-process brake's `block_all`):
    it has no reader.
    """

    __slots__ = ("__weakref__", "_lock", "decided_by", "pending")

    def __init__(self, decided_by: str) -> None:
        self.pending: Stop | _Note | None = None
        self.decided_by = decided_by
        self._lock = threading.Lock()

    def consult(self, call: PreparedCall | Verdict) -> None:
        """A check's slow path (`pending` is not None): raise `LoopBrakeHalt` while the switch is set."""
        with self._lock:
            self._noted()
            pending = self.pending
            if isinstance(pending, Stop):
                if live(pending) is not None:
                    raise refusal(pending.halt, call, self.decided_by)
                self.pending = self._lapsed()
            elif pending is NOTE:
                self.pending = None

    def _noted(self) -> None:
        """A check came (under the lock)."""

    def _lapsed(self) -> Stop | _Note | None:
        """`pending` once a set switch's TTL ran out on this brake's clock."""
        return None

    def set(self, stop: Stop | None) -> None:
        """The switch as just set, lifted, or read."""
        with self._lock:
            self.pending = stop

    def read_now(self) -> None:
        """Read the switch now, in this thread, for a process that makes one check (`distbrake hook`): its
        check is then judged by this read (and starts no reader). Nothing to read here."""

    def close(self, wait: float = 0.0) -> None:
        """End the reader (the brake's `close`), waiting at most `wait` for a read in flight; this one has none."""

    @property
    def stop(self) -> Stop | None:
        """The switch as last known (set and not lapsed), else None."""
        pending = self.pending
        return live(pending) if isinstance(pending, Stop) else None


class _Reader(KillSwitch):
    """What the sync and async readers share: what a read and a check do to `pending`.

    Each reader started has a number (`_generation`); `stop` ends the current
    one (a later check starts another): a reader whose number is not the
    current one writes nothing and ends.
    """

    __slots__ = ("_generation", "_last_seen", "_read", "_refusal_said", "_running", "_seen")

    def __init__(self, decided_by: str, read: Callable[[], Any]) -> None:
        super().__init__(decided_by)
        self.pending = NOTE
        # One read of the switch: a Stop, or None (a coroutine for AsyncReader): a brake's method, held weakly
        # (a reader never keeps a brake alive: it ends when its brake is gone).
        self._read = weakref.WeakMethod(read)
        self._running = False
        self._seen = False  # a check took the slow path since the last read
        self._last_seen = 0.0
        self._generation = 0
        self._refusal_said = False

    def _noted(self) -> None:
        self._seen = True
        if not self._running:
            self._running = True
            self._last_seen = time.monotonic()
            self._generation += 1
            self._start(self._generation)

    _keeps_running = False  # after a read: the async reader is still "running" until its next read is due

    def _lapsed(self) -> Stop | _Note | None:
        return NOTE

    def set(self, stop: Stop | None) -> None:
        with self._lock:
            self.pending = NOTE if stop is None else stop  # None is for a running reader to say

    def _start(self, generation: int) -> None:
        raise NotImplementedError

    def _stop(self) -> None:
        """End the current reader (under the lock); the next check starts another."""
        self._generation += 1
        self._running = False
        if not isinstance(self.pending, Stop):
            self.pending = NOTE

    def read_done(self, stop: Stop | None, failed: bool, generation: int) -> bool:
        """Apply one read (a failed one keeps the last value); False when the reader should end."""
        now = time.monotonic()
        with self._lock:
            if generation != self._generation:  # stopped meanwhile: another reader (or none) is current
                return False
            if self._seen or self.pending is None:  # a check came since the last read
                self._last_seen = now
            self._seen = False
            if failed:
                stop = self.pending if isinstance(self.pending, Stop) else None
            self.pending = NOTE if stop is None else stop
            going = now - self._last_seen < IDLE_SECONDS
            self._running = going or self._keeps_running
            return going

    def read_failed(self, error: BaseException) -> None:
        """A read that failed: an outage is the failure policy's news (DEBUG here); a refusal is said once."""
        from .redis_errors import is_refusal  # the one classifier of Redis errors

        if is_refusal(error) and not self._refusal_said:
            self._refusal_said = True
            logger.warning(
                "distbrake: the kill switch (block --all) cannot be read: the Redis user may not run GET on the "
                "<prefix>:halt-all key (grant +get); checks go on, but an operator's block --all will not stop them"
            )
            return
        logger.debug("distbrake: the kill switch was not read (%s); the last value holds", type(error).__name__)


_readers: weakref.WeakSet[ThreadReader] = weakref.WeakSet()


def _after_fork() -> None:
    for reader in list(_readers):
        reader.forked()


os.register_at_fork(after_in_child=_after_fork)


class ThreadReader(_Reader):
    """A sync brake's switch: a daemon thread reads it (`read()` -> Stop | None, blocking)."""

    __slots__ = ("_thread", "_wake")

    def __init__(self, decided_by: str, read: Callable[[], Stop | None]) -> None:
        super().__init__(decided_by, read)
        self._wake = threading.Event()  # set by close: the current thread ends at once
        self._thread: threading.Thread | None = None  # the current reader
        _readers.add(self)

    def _start(self, generation: int) -> None:
        self._wake = wake = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(generation, wake), name="distbrake-kill-switch", daemon=True)
        self._thread.start()

    def read_now(self) -> None:
        with self._lock:
            generation = self._generation
        self._once(generation)
        with self._lock:
            if self.pending is NOTE and generation == self._generation:
                self.pending = None  # known now: this process's check starts no reader
                self._running = True  # (none runs: the next read is this process's next read_now)

    def _once(self, generation: int) -> bool:
        read = self._read()
        if read is None:  # the brake is gone
            return False
        try:
            stop = read()
        except Exception as error:
            self.read_failed(error)
            return self.read_done(None, True, generation)
        return self.read_done(stop, False, generation)

    def _run(self, generation: int, wake: threading.Event) -> None:
        while self._once(generation) and not wake.wait(READ_SECONDS):
            pass

    def close(self, wait: float = 0.0) -> None:
        """End the reader (the brake's `close`): a read in flight is given `wait` seconds to end (the brake then
        closes its connections: none is left half-used)."""
        with self._lock:
            self._stop()
            self._wake.set()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread() and thread.is_alive():
            thread.join(wait)

    def forked(self) -> None:
        """In a forked child: no reader runs here (the parent's thread was not copied)."""
        self._lock = threading.Lock()
        self._stop()


class AsyncReader(_Reader):
    """An asyncio brake's switch, read by the checks' own event loop (`read()` is a coroutine function).

    No task lives between reads (a loop a host closes by hand leaves nothing
    pending but a timer): a check that takes the slow path when a read is due
    starts one (a short task: one GET and PTTL), and READ_SECONDS after a read
    ends a timer makes the next one due. So reads happen only while checks
    do, each started by a check, at most every READ_SECONDS. The first read
    of a brake on a loop is due READ_SECONDS after its first check (a loop
    run for one short call never gets a read in flight when it ends).
    """

    __slots__ = ("_fresh", "_task", "_timer")
    _keeps_running = True

    def __init__(self, decided_by: str, read: Callable[[], Awaitable[Stop | None]]) -> None:
        super().__init__(decided_by, read)
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._fresh = True  # no read yet on this loop

    def _start(self, generation: int) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        if self._fresh:  # the first read is due READ_SECONDS after the first check (and a check starts it)
            self._fresh = False
            self._timer = loop.call_later(READ_SECONDS, self._due, generation)
        else:
            self._task = loop.create_task(self._run(generation), name="distbrake-kill-switch")

    async def _run(self, generation: int) -> None:
        """One read; then, READ_SECONDS later, the next check starts the next one (`_due`)."""
        import asyncio

        await self._once(generation)
        with self._lock:
            if generation == self._generation:
                self._task = None
                self._timer = asyncio.get_running_loop().call_later(READ_SECONDS, self._due, generation)

    def _due(self, generation: int) -> None:
        with self._lock:
            if generation == self._generation:
                self._timer, self._running = None, False
                if not isinstance(self.pending, Stop):
                    self.pending = NOTE

    async def _once(self, generation: int) -> bool:
        """One read (its frame holds the brake only while it reads)."""
        read = self._read()
        if read is None:  # the brake is gone
            return False
        try:
            stop = await read()
        except Exception as error:
            self.read_failed(error)
            return self.read_done(None, True, generation)
        return self.read_done(stop, False, generation)

    def _drop(self) -> asyncio.Task[None] | None:
        """Stop the current reader (under the lock): its timer cancelled; its read in flight, returned."""
        self._stop()
        if self._timer is not None:
            self._timer.cancel()
        task, self._task, self._timer = self._task, None, None
        return task

    def moved(self) -> None:
        """The brake moved to another event loop: the old loop's read is gone; the next check starts one."""
        with self._lock:
            self._drop()
            self._fresh = True

    async def aclose(self, wait: float) -> None:
        """End the reader (the brake's `aclose`): a read in flight on this loop is given `wait` seconds to end
        (a read cancelled inside the client may leave its connection open), then cancelled."""
        import asyncio
        import contextlib

        with self._lock:
            task = self._drop()
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), wait)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class FileSwitch(KillSwitch):
    """A `FileBrake`'s switch: every check takes the slow path, which reads the file at most every READ_SECONDS."""

    __slots__ = ("_next", "_read", "_stop")

    def __init__(self, decided_by: str, read: Callable[[], Stop | None]) -> None:
        super().__init__(decided_by)
        self.pending = NOTE
        self._read = read
        self._next = 0.0
        self._stop: Stop | None = None

    def consult(self, call: PreparedCall | Verdict) -> None:
        now = time.monotonic()
        if now >= self._next:
            self._stop, self._next = self._read(), now + READ_SECONDS
        stop = live(self._stop)
        if stop is not None:
            raise refusal(stop.halt, call, self.decided_by)

    def set(self, stop: Stop | None) -> None:
        self._stop, self._next = stop, time.monotonic() + READ_SECONDS

    def read_now(self) -> None:
        self.set(self._read())
