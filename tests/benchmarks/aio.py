"""The asyncio figures against their floors, each interleaved round by round in one event loop.

* `async_pipelined`: checks/s of `AsyncDistributedBrake` at 64 tasks against
  redis.asyncio sending pipelined batches of 64 `EVALSHA return 1`, one
  batch in flight (what the brake's coalescer does, minus the brake);
* `async_one_task`: one task's checks/s against one task's unpipelined
  `EVALSHA return 1` through redis.asyncio;
* `async_load`: the brake's checks/s at 4096 tasks against its own at 64
  tasks (no collapse under load).

A workload is a coroutine function returning its rate; `measure` runs each
once to warm up, then the workloads in turn for every round, and returns
the median rate of each.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from distbrake import AsyncDistributedBrake, BrakeSettings
from distbrake.redis import connect

from .local import SMALL_ARGS, Figure, Step, no_step, ratio_figure
from .server import CONCURRENCY, FLOOR_SCRIPT, bench_brake, memory_note

__all__ = ["LOAD_TASKS", "async_load", "async_one_task", "async_pipelined", "brake_rate", "measure"]

LOAD_TASKS = 4096
Workload = Callable[[], Awaitable[float]]


async def measure(workloads: Sequence[Workload], rounds: int, key: str, step: Step) -> list[float]:
    """Warm each workload up, then run them in turn `rounds` times: the median rate of each."""
    for workload in workloads:
        await workload()
    rates: list[list[float]] = [[] for _ in workloads]
    for index in range(rounds):
        for workload, out in zip(workloads, rates, strict=True):
            out.append(await workload())
        step(key, index + 1, rounds)
    return [statistics.median(out) for out in rates]


def brake_rate(brake: AsyncDistributedBrake, tasks: int, per_task: int) -> Workload:
    """`tasks` tasks of `per_task` checks each, every task in a session of its own: checks/s."""
    sessions = [f"bench-{uuid.uuid4()}" for _ in range(tasks)]
    done = [0]  # checks per session so far, over every run: the arguments alternate across runs too

    async def one(session: str, start: int) -> None:
        for i in range(start, start + per_task):
            await brake.check("search", SMALL_ARGS[i & 1], session_id=session)

    async def run() -> float:
        start = time.perf_counter()
        await asyncio.gather(*(one(s, done[0]) for s in sessions))
        done[0] += per_task
        return tasks * per_task / (time.perf_counter() - start)

    return run


async def _close(*clients: Any) -> None:
    for client in clients:
        close = getattr(client, "aclose", None) or client.close
        await close()


async def _against_floor(
    backend: BrakeSettings, key: str, ours: Callable[[AsyncDistributedBrake], Workload],
    floor: Callable[[Any, str], Workload], rounds: int, timeout_seconds: float, step: Step,
) -> tuple[float, float]:
    brake = bench_brake(AsyncDistributedBrake, backend, f"bnch{uuid.uuid4().hex[:5]}", timeout_seconds)
    client = connect.async_client(backend.parsed_url, timeout_seconds)
    try:
        sha = await client.script_load(FLOOR_SCRIPT)
        rate, floor_rate = await measure([ours(brake), floor(client, sha)], rounds, key, step)
        await brake.clear_all()
    finally:
        await brake.aclose()
        await _close(client)
    return rate, floor_rate


def _rate(send: Callable[..., Awaitable[object]], args: tuple[Any, ...], times: int, checks: int) -> Workload:
    """`times` awaited `send(*args)` in a row, timed: `checks` per the time they took."""
    async def run() -> float:
        start = time.perf_counter()
        for _ in range(times):
            await send(*args)
        return checks / (time.perf_counter() - start)

    return run


def _versus_floor(
    backend: BrakeSettings, key: str, name: str, tasks: int, per_task: int,
    floor: Callable[[Any, str], Workload], rounds: int, timeout_seconds: float, step: Step,
) -> Figure:
    """The brake's checks/s at `tasks` tasks of `per_task` checks vs `floor` (a workload on the client)."""
    ours, floor_rate = asyncio.run(_against_floor(
        backend, key, lambda brake: brake_rate(brake, tasks, per_task), floor, rounds, timeout_seconds, step))
    return ratio_figure(key, name, "checks/s", ours, floor_rate, at_least=1.0, note=memory_note(backend),
                        samples=rounds * tasks * per_task)


def async_pipelined(
    backend: BrakeSettings, *, per_task: int = 200, rounds: int = 5, timeout_seconds: float = 5.0,
    step: Step = no_step,
) -> Figure:
    """The brake at 64 tasks vs pipelined batches of 64 `EVALSHA return 1`, one batch in flight."""
    async def batch(client: Any, sha: str) -> None:
        pipe = client.pipeline(transaction=False)
        for _ in range(CONCURRENCY):
            pipe.evalsha(sha, 0)
        await pipe.execute()

    return _versus_floor(
        backend, "async_pipelined", f"async {CONCURRENCY} tasks vs pipelined EVALSHA return 1", CONCURRENCY,
        per_task, lambda client, sha: _rate(batch, (client, sha), per_task, CONCURRENCY * per_task),
        rounds, timeout_seconds, step)


def async_one_task(
    backend: BrakeSettings, *, calls: int = 2000, rounds: int = 5, timeout_seconds: float = 5.0,
    step: Step = no_step,
) -> Figure:
    """One task's checks vs one task's unpipelined `EVALSHA return 1`, both through redis.asyncio."""
    return _versus_floor(
        backend, "async_one_task", "async 1 task vs unpipelined EVALSHA return 1", 1, calls,
        lambda client, sha: _rate(client.evalsha, (sha, 0), calls, calls), rounds, timeout_seconds, step)


async def _load(backend: BrakeSettings, per_task: int, load_per_task: int, rounds: int,
                timeout_seconds: float, step: Step) -> tuple[float, float]:
    brake = bench_brake(AsyncDistributedBrake, backend, f"bnch{uuid.uuid4().hex[:5]}", timeout_seconds)
    try:
        loaded, base = await measure(
            [brake_rate(brake, LOAD_TASKS, load_per_task), brake_rate(brake, CONCURRENCY, per_task)],
            rounds, "async_load", step)
        await brake.clear_all()
    finally:
        await brake.aclose()
    return loaded, base


def async_load(
    backend: BrakeSettings, *, per_task: int = 400, load_per_task: int = 6, rounds: int = 7,
    timeout_seconds: float = 5.0, step: Step = no_step,
) -> Figure:
    """The brake's rate at 4096 tasks vs its own at 64 tasks, interleaved, rounds of about as many checks."""
    loaded, base = asyncio.run(_load(backend, per_task, load_per_task, rounds, timeout_seconds, step))
    return ratio_figure(
        "async_load", f"async {LOAD_TASKS} tasks vs {CONCURRENCY} tasks", "checks/s", loaded, base,
        at_least=0.9, note=memory_note(backend), samples=rounds * LOAD_TASKS * load_per_task,
    )
