"""The cost of instrumentation: checks with OpenTelemetry on (the SDK, a reader, no exporter) against off.

* `otel_sync_check`: median latency of a sync `DistributedBrake.check` with a
  `MeterProvider` and an in-memory reader, against the same check with
  `otel=False`, in one run, check by check in turn on the same server;
* `otel_async_check`: the time per check of `AsyncDistributedBrake` at 64
  tasks, on against off, in alternating rounds. Each instrumented round
  ends with a collection by the reader (inside the timed part), so the
  durations handed to the histogram at collection are paid here.

Both are skipped (not failed) when `opentelemetry-sdk` is not installed.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from importlib.util import find_spec
from typing import Any

from distbrake import AsyncDistributedBrake, BrakeSettings, DistributedBrake

from .local import SMALL_ARGS, Figure, Step, flat, no_step, paired_rounds, ratio_figure
from .server import CONCURRENCY

SYNC_NAME = "sync check, OTel on vs off (median)"
ASYNC_NAME = f"async check, {CONCURRENCY} tasks, OTel on vs off"
TARGET = 1.10


def _sdk() -> Any:
    """(MeterProvider, InMemoryMetricReader), or None when the SDK is not installed."""
    try:
        if find_spec("opentelemetry.sdk.metrics") is None:
            return None
    except ImportError:  # opentelemetry itself is missing
        return None
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    return MeterProvider, InMemoryMetricReader


def _note(backend: BrakeSettings) -> str:
    if backend.parsed_url.connector == "memory":
        return "memory:// is the embedded fakeredis (no network); the target is meant for a real Redis"
    return ""


def _skipped(key: str, name: str, unit: str) -> Figure:
    return Figure(key, name, unit, None, None, None, f"<= {TARGET:g}x", None,
                  "skipped: pip install opentelemetry-sdk (and distbrake[otel]) to measure it")


def _pair(kind: type[Any], backend: BrakeSettings, timeout: float, provider: Any) -> tuple[Any, Any]:
    """(off, on): two brakes of `kind` on the backend, each under a prefix of its own, failing closed."""
    def make(**options: Any) -> Any:
        prefix = f"bnch{uuid.uuid4().hex[:5]}"
        return kind.from_url(backend.url, key_prefix=prefix, timeout_seconds=timeout, on_backend_error="closed",
                             **options)

    return make(otel=False), make(meter_provider=provider)


def otel_sync_check(
    backend: BrakeSettings, *, rounds: int = 10, block: int = 500, warmup: int = 300,
    timeout_seconds: float = 2.0, step: Step = no_step,
) -> Figure:
    """Median latency of an instrumented sync check vs the same check uninstrumented."""
    key, unit = "otel_sync_check", "µs"
    sdk = _sdk()
    if sdk is None:
        return _skipped(key, SYNC_NAME, unit)
    meter_provider, reader_class = sdk
    reader = reader_class()
    provider = meter_provider(metric_readers=[reader])
    off, on = _pair(DistributedBrake, backend, timeout_seconds, provider)
    session = f"bench-{uuid.uuid4()}"
    try:
        def floor(i: int) -> object:
            return off.check("search", SMALL_ARGS[i & 1], session_id=session)

        def ours(i: int) -> object:
            return on.check("search", SMALL_ARGS[i & 1], session_id=session)

        # a reader's collection between blocks (off the checks' path)
        on_r, off_r = paired_rounds(floor, ours, warmup=warmup, rounds=rounds, block=block, key=key, step=step,
                                    between=reader.get_metrics_data)
        on_t, off_t = flat(on_r), flat(off_r)
        off.clear(session)
        on.clear(session)
    finally:
        off.close()
        on.close()
        provider.shutdown()
    return ratio_figure(key, SYNC_NAME, unit, statistics.median(on_t) * 1e6, statistics.median(off_t) * 1e6,
                        at_most=TARGET, note=_note(backend), samples=len(on_t))


async def _async_rounds(
    backend: BrakeSettings, *, per_task: int, rounds: int, timeout_seconds: float, step: Step,
    meter_provider: Any, reader_class: Any,
) -> tuple[float, float]:
    reader = reader_class()
    provider = meter_provider(metric_readers=[reader])
    off, on = _pair(AsyncDistributedBrake, backend, timeout_seconds, provider)
    sessions = [f"bench-{uuid.uuid4()}" for _ in range(CONCURRENCY)]
    try:
        async def task(brake: Any, session: str, n: int) -> None:
            for i in range(n):
                await brake.check("search", SMALL_ARGS[i & 1], session_id=session)

        async def per_check(brake: Any, n: int, collect: bool) -> float:
            start = time.perf_counter()
            await asyncio.gather(*(task(brake, s, n) for s in sessions))
            if collect:
                reader.get_metrics_data()
            return (time.perf_counter() - start) / (CONCURRENCY * n)

        await per_check(off, max(5, per_task // 5), False)
        await per_check(on, max(5, per_task // 5), True)
        on_r: list[float] = []
        off_r: list[float] = []
        for index in range(rounds):
            off_r.append(await per_check(off, per_task, False))
            on_r.append(await per_check(on, per_task, True))
            step("otel_async_check", index + 1, rounds)
        await off.clear_all()
        await on.clear_all()
    finally:
        await off.aclose()
        await on.aclose()
        provider.shutdown()
    return statistics.median(on_r), statistics.median(off_r)


def otel_async_check(
    backend: BrakeSettings, *, per_task: int = 100, rounds: int = 11, timeout_seconds: float = 5.0,
    step: Step = no_step,
) -> Figure:
    """Time per check of the async brake at 64 tasks, OTel on vs off (the inverse of the throughput ratio)."""
    key, unit = "otel_async_check", "µs"
    sdk = _sdk()
    if sdk is None:
        return _skipped(key, ASYNC_NAME, unit)
    on, off = asyncio.run(_async_rounds(
        backend, per_task=per_task, rounds=rounds, timeout_seconds=timeout_seconds, step=step,
        meter_provider=sdk[0], reader_class=sdk[1]))
    return ratio_figure(key, ASYNC_NAME, unit, on * 1e6, off * 1e6, at_most=TARGET, note=_note(backend),
                        samples=rounds * CONCURRENCY * per_task)
