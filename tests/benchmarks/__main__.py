"""`python -m tests.benchmarks`: run the team's benchmark suite from a clone, print its table, exit 5 on a miss.

    python -m tests.benchmarks --url redis://127.0.0.1:6379/0 [--cluster-url redis+cluster://...] [--pin-cpu]
    python -m tests.benchmarks --quick --only sync_check_latency --json

The options, the table, the JSON and the exit codes are those `distbrake
bench` had while the suite shipped in the wheel: 0 every figure met its
target (or was skipped), 2 usage, 4 the server is not there, 5 a figure
missed its target or could not be measured. Errors are one line on stderr,
as the CLI's are (its `App` resolves the URL and settings, and its error
mapping reports them).
"""

from __future__ import annotations

import sys

import click
from rich.text import Text

from distbrake.cli import output
from distbrake.cli.app import App, global_options

from .suite import STAGES, BenchReport, parse_targets, run_bench

PROG = "python -m tests.benchmarks"
EXIT_TARGET = 5  # a figure missed its target or could not be measured


def _options() -> list[click.Option]:
    """The CLI's --url, --timeout, --key-prefix, --max-repeats and --json, stored on the run's `App`."""
    options = global_options(after_command=True)
    for option in options:
        option.help = (option.help or "").split(" Global:")[0]
    return options


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


@click.command("benchmarks", params=_options(),
               context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--quick", is_flag=True, help="A small run (a few seconds; noisier figures).")
@click.option("--sessions", metavar="N", default=None, type=click.IntRange(min=100),
              help="Sessions for the memory figure (default 20000; --quick 2000).")
@click.option("--only", "only", multiple=True, metavar="FIGURE", type=click.Choice(list(STAGES)),
              help="Measure only this figure (repeatable).")
@click.option("--pin-cpu", is_flag=True,
              help="Pin the bench and a local server to one CPU for sync_check_raw and sync_check_wire (the state of a "
                   "busy machine, reproduced steadily).")
@click.option("--cluster-url", metavar="URL", default=None,
              help="A redis+cluster:// URL for the Cluster figures (skipped without one).")
@click.option("--target", "targets", multiple=True, metavar="FIGURE=BOUND",
              help="Judge FIGURE against BOUND instead of its own target, in the same direction "
                   "(a ratio; bytes for memory_per_session), e.g. sync_check_latency=1.5 "
                   "(repeatable).")
@click.pass_obj
def bench_command(
    app: App, *, quick: bool, sessions: int | None, only: tuple[str, ...],
    targets: tuple[str, ...], as_json: bool, pin_cpu: bool, cluster_url: str | None,
) -> None:
    """The team's benchmark, against the server at --url, as ratios to that server's own floor.

    \b
    sync check vs redis-py EVALSHA `return 1`                    <= 1.2x
    sync check vs raw-socket EVALSHA `return 1` (--pin-cpu)      <= 1.6x
    sync check vs its own bytes from a raw socket (--pin-cpu)    <= 1.3x
    async 64 tasks vs unpipelined / pipelined EVALSHA            >= 2x / 1x
    async 1 task vs unpipelined; 4096 tasks vs 64 tasks          >= 1x; 0.9x
    Cluster async 64 tasks, sync 8 threads vs single node        >= 0.9x
    Redis memory per session, single node / Cluster              <= 240 / 265 B
    LoopBrake.check vs sha256(json.dumps(args, sort_keys))       <= 1.5x
    server cost per check, realistic path, vs return 1           >= 0.3x
    its script time vs a bare record script (read, write, TTL)   >= 0.8x
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
        from distbrake import DistributedBrake

        cluster = DistributedBrake.settings_for_url(cluster_url, None)
        if cluster.parsed_url.connector != "cluster":
            raise click.UsageError("--cluster-url must be a redis+cluster:// URL")
    with app.open() as brake:  # fail fast (exit 4) when the server is not there
        brake.ping()
    progress = Progress(
        TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
        console=output.make_console(stderr=True), transient=True, disable=as_json or not sys.stderr.isatty(),
    )
    tasks = {key: progress.add_task(stage.name, total=None) for key, stage in STAGES.items()
             if not only or key in only}

    def step(stage: str, done: int, total: int) -> None:
        if stage in tasks:
            progress.update(tasks[stage], completed=done, total=total)

    with progress:
        report = run_bench(settings, quick=quick, sessions=sessions, timeout_seconds=timeout,
                           step=step, only=only, targets=bounds, pin_cpu=pin_cpu, cluster=cluster)
    if as_json:
        output.emit_json(report.to_json())
    else:
        _print_report(app, report, quick)
    if not report.passed:
        raise click.exceptions.Exit(EXIT_TARGET)


def _print_report(app: App, report: BenchReport, quick: bool) -> None:
    terminal = sys.stdout.isatty()
    table = output.make_table("figure", "ours", "floor", "ratio", "target", "result",
                       title=Text(f"distbrake bench ({'quick' if quick else 'full'}) on "
                                  f"{output.escape_text(report.backend)}"))
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
    console = output.make_console()
    output.print_renderable(console, table)
    for figure in report.figures:
        if figure.note:
            console.print(Text(f"{figure.key}: {output.escape_text(output.scrub(figure.note, app.secrets))}",
                               style="dim" if terminal else ""))
    failed = [f.key for f in report.figures if f.passed is False]
    if failed:
        console.print(Text(f"missed: {', '.join(failed)} (exit {EXIT_TARGET})",
                           style="bold red" if terminal else ""))


def main(argv: list[str] | None = None) -> int:
    """Run the suite; every outcome becomes an exit code (and, for an error, one line on stderr)."""
    app = App()
    try:  # not standalone: click returns the exit code of `Exit` and raises the rest
        code = bench_command.main(args=argv, prog_name=PROG, standalone_mode=False, obj=app)
    except click.exceptions.Abort:  # Ctrl-C
        click.echo("interrupted", err=True)
        return 130
    except click.ClickException as error:  # usage errors: one line, exit 2, as the CLI reports them
        problem = output.CliError(output.one_line(error.format_message(), app.secrets) + f" (see: {PROG} --help)",
                                  output.EXIT_USAGE, "usage")
    except Exception as error:
        problem = output.as_cli_error(error, app)
    else:
        return code if isinstance(code, int) else 0
    return output.report_error(app, problem)


if __name__ == "__main__":
    sys.exit(main())
