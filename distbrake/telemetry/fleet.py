"""The fleet view in Redis: denials and warnings per tool per minute, under the brake's key prefix.

Written only when a check is denied or warned, in the background (a sync
brake's writer thread, an async brake's task): never blocking or failing the
check. One hash per minute, `<prefix>:fleet:<unix minute>`, field
`d:<tool>` (denied) or `w:<tool>` (warned), each write an HINCRBY plus a
PEXPIRE of that one key (Cluster-safe: never a multi-key command), kept
`RETENTION_MINUTES`. No session id, argument or hash is ever written. Read by
`distbrake stats` and `distbrake top` (`read_minutes`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Literal

from .recorder import TOOL_CHARS

__all__ = ["RETENTION_MINUTES", "AsyncFleetWriter", "FleetWriter", "fleet_key", "parse_minute", "read_minutes"]

logger = logging.getLogger("distbrake")

RETENTION_MINUTES = 60
MAX_QUEUED = 10_000  # notes waiting for the writer, at most (further ones are dropped)
BATCH = 1_000
Kind = Literal["d", "w"]
_Tally = Counter[tuple[int, str]]  # (minute, field) -> count


def fleet_key(prefix: str, minute: int) -> str:
    return f"{prefix}:fleet:{minute}"


def _field(kind: Kind, tool: str) -> str:
    return f"{kind}:{tool[:TOOL_CHARS]}"


def _queue_writes(pipe: Any, prefix: str, tally: _Tally) -> Any:
    keys = set()
    for (minute, field), count in tally.items():
        key = fleet_key(prefix, minute)
        pipe.hincrby(key, field, count)
        keys.add(key)
    for key in keys:
        pipe.pexpire(key, RETENTION_MINUTES * 60_000)
    return pipe


def _write_failed(error: BaseException) -> None:
    logger.debug("distbrake: the fleet view's counters were not written (%s)", type(error).__name__)


class FleetWriter:
    """A sync brake's writer: notes go on a bounded queue, a daemon thread writes them in batches."""

    def __init__(self, client: Callable[[], Any], prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._queue: queue.SimpleQueue[tuple[int, str]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def note(self, kind: Kind, tool: str) -> None:
        if self._queue.qsize() >= MAX_QUEUED:
            return
        self._queue.put((int(time.time() // 60), _field(kind, tool)))
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
            for _ in range(BATCH):
                try:
                    tally[self._queue.get_nowait()] += 1
                except queue.Empty:
                    break
            try:
                _queue_writes(self._client().pipeline(transaction=False), self._prefix, tally).execute()
            except Exception as error:
                _write_failed(error)

    def flush(self, timeout: float = 5.0) -> None:
        """Wait (bounded) until the queue is empty: for tests and a clean exit."""
        end = time.monotonic() + timeout
        while not self._queue.empty() and time.monotonic() < end:
            time.sleep(0.01)
        time.sleep(0.05)


class AsyncFleetWriter:
    """An async brake's writer: notes are tallied, one task of the running loop writes them."""

    def __init__(self, client: Callable[[], Any], prefix: str) -> None:
        self._client = client
        self._prefix = prefix
        self._tally: _Tally = Counter()
        self._task: asyncio.Task[None] | None = None

    def note(self, kind: Kind, tool: str) -> None:
        if len(self._tally) >= MAX_QUEUED:
            return
        self._tally[(int(time.time() // 60), _field(kind, tool))] += 1
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._write(), name="distbrake-fleet")

    async def _write(self) -> None:
        await asyncio.sleep(0)  # the notes of this tick go together
        while self._tally:
            tally, self._tally = self._tally, Counter()
            try:
                await _queue_writes(self._client().pipeline(transaction=False), self._prefix, tally).execute()
            except Exception as error:
                _write_failed(error)

    async def flush(self) -> None:
        """Wait until the notes so far are written: for tests and a clean exit."""
        if self._task is not None:
            await asyncio.shield(self._task)


def parse_minute(key: Any, prefix: str) -> int | None:
    text = key.decode() if isinstance(key, bytes) else str(key)
    head, _, minute = text.rpartition(":")
    return int(minute) if head == f"{prefix}:fleet" and minute.isdigit() else None


def decode_minute(reply: Mapping[Any, Any]) -> dict[str, tuple[int, int]]:
    """One minute's hash as {tool: (denied, warned)}."""
    tools: dict[str, list[int]] = {}
    for raw_field, raw_count in reply.items():
        field = raw_field.decode("utf-8", "replace") if isinstance(raw_field, bytes) else str(raw_field)
        kind, _, tool = field.partition(":")
        if kind not in ("d", "w"):
            continue
        try:
            count = int(raw_count)
        except ValueError:
            continue
        tools.setdefault(tool, [0, 0])[kind == "w"] += count
    return {tool: (d, w) for tool, (d, w) in tools.items()}


def read_minutes(client: Any, prefix: str, minutes: int, now: float | None = None) -> list[
        tuple[int, dict[str, tuple[int, int]]]]:
    """The last `minutes` minutes (oldest first) as (unix minute, {tool: (denied, warned)}); reads only."""
    last = int((time.time() if now is None else now) // 60)
    wanted = list(range(last - min(minutes, RETENTION_MINUTES) + 1, last + 1))
    pipe = client.pipeline(transaction=False)
    for minute in wanted:
        pipe.hgetall(fleet_key(prefix, minute))
    replies = pipe.execute()
    return [(minute, decode_minute(reply or {})) for minute, reply in zip(wanted, replies, strict=True)]
