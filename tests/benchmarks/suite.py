"""The team's benchmark suite: every figure in turn (`run_bench`), judged against its target.

Each figure is a ratio to its floor, the cheapest thing that could do the
same job on the same machine and server (see `local`, `server`, `raw`).
`run_bench` returns them all in a `BenchReport`; a figure whose measurement
fails is reported as failed, and the others are still measured. The command
that runs it, `python -m tests.benchmarks`, is in `__main__`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from distbrake import BrakeSettings, LoopBrakeError

from .aio import LOAD_TASKS, async_load, async_one_task, async_pipelined
from .cluster import THREADS, cluster_memory, cluster_rate
from .local import Figure, Step, call_hash_1mb, cli_startup, import_time, inprocess_check, no_step
from .raw import server_cost, server_record, sync_check_raw, sync_check_wire
from .server import (
    CONCURRENCY,
    DEFAULT_SESSIONS,
    KILL_SWITCH_BOUND,
    KILL_SWITCH_NAME,
    QUICK_SESSIONS,
    RULES,
    STAGE_NAMES,
    async_throughput,
    kill_switch_cost,
    memory_per_session,
    rules_cost,
    sync_check_latency,
)
from .telemetry import ASYNC_NAME, SYNC_NAME, otel_async_check, otel_sync_check


class Stage(NamedTuple):
    """What a figure is called, its unit and its target, as the table prints them."""

    name: str
    unit: str
    target: str


STAGES: dict[str, Stage] = {
    "sync_check_latency": Stage("sync check latency (median)", "µs", "<= 1.2x"),
    "sync_check_raw": Stage("sync check vs raw-socket EVALSHA return 1", "µs", "<= 1.6x"),
    "sync_check_wire": Stage("sync check vs its own bytes from a raw socket", "µs", "<= 1.3x"),
    **{key: Stage(STAGE_NAMES[key], "µs", f"<= {bound:g}x") for key, (_, bound) in RULES.items()},
    "kill_switch_cost": Stage(KILL_SWITCH_NAME, "µs", f"<= {KILL_SWITCH_BOUND:g}x"),
    "async_throughput": Stage(f"async throughput, {CONCURRENCY} tasks", "checks/s", ">= 2x"),
    "async_pipelined": Stage(f"async {CONCURRENCY} tasks vs pipelined EVALSHA return 1", "checks/s", ">= 1x"),
    "async_one_task": Stage("async 1 task vs unpipelined EVALSHA return 1", "checks/s", ">= 1x"),
    "async_load": Stage(f"async {LOAD_TASKS} tasks vs {CONCURRENCY} tasks", "checks/s", ">= 0.9x"),
    "cluster_async": Stage(f"Cluster async {CONCURRENCY} tasks vs single node", "checks/s", ">= 0.9x"),
    "cluster_sync": Stage(f"Cluster sync {THREADS} threads vs single node", "checks/s", ">= 0.9x"),
    "memory_per_session": Stage("Redis memory per session", "bytes", "<= 240 B"),
    "cluster_memory": Stage("Redis memory per session, Cluster", "bytes", "<= 265 B"),
    "inprocess_check": Stage("in-process LoopBrake.check", "µs", "<= 1.5x"),
    "call_hash_1mb": Stage("call_hash of a ~1 MB dict", "ms", "<= 0.5x"),
    "import_time": Stage("import distbrake vs import redis, pydantic_settings", "ms", "<= 1.1x"),
    "cli_startup": Stage("distbrake --version / --help vs import click", "ms", "<= 2x"),
    "server_cost": Stage("server cost, realistic path: script vs return 1", "req/s", ">= 0.3x"),
    "server_record": Stage("script time, realistic path: ours vs bare record script", "req/s", ">= 0.8x"),
    "otel_sync_check": Stage(SYNC_NAME, "µs", "<= 1.1x"),
    "otel_async_check": Stage(ASYNC_NAME, "µs", "<= 1.1x"),
}


@dataclass(frozen=True)
class BenchReport:
    backend: str  # redacted URL
    quick: bool
    figures: list[Figure] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(f.passed is not False for f in self.figures)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "quick": self.quick,
            "passed": self.passed,
            "figures": [f.to_json() for f in self.figures],
        }


def _failed(key: str, error: BaseException) -> Figure:
    name, unit, target = STAGES[key]
    if isinstance(error, LoopBrakeError):
        why = (f"a benchmark check was denied ({error.count} >= {error.max_repeats}); "
               "run with max_repeats >= 3")
    else:
        why = f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
    return Figure(key, name, unit, None, None, None, target, False, f"failed: {why}")


def with_target(figure: Figure, bound: float) -> Figure:
    """`figure` judged against `bound` instead of its own target, in the same direction.

    A ratio figure compares its ratio ("<= 1.2x" becomes "<= BOUNDx"); the
    memory figure, which has no floor, compares its bytes. A figure that was
    skipped or failed to measure stays as it is.
    """
    value = figure.ratio if figure.ratio is not None else figure.ours
    if value is None or figure.passed is None:
        return figure
    at_most = figure.target.startswith("<=")
    unit = "x" if figure.ratio is not None else (" B" if figure.unit == "bytes" else f" {figure.unit}")
    target = f"{'<=' if at_most else '>='} {bound:g}{unit}"
    return replace(figure, target=target, passed=value <= bound if at_most else value >= bound)


def parse_targets(texts: Collection[str]) -> dict[str, float]:
    """`--target FIGURE=BOUND` options as {figure: bound}; ValueError naming the bad one."""
    targets: dict[str, float] = {}
    for text in texts:
        key, sep, number = text.partition("=")
        if not sep or key not in STAGES:
            raise ValueError(f"--target {text!r}: expected FIGURE=BOUND with FIGURE one of "
                             f"{', '.join(STAGES)}")
        try:
            bound = float(number)
        except ValueError:
            bound = float("nan")
        if not bound >= 0 or bound == float("inf"):
            raise ValueError(f"--target {text!r}: BOUND must be a number >= 0")
        targets[key] = bound
    return targets


def run_bench(
    backend: BrakeSettings, *, quick: bool = False, sessions: int | None = None,
    timeout_seconds: float = 5.0, step: Step = no_step, only: Collection[str] = (),
    targets: Mapping[str, float] | None = None, pin_cpu: bool = False, cluster: BrakeSettings | None = None,
) -> BenchReport:
    """Every figure (or those named in `only`), in the order of `STAGES`, on `backend`'s URL.

    `quick` is a small run (seconds, noisier figures); `targets` replaces the
    bound of the figures it names (see `with_target`); `pin_cpu` pins client
    and (local) server to one CPU for `sync_check_raw` and `sync_check_wire`; `cluster` is the
    Cluster of the Cluster figures (skipped without it).
    """
    targets = targets or {}
    if sessions is None:
        sessions = QUICK_SESSIONS if quick else DEFAULT_SESSIONS
    b, t, c = backend, timeout_seconds, cluster
    rounds = {"rounds": 5} if quick else {}
    runs: dict[str, Callable[[], Figure]] = {
        "sync_check_latency": (
            (lambda: sync_check_latency(b, rounds=4, block=150, warmup=100,
                                        timeout_seconds=t, step=step))
            if quick else (lambda: sync_check_latency(b, timeout_seconds=t, step=step))
        ),
        "sync_check_raw": lambda: sync_check_raw(
            b, timeout_seconds=t, step=step, pin_cpu=pin_cpu,
            **({"rounds": 5, "block": 150, "warmup": 100} if quick else {})),
        "sync_check_wire": lambda: sync_check_wire(
            b, timeout_seconds=t, step=step, pin_cpu=pin_cpu,
            **({"rounds": 5, "block": 150, "warmup": 100} if quick else {})),
        **{key: functools.partial(rules_cost, b, key, timeout_seconds=t, step=step, **(
            {"rounds": 4, "block": 150, "warmup": 100} if quick else {})) for key in RULES},
        "kill_switch_cost": functools.partial(kill_switch_cost, b, timeout_seconds=t, step=step, **(
            {"rounds": 4, "block": 150, "warmup": 100} if quick else {})),
        "async_throughput": (
            (lambda: async_throughput(b, per_task=40, rounds=3, timeout_seconds=t, step=step))
            if quick else (lambda: async_throughput(b, timeout_seconds=t, step=step))
        ),
        "async_pipelined": lambda: async_pipelined(
            b, timeout_seconds=t, step=step, **({"per_task": 40} if quick else {}), **rounds),
        "async_one_task": lambda: async_one_task(
            b, timeout_seconds=t, step=step, **({"calls": 300} if quick else {}), **rounds),
        "async_load": lambda: async_load(
            b, timeout_seconds=t, step=step, **({"per_task": 64, "load_per_task": 1} if quick else {}),
            **rounds),
        **{key: functools.partial(cluster_rate, key, b, c, timeout_seconds=t, step=step, **(
            {"per_worker": 40 if key == "cluster_async" else 50} if quick else {}), **rounds)
           for key in ("cluster_async", "cluster_sync")},
        "memory_per_session": lambda: memory_per_session(
            b, sessions=sessions, timeout_seconds=t, step=step),
        "cluster_memory": lambda: cluster_memory(c, sessions=sessions, timeout_seconds=t, step=step),
        "inprocess_check": (
            (lambda: inprocess_check(rounds=5, block=1000, step=step))
            if quick else (lambda: inprocess_check(step=step))
        ),
        "call_hash_1mb": (
            (lambda: call_hash_1mb(repeats=3, step=step))
            if quick else (lambda: call_hash_1mb(step=step))
        ),
        "import_time": lambda: import_time(rounds=5 if quick else 15, step=step),
        "cli_startup": lambda: cli_startup(rounds=5 if quick else 15, step=step),
        "server_cost": lambda: server_cost(
            b, requests=20_000 if quick else 200_000, timeout_seconds=t, step=step),
        "server_record": lambda: server_record(
            b, requests=20_000 if quick else 200_000, timeout_seconds=t, step=step),
        "otel_sync_check": (
            (lambda: otel_sync_check(b, rounds=4, block=150, warmup=100, timeout_seconds=t, step=step))
            if quick else (lambda: otel_sync_check(b, timeout_seconds=t, step=step))
        ),
        "otel_async_check": (
            (lambda: otel_async_check(b, per_task=40, rounds=3, timeout_seconds=t, step=step))
            if quick else (lambda: otel_async_check(b, timeout_seconds=t, step=step))
        ),
    }
    figures = []
    unknown = sorted(set(only) - set(STAGES))
    if unknown:
        raise ValueError(f"unknown figure(s) {', '.join(unknown)}; known: {', '.join(STAGES)}")
    for key in STAGES:
        if only and key not in only:
            continue
        try:
            figure = runs[key]()
        except Exception as error:  # reported as a failed figure
            figure = _failed(key, error)
        figures.append(with_target(figure, targets[key]) if key in targets else figure)
    return BenchReport(backend.shown_url, quick, figures)
