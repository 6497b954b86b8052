"""The `bench` command: every benchmark figure in turn (`run_bench`), with progress, as a table or JSON.

Each figure is a ratio to its floor, the cheapest thing that could do the
same job on the same machine and server (see `bench_local`, `bench_server`).
`run_bench` returns them all in a `BenchReport`; a figure whose measurement
fails is reported as failed, and the others are still measured.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import click
from rich.text import Text

from ..errors import LoopBrakeError
from ..settings import BrakeSettings
from .app import App, command
from .bench_async import LOAD_TASKS, async_load, async_one_task, async_pipelined
from .bench_cluster import THREADS, cluster_async, cluster_memory, cluster_sync
from .bench_local import Figure, Step, call_hash_1mb, cli_startup, import_time, inprocess_check, no_step
from .bench_raw import server_cost, sync_check_raw
from .bench_server import (
    CONCURRENCY,
    DEFAULT_SESSIONS,
    QUICK_SESSIONS,
    RULES,
    STAGE_NAMES,
    async_throughput,
    memory_per_session,
    rules_cost,
    sync_check_latency,
)
from .bench_telemetry import ASYNC_NAME, SYNC_NAME, otel_async_check, otel_sync_check
from .output import (
    EXIT_TARGET,
    emit_json,
    escape_text,
    make_console,
    make_table,
    print_renderable,
    scrub,
)

STAGES = {
    "sync_check_latency": ("sync check latency (median)", "µs", "<= 1.2x"),
    "sync_check_raw": ("sync check vs raw-socket EVALSHA return 1", "µs", "<= 1.6x"),
    **{key: (STAGE_NAMES[key], "µs", f"<= {bound:g}x") for key, (_, bound) in RULES.items()},
    "async_throughput": (f"async throughput, {CONCURRENCY} tasks", "checks/s", ">= 2x"),
    "async_pipelined": (f"async {CONCURRENCY} tasks vs pipelined EVALSHA return 1", "checks/s", ">= 1x"),
    "async_one_task": ("async 1 task vs unpipelined EVALSHA return 1", "checks/s", ">= 1x"),
    "async_load": (f"async {LOAD_TASKS} tasks vs {CONCURRENCY} tasks", "checks/s", ">= 0.9x"),
    "cluster_async": (f"Cluster async {CONCURRENCY} tasks vs single node", "checks/s", ">= 0.8x"),
    "cluster_sync": (f"Cluster sync {THREADS} threads vs single node", "checks/s", ">= 0.8x"),
    "memory_per_session": ("Redis memory per session", "bytes", "<= 240 B"),
    "cluster_memory": ("Redis memory per session, Cluster", "bytes", "<= 265 B"),
    "inprocess_check": ("in-process LoopBrake.check", "µs", "<= 1.5x"),
    "call_hash_1mb": ("call_hash of a ~1 MB dict", "ms", "<= 0.5x"),
    "import_time": ("import distbrake vs import redis, pydantic_settings", "ms", "<= 1.1x"),
    "cli_startup": ("distbrake --version / --help vs import click", "ms", "<= 2x"),
    "server_cost": ("server cost, realistic path: script vs return 1", "req/s", ">= 0.3x"),
    "otel_sync_check": (SYNC_NAME, "µs", "<= 1.1x"),
    "otel_async_check": (ASYNC_NAME, "µs", "<= 1.1x"),
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
    and (local) server to one CPU for `sync_check_raw`; `cluster` is the
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
        **{key: functools.partial(rules_cost, b, key, timeout_seconds=t, step=step, **(
            {"rounds": 4, "block": 150, "warmup": 100} if quick else {})) for key in RULES},
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
        "cluster_async": lambda: cluster_async(
            b, c, timeout_seconds=t, step=step, **({"per_task": 40} if quick else {}), **rounds),
        "cluster_sync": lambda: cluster_sync(
            b, c, timeout_seconds=t, step=step, **({"per_thread": 50} if quick else {}), **rounds),
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


# -- the command ---------------------------------------------------------------------------------


def _figure_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "checks/s":
        return f"{value:,.0f}/s"
    if unit == "bytes":
        return f"{value:.0f} B"
    if value >= 100:
        return f"{value:.0f} {unit}"
    return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"


@command("bench")
@click.option("--quick", is_flag=True, help="A small run (a few seconds; noisier figures).")
@click.option("--sessions", metavar="N", default=None, type=click.IntRange(min=100),
              help="Sessions for the memory figure (default 20000; --quick 2000).")
@click.option("--only", "only", multiple=True, metavar="FIGURE", type=click.Choice(list(STAGES)),
              help="Measure only this figure (repeatable).")
@click.option("--pin-cpu", is_flag=True,
              help="Pin the bench and a local server to one CPU for sync_check_raw (the state of a "
                   "busy machine, reproduced steadily).")
@click.option("--cluster-url", metavar="URL", default=None,
              help="A redis+cluster:// URL for the Cluster figures (skipped without one).")
@click.option("--target", "targets", multiple=True, metavar="FIGURE=BOUND",
              help="Judge FIGURE against BOUND instead of its own target, in the same direction "
                   "(a ratio; bytes for memory_per_session), e.g. sync_check_latency=1.5 "
                   "(repeatable).")
def bench_command(
    app: App, *, quick: bool, sessions: int | None, only: tuple[str, ...],
    targets: tuple[str, ...], as_json: bool, pin_cpu: bool, cluster_url: str | None,
) -> None:
    """Benchmark against the server at --url, as ratios to that server's own floor.

    \b
    sync check vs redis-py EVALSHA `return 1`                    <= 1.2x
    sync check vs raw-socket EVALSHA `return 1` (--pin-cpu)      <= 1.6x
    async 64 tasks vs unpipelined / pipelined EVALSHA            >= 2x / 1x
    async 1 task vs unpipelined; 4096 tasks vs 64 tasks          >= 1x; 0.9x
    Cluster async 64 tasks, sync 8 threads vs single node        >= 0.8x
    Redis memory per session, single node / Cluster              <= 240 / 265 B
    LoopBrake.check vs sha256(json.dumps(args, sort_keys))       <= 1.5x
    server cost per check, realistic path, vs return 1           >= 0.3x
    OpenTelemetry on (SDK + reader) vs off: sync, async 64 tasks <= 1.1x each

    The memory figure writes N short-lived keys under a dedicated prefix and
    clears them: run it only on a server you may fill. Exit 5 when a figure
    misses its target or cannot be measured (skipped figures do not count).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    try:
        bounds = parse_targets(targets)
    except ValueError as error:
        raise click.UsageError(str(error)) from None

    settings = app.settings()
    timeout = max(settings.timeout_seconds, 5.0)
    cluster = None
    if cluster_url is not None:
        app.remember_url(cluster_url)
        from ..redis.sync import DistributedBrake

        cluster = DistributedBrake.settings_for_url(cluster_url, None)
        if cluster.parsed_url.kind != "cluster":
            raise click.UsageError("--cluster-url must be a redis+cluster:// URL")
    with app.open() as brake:  # fail fast (exit 4) when the server is not there
        brake.ping()
    progress = Progress(
        TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
        console=make_console(stderr=True), transient=True, disable=as_json or not sys.stderr.isatty(),
    )
    tasks = {key: progress.add_task(name, total=None) for key, (name, _, _) in STAGES.items()
             if not only or key in only}

    def step(stage: str, done: int, total: int) -> None:
        if stage in tasks:
            progress.update(tasks[stage], completed=done, total=total)

    with progress:
        report = run_bench(settings, quick=quick, sessions=sessions, timeout_seconds=timeout,
                           step=step, only=only, targets=bounds, pin_cpu=pin_cpu, cluster=cluster)
    if as_json:
        emit_json(report.to_json())
    else:
        _print_report(app, report, quick)
    if not report.passed:
        raise click.exceptions.Exit(EXIT_TARGET)


def _print_report(app: App, report: BenchReport, quick: bool) -> None:
    terminal = sys.stdout.isatty()
    table = make_table("figure", "ours", "floor", "ratio", "target", "result",
                       title=Text(f"distbrake bench ({'quick' if quick else 'full'}) on "
                                  f"{escape_text(report.backend)}"))
    for figure in report.figures:
        if figure.passed is None:
            result = Text("skip", style="dim" if terminal else "")
        elif figure.passed:
            result = Text("pass", style="green" if terminal else "")
        else:
            result = Text("FAIL", style="bold red" if terminal else "")
        table.add_row(
            figure.name, _figure_value(figure.ours, figure.unit),
            _figure_value(figure.floor, figure.unit),
            "-" if figure.ratio is None else f"{figure.ratio:.2f}x", figure.target, result,
        )
    console = make_console()
    print_renderable(console, table)
    for figure in report.figures:
        if figure.note:
            console.print(Text(f"{figure.key}: {escape_text(scrub(figure.note, app.secrets))}",
                               style="dim" if terminal else ""))
    failed = [f.key for f in report.figures if f.passed is False]
    if failed:
        console.print(Text(f"missed: {', '.join(failed)} (exit {EXIT_TARGET})",
                           style="bold red" if terminal else ""))
