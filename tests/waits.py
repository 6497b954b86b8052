"""How long code took, less the time its thread stood ready to run while other processes had the cores.

A timing proof asserts that a check waited at most its timeout for Redis. On a
loaded machine (a second test worker, another suite, a build) the thread that
waited is woken on time but may then stand in the run queue before it gets a
core: that delay is the machine's, not the code's, and it made bounds such as
"timeout + 10%" fail at random. Linux counts it per thread (the second field
of /proc/thread-self/schedstat, the run-queue delay in nanoseconds), so a
measure is the wall time less that delay: the time the code ran or waited on
its own account. Where there is no schedstat (not Linux) the delay reads 0 and
a measure is the wall time.

Only the measuring thread's delay is taken off: code that waits for another
thread of its own is charged that thread's delays (an over-estimate, never an
under-estimate).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

SCHEDSTAT = Path("/proc/thread-self/schedstat")


def run_queue_delay() -> float:
    """Seconds this thread has spent ready to run but not running (0.0 where the kernel does not say)."""
    try:
        return int(SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class Stopwatch:
    """Started when made. `seconds`: the time so far (or until `stop`) less the thread's run-queue delay;
    `wall` and `delay` are its two parts. Read it on the thread that made it."""

    def __init__(self) -> None:
        self._delayed = run_queue_delay()  # read outside the timed span: a few microseconds each
        self._started = time.monotonic()
        self._stopped: tuple[float, float] | None = None

    def stop(self) -> None:
        self._stopped = (time.monotonic(), run_queue_delay())

    def _now(self) -> tuple[float, float]:
        return self._stopped or (time.monotonic(), run_queue_delay())

    @property
    def wall(self) -> float:
        return self._now()[0] - self._started

    @property
    def delay(self) -> float:
        ended, delayed = self._now()
        return min(delayed - self._delayed, ended - self._started)

    @property
    def seconds(self) -> float:
        ended, delayed = self._now()
        return ended - self._started - min(delayed - self._delayed, ended - self._started)


@contextmanager
def measured() -> Iterator[Stopwatch]:
    """`with measured() as took: ...`, then `took.seconds`: the block's time less its thread's run-queue delay."""
    watch = Stopwatch()
    try:
        yield watch
    finally:
        watch.stop()


def run_measured(
    command: Sequence[str], *, timeout: float = 120.0, **options: object,
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run `command` to its end (text output captured; `options` as `subprocess.Popen` takes them): its result,
    and its time less its main thread's run-queue delay, read from /proc/<pid>/schedstat once it has exited and
    before it is reaped (a process that ran late on a loaded machine is not charged for the cores it waited for).
    Killed after `timeout` seconds (its result then has the signal's return code)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        child = subprocess.Popen(command, stdout=out, stderr=err, **options)  # type: ignore[call-overload]
        watchdog = threading.Timer(timeout, child.kill)
        watchdog.start()
        try:
            os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped: its schedstat is there
            ended = time.monotonic()
            try:
                delay = int(Path(f"/proc/{child.pid}/schedstat").read_text().split()[1]) / 1e9
            except (OSError, IndexError, ValueError):
                delay = 0.0
            code = child.wait()
        finally:
            watchdog.cancel()
        out.seek(0)
        err.seek(0)
        result = subprocess.CompletedProcess(
            list(command), code, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"))
    return result, ended - started - min(delay, ended - started)
