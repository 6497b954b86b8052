"""The `demo` command: a small fleet with one stuck agent, shown live, then summed up."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.text import Text

from .app import App, command
from .demo_plan import AGENTS, STUCK_AGENT, STUCK_TOOL, default_calls, min_calls, plan_calls
from .output import (
    EXIT_BACKEND,
    EXIT_USAGE,
    CliError,
    emit_json,
    escape_text,
    make_console,
    make_table,
    print_renderable,
)

if TYPE_CHECKING:
    from .demo_plan import DemoOutcome, DemoReport


@command("demo")
@click.option("--workers", metavar="N", default=4, show_default=True,
              type=click.IntRange(2, 32), help="Workers in the fleet (processes on Redis, "
                                              "threads on memory://).")
@click.option("--calls", metavar="N", default=None, type=click.IntRange(2, 1000),
              help="Tool calls each of the 3 agents makes, so 3 x N in all; at least "
                   "max_repeats + 1, for the stuck agent to reach the limit (default: 8, or "
                   "max_repeats + 4 when that is more).")
@click.option("--keep", is_flag=True,
              help="Leave the demo's sessions in the store (see them with `distbrake list`).")
@click.option("--pace", metavar="SECONDS", default=None, type=click.FloatRange(0, 5),
              help="How long each allowed tool call runs (default: 0.05 on a terminal, else 0).")
def demo_command(
    app: App, *, workers: int, calls: int | None, keep: bool, pace: float | None, as_json: bool
) -> None:
    """A small fleet where one agent gets stuck repeating a call, and the brake stops it.

    Three agents make N calls each, dealt round-robin over the workers;
    agent "bravo" gets stuck after its first call. Each worker has its own brake; the streak is shared
    through the store, so the denial lands on a worker that saw fewer than
    max_repeats of the identical calls itself.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from .demo_fleet import run_demo  # multiprocessing: only when the demo runs

    settings = app.settings()
    terminal = sys.stdout.isatty()
    console = make_console()
    limit = settings.limit_for(STUCK_TOOL) or settings.max_repeats
    if calls is None:
        calls = default_calls(limit)
    elif calls < min_calls(limit):
        raise CliError(f"--calls {calls} is too few: with max_repeats {limit} the stuck agent "
                       f"needs at least {min_calls(limit)} calls to reach the limit",
                       EXIT_USAGE, "usage")
    sizes = {a: len(items) for a, items in plan_calls(workers, calls, limit, "x").items()}
    progress = Progress(
        TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[denied]}"),
        console=console, disable=as_json or not terminal,
    )
    tasks = {agent: progress.add_task(f"agent {agent}" + (" (stuck)" if agent == STUCK_AGENT else ""),
                                      total=sizes[agent], denied="") for agent in AGENTS}
    denied: dict[str, int] = dict.fromkeys(AGENTS, 0)
    started = False

    def on_progress(event: str, outcome: DemoOutcome | None) -> None:
        nonlocal started
        if event == "ready" and not started:
            started = True
            if not as_json:
                kind = ("threads (memory:// is private to one process)" if settings.parsed_url.kind == "memory"
                        else "processes")
                console.print(Text(f"demo: {workers} worker {kind} on {escape_text(app.backend)}; "
                                   f"agents {', '.join(AGENTS)} ({STUCK_AGENT} is stuck), "
                                   f"{calls} calls each; max_repeats {limit}"))
                progress.start()
            return
        if outcome is None:
            return
        if not outcome.allowed and outcome.error is None:
            denied[outcome.agent] += 1
            if not as_json:
                progress.console.print(Text(
                    f"  worker-{outcome.worker} denied agent {outcome.agent}: {outcome.tool} "
                    f"(call {outcome.hash_prefix}) is call {outcome.count} in a row, "
                    f"limit {outcome.limit}", style="red" if terminal else ""))
        progress.update(tasks[outcome.agent], advance=1,
                        denied=f"denied {denied[outcome.agent]}" if denied[outcome.agent] else "")

    try:
        report = run_demo(settings, workers=workers, calls=calls, keep=keep,
                          pace=(0.05 if terminal and not as_json else 0.0) if pace is None else pace,
                          progress=on_progress)
    finally:
        progress.stop()
    if as_json:
        emit_json(report.to_json())
    else:
        _print_demo(report, console, terminal, keep)
    if report.errors:
        raise CliError("demo workers could not reach the backend: " + "; ".join(report.errors),
                       EXIT_BACKEND, "unreachable")


def _print_demo(report: DemoReport, console: Console, terminal: bool, keep: bool) -> None:
    table = make_table("worker", "runs as",
                   "calls", "allowed", "denied", f"{report.stuck_agent}'s repeats", "denied agent",
                   title="fleet")
    for column in (2, 3, 4, 5):
        table.columns[column].justify = "right"
    for worker in report.workers:
        table.add_row(
            f"worker-{worker.worker}", worker.label, str(worker.calls), str(worker.allowed),
            Text(str(worker.denied), style="red" if terminal and worker.denied else ""),
            str(worker.stuck_calls), ", ".join(worker.denied_agents) or "-",
        )
    print_renderable(console, table)
    denied_on = sorted({f"worker-{o.worker}" for o in report.outcomes
                        if not o.allowed and o.error is None})
    console.print(Text(
        f"calls made: {report.calls}, denied: {report.denied} (on {', '.join(denied_on) or 'none'}), "
        f"in {report.elapsed_seconds:.2f} s"))
    if report.proof is not None:
        console.print(Text(report.proof.sentence(),
                           style=("bold green" if report.proof.holds else "yellow") if terminal else ""))
    if keep:
        console.print(Text("the demo's sessions were kept: distbrake list --match 'demo-*'"))
