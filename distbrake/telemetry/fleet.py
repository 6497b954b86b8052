"""The fleet view in Redis: denials, halts and warnings per tool per minute, under the brake's key prefix.

Written only when a check is denied, halted or warned, in the background (a sync
brake's writer thread, an async brake's task), gathered over half a second
into one pipeline: never blocking or failing the check, at most two writes a
second per brake. One hash per minute, `<prefix>:fleet:<unix minute>`, field
`d:<tool>` (denied), `h:<tool>` (refused with LoopBrakeHalt) or `w:<tool>` (warned), each write an HINCRBY plus a
PEXPIRE of that one key (Cluster-safe: never a multi-key command), kept
`RETENTION_MINUTES`. No session id, argument or hash is ever written. Read by
`distbrake stats` and `distbrake top` (`read_minutes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Literal

from .recorder import OTHER_TOOL, TOOL_CHARS

__all__ = [
    "FLEET_TOOLS",
    "NOTED",
    "RETENTION_MINUTES",
    "AsyncFleetWriter",
    "FleetWriter",
    "Tally",
    "fleet_key",
    "parse_minute",
    "read_minutes",
]

logger = logging.getLogger("distbrake")

RETENTION_MINUTES = 60
MAX_QUEUED = 10_000  # notes waiting for the writer, at most (further ones are dropped)
GATHER_SECONDS = 0.5  # a writer gathers the notes of this long into one pipeline (at most 2 writes a second)
FLEET_TOOLS = 256  # distinct tools a brake writes per minute; further ones are counted under OTHER_TOOL
Noted = Literal["d", "w", "h"]  # what a field counts: denied, warned or halted checks
NOTED: tuple[Noted, ...] = ("d", "w", "h")
_Tally = Counter[tuple[int, str]]  # (minute, field) -> count


def fleet_key(prefix: str, minute: int) -> str:
    return f"{prefix}:fleet:{minute}"


def _field(noted: Noted, tool: str) -> str:
    return f"{noted}:{tool[:TOOL_CHARS]}"


def _queue_writes(pipe: Any, prefix: str, tally: _Tally) -> Any:
    keys = set()
    for (minute, field), count in tally.items():
        key = fleet_key(prefix, minute)
        pipe.hincrby(key, field, count)
        keys.add(key)
    for key in keys:
        pipe.pexpire(key, RETENTION_MINUTES * 60_000)
    return pipe


class _Writer:
    """What both writers share: a bounded set of tools per minute, and a refusal said once per writer."""

    def __init__(self) -> None:
        self._refusal_said = False
        self._minute = 0
        self._tools: set[str] = set()

    def _field(self, noted: Noted, tool: str) -> tuple[int, str]:
        """(minute, field) of a note: a tool past the minute's FLEET_TOOLS is counted as OTHER_TOOL."""
        minute = int(time.time() // 60)
        if minute != self._minute:
            self._minute, self._tools = minute, set()
        tools = self._tools
        if tool not in tools:
            if len(tools) >= FLEET_TOOLS:
                tool = OTHER_TOOL
            else:
                tools.add(tool)
        return minute, _field(noted, tool)

    def _write_failed(self, error: BaseException) -> None:
        """A write that failed: an outage is the failure policy's news (DEBUG here); a refusal is said once."""
        from ..redis_errors import is_refusal  # the one classifier of Redis errors

        if is_refusal(error):
            if not self._refusal_said:
                self._refusal_said = True
                logger.warning(
                    "distbrake: the fleet view is not written: the Redis user may not run HINCRBY and PEXPIRE "
                    "on the <prefix>:fleet:* keys (grant +hincrby; distbrake stats and top also need "
                    "+hgetall); checks are not affected"
                )
            return
        logger.debug("distbrake: the fleet view's counters were not written (%s)", type(error).__name__)


class FleetWriter(_Writer):
    """A sync brake's writer: notes go on a bounded queue, a daemon thread writes them in batches."""

    def __init__(self, client: Callable[[], Any], prefix: str) -> None:
        super().__init__()
        self._client = client
        self._prefix = prefix
        self._queue: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._lock = threading.Lock()
        self._idle = threading.Condition()
        self._unwritten = 0  # notes queued or being written

    def note(self, noted: Noted, tool: str) -> None:
        if self._queue.qsize() >= MAX_QUEUED:
            return
        with self._idle:
            self._unwritten += 1
            field = self._field(noted, tool)
        self._queue.put(field)
        thread = self._thread
        if thread is None or self._pid != os.getpid() or not thread.is_alive():
            self._start()

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None and self._pid == os.getpid() and self._thread.is_alive():
                return
            self._pid = os.getpid()
            self._thread = threading.Thread(target=self._run, name="distbrake-fleet", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            tally: _Tally = Counter([self._queue.get()])
            end = time.monotonic() + GATHER_SECONDS
            while (left := end - time.monotonic()) > 0:
                try:
                    tally[self._queue.get(timeout=left)] += 1
                except queue.Empty:
                    break
            try:
                _queue_writes(self._client().pipeline(transaction=False), self._prefix, tally).execute()
            except Exception as error:
                self._write_failed(error)
            with self._idle:
                self._unwritten -= sum(tally.values())
                self._idle.notify_all()

    def flush(self, timeout: float = 2.0) -> None:
        """Wait, at most `timeout`, until every note so far is written (or failed): `close()` does."""
        with self._idle:
            self._idle.wait_for(lambda: self._unwritten <= 0, timeout)


class AsyncFleetWriter(_Writer):
    """An async brake's writer: notes are tallied, one task of the running loop writes them."""

    def __init__(self, client: Callable[[], Any], prefix: str) -> None:
        super().__init__()
        self._client = client
        self._prefix = prefix
        self._tally: _Tally = Counter()
        self._task: asyncio.Task[None] | None = None

    def note(self, noted: Noted, tool: str) -> None:
        if len(self._tally) >= MAX_QUEUED:
            return
        self._tally[self._field(noted, tool)] += 1
        loop = asyncio.get_running_loop()
        task = self._task
        # A task of an earlier event loop (closed without running it to the end) writes nothing more.
        if task is None or task.done() or task.get_loop() is not loop:
            self._task = loop.create_task(self._write(), name="distbrake-fleet")

    async def _write(self) -> None:
        await asyncio.sleep(GATHER_SECONDS)  # the notes of this long go together
        while self._tally:
            tally, self._tally = self._tally, Counter()
            try:
                await _queue_writes(self._client().pipeline(transaction=False), self._prefix, tally).execute()
            except Exception as error:
                self._write_failed(error)

    async def flush(self, timeout: float = 2.0) -> None:
        """Wait, at most `timeout`, until the notes so far are written (or failed): `aclose()` does."""
        task = self._task
        if task is not None and not task.done() and task.get_loop() is asyncio.get_running_loop():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), timeout)


def parse_minute(key: Any, prefix: str) -> int | None:
    text = key.decode() if isinstance(key, bytes) else str(key)
    head, _, minute = text.rpartition(":")
    return int(minute) if head == f"{prefix}:fleet" and minute.isdigit() else None


Tally = tuple[int, int, int]  # a tool's (denied, warned, halted) checks


def decode_minute(reply: Mapping[Any, Any]) -> dict[str, Tally]:
    """One minute's hash as {tool: (denied, warned, halted)}."""
    tools: dict[str, list[int]] = {}
    for raw_field, raw_count in reply.items():
        field = raw_field.decode("utf-8", "replace") if isinstance(raw_field, bytes) else str(raw_field)
        noted, _, tool = field.partition(":")
        if noted not in NOTED:
            continue
        tool = tool[:TOOL_CHARS]  # as a brake writes it: a longer field was written by something else
        try:
            count = int(raw_count)
        except ValueError:
            continue
        tools.setdefault(tool, [0, 0, 0])[NOTED.index(noted)] += count
    return {tool: (d, w, h) for tool, (d, w, h) in tools.items()}


def read_minutes(client: Any, prefix: str, minutes: int, now: float | None = None) -> list[
        tuple[int, dict[str, Tally]]]:
    """The last `minutes` minutes (oldest first) as (unix minute, {tool: (denied, warned, halted)}); reads only."""
    last = int((time.time() if now is None else now) // 60)
    wanted = list(range(last - min(minutes, RETENTION_MINUTES) + 1, last + 1))
    pipe = client.pipeline(transaction=False)
    for minute in wanted:
        pipe.hgetall(fleet_key(prefix, minute))
    replies = pipe.execute()
    return [(minute, decode_minute(reply or {})) for minute, reply in zip(wanted, replies, strict=True)]
