"""The `bench` command: run the benchmark against --url and print its figures."""

from __future__ import annotations

import sys

import click
from rich.text import Text

from ..urls import redact_url
from .command_helpers import emit_json, json_option
from .global_options import App
from .rendering import make_console, make_table, print_renderable
from .run_state import current_run, scrub


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


@click.command("bench", short_help="Benchmark figures, as ratios to the server's own floor.")
@click.option("--quick", is_flag=True, help="A small run (a few seconds; noisier figures).")
@click.option("--sessions", metavar="N", default=None, type=click.IntRange(min=100),
              help="Sessions for the memory figure (default 20000; --quick 2000).")
@click.option("--only", "only", multiple=True, metavar="FIGURE",
              type=click.Choice(["sync_check_latency", "async_throughput", "memory_per_session",
                                 "inprocess_check", "call_hash_1mb", "server_cost"]),
              help="Measure only this figure (repeatable).")
@json_option
@click.pass_obj
def bench_command(
    app: App, *, quick: bool, sessions: int | None, only: tuple[str, ...], as_json: bool
) -> None:
    """Benchmark against the server at --url, as ratios to that server's own floor.

    \b
    (a) sync check latency vs redis-py EVALSHA `return 1`       target <= 1.2x
    (b) async throughput at 64 tasks vs unpipelined EVALSHA      target >= 2x
    (c) Redis memory per session (real Redis only)               target <= 240 B
    (d) LoopBrake.check vs sha256(json.dumps(args, sort_keys))   target <= 1.5x
        call_hash of ~1 MB vs json.dumps(sort_keys) + sha256     target <= 0.5x
    (e) server cost: redis-benchmark -P 16, script vs return 1   target >= 0.25x

    The memory figure writes N short-lived keys under a dedicated prefix and
    clears them: run it only on a server you may fill.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from ..bench import STAGES, run_bench

    settings = app.settings()
    current_run.backend = redact_url(settings.url or "memory://")
    url = settings.url or "memory://"
    timeout = max(settings.timeout_seconds, 5.0)
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
        report = run_bench(url, quick=quick, sessions=sessions, timeout_seconds=timeout,
                           step=step, only=only)
    if as_json:
        emit_json(report.to_json())
        return
    terminal = sys.stdout.isatty()
    table = make_table("figure", "ours", "floor", "ratio", "target", "result",
                   title=f"distbrake bench ({'quick' if quick else 'full'}) on {report.backend}")
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
            console.print(Text(f"{figure.key}: {scrub(figure.note)}", style="dim" if terminal else ""))
