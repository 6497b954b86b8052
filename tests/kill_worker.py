"""One worker of the kill-switch fleet test: `python -m tests.kill_worker URL sync|async`.

It checks calls without pause (a new call each time, in sessions of its own:
workers sharing sessions check the same call in a row when their counts run
in step, and the repeat rule rightly denies the third), prints `ready` after
its first check, and, at its first check refused with LoopBrakeHalt by the
kill switch, prints `refused <unix time>` and exits.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

from distbrake import AsyncDistributedBrake, DistributedBrake, LoopBrakeHalt


def said(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run_sync(url: str) -> None:
    brake = DistributedBrake.from_url(url, otel=False, timeout_seconds=2.0)
    n = 0
    while True:
        n += 1
        try:
            brake.check("search", {"n": n}, session_id=f"worker-{os.getpid()}-{n % 16}")
        except LoopBrakeHalt as error:
            said(f"refused {time.time():.6f} {error.halt_rule}")
            brake.close()
            return
        if n == 1:
            said("ready")


async def run_async(url: str) -> None:
    brake = AsyncDistributedBrake.from_url(url, otel=False, timeout_seconds=2.0)
    n = 0
    while True:
        n += 1
        try:
            await brake.check("search", {"n": n}, session_id=f"worker-{os.getpid()}-{n % 16}")
        except LoopBrakeHalt as error:
            said(f"refused {time.time():.6f} {error.halt_rule}")
            await brake.aclose()
            return
        if n == 1:
            said("ready")


if __name__ == "__main__":
    if sys.argv[2] == "sync":
        run_sync(sys.argv[1])
    else:
        asyncio.run(run_async(sys.argv[1]))
