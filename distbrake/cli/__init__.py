"""The `distbrake` command line: the console script `main`, and the command group with its global options.

    distbrake [--url URL] [--timeout S] [--key-prefix P] [--max-repeats N] [--json] COMMAND ...

Commands: inspect, list, clear, hash, check, doctor, bench, demo, stats, top, hook, serve, proxy. The global
options may also follow the command name (`distbrake list --url ... --json`);
given on both sides, the one after the command wins.

Exit codes (stable):

    0  ok (check: the call was allowed)
    1  not found (inspect: no such session)
    2  usage error (bad option or argument, invalid ARGS_JSON, clear --all without --yes)
    3  denied (check: the call would be the Nth identical one in a row)
    4  backend unreachable or misconfigured (connection, timeout, credentials,
       permissions, a bad URL or setting; doctor: something is wrong)
    70 internal error (a bug: please report it)

Errors are one line on stderr (with --json, also `{"error": {...}}` on
stdout), never a traceback, never a password.

The run's state is an `App` (app.py) on click's `ctx.obj`; output.py prints
and maps errors to exit codes; each other module is one group of commands,
imported only when one of its commands runs (`--help` and `--version` load no
Redis client, no pydantic and no rich).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import sys
import warnings
from typing import Any

import click

from .._version import __version__
from .app import COMMANDS, App, global_options

__all__ = ["EXIT_CODES", "App", "CliError", "cli", "main"]

EXIT_OK, EXIT_USAGE = 0, 2  # as output.EXIT_CODES has them (a test checks)


def __getattr__(name: str) -> Any:
    if name in ("EXIT_CODES", "CliError"):
        from . import output

        return getattr(output, name)
    raise AttributeError(f"module 'distbrake.cli' has no attribute {name!r}")


class _Commands(click.Group):
    """The commands of `COMMANDS`, each imported when it is looked up to run."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        found: click.Command = getattr(importlib.import_module(f".{entry[0]}", __name__), f"{cmd_name}_command")
        return found

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_text) for name, (_, help_text) in COMMANDS.items()])


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             params=global_options(after_command=False))
@click.version_option(__version__, "-V", "--version", prog_name="distbrake",
                      message="%(prog)s %(version)s")
@click.pass_context
def cli(
    ctx: click.Context, *, url: str | None, timeout: float | None, key_prefix: str | None,
    max_repeats: int | None, as_json: bool,
) -> None:
    """Inspect, clear and check the loop brake's streaks; diagnose, benchmark, demo.

    \b
    Exit codes: 0 ok/allowed, 1 not found, 2 usage, 3 denied,
    4 backend unreachable or misconfigured, 70 internal error.
    """
    app = ctx.ensure_object(App)  # made by `main`; a bare `cli(...)` call gets a fresh one
    for name, value in (("url", url), ("timeout", timeout), ("key_prefix", key_prefix),
                        ("max_repeats", max_repeats)):
        app.set_option(name, value)  # a command's own --url etc. (parsed later) wins
    app.env_url = os.environ.get("DISTBRAKE_URL")
    app.want_json(as_json)



def _quiet_library_logs() -> None:
    # The CLI reports denials and failures itself; keep the library's warnings
    # (which go to stderr when logging is not configured) out of its output.
    log = logging.getLogger("distbrake")
    if not log.handlers:
        log.addHandler(logging.NullHandler())
    # and the brake's once-per-brake RuntimeWarning of a check decided by the policy (policy.WARNING_START)
    warnings.filterwarnings("ignore", message="distbrake: a check fell to the failure policy", category=RuntimeWarning)


def main(argv: list[str] | None = None) -> None:
    """The `distbrake` console script: run the CLI and exit with its code."""
    _quiet_library_logs()
    code = _run_cli(App(), argv)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    sys.exit(code)


def _run_cli(app: App, argv: list[str] | None) -> int:
    """Run the group with `app` as its state; every outcome becomes an exit code (and one line)."""
    try:
        result = cli.main(args=argv, prog_name="distbrake", standalone_mode=False, obj=app)
    except click.exceptions.Exit as done:
        return int(done.exit_code)
    except click.exceptions.Abort:
        click.echo("distbrake: interrupted", err=True)
        return 130
    except click.ClickException as error:  # usage errors: one line, exit 2
        from .output import CliError, one_line, report_error

        no_args = getattr(click.exceptions, "NoArgsIsHelpError", None)
        if no_args is not None and isinstance(error, no_args) and error.ctx is not None:
            click.echo(error.ctx.get_help())  # bare `distbrake`: the help, as usage (exit 2)
            return EXIT_USAGE
        message = one_line(error.format_message(), app.secrets)
        if isinstance(error, click.UsageError) and error.ctx is not None:
            message += f" (see: {error.ctx.command_path} --help)"
        return report_error(app, CliError(message, EXIT_USAGE if error.exit_code == 2 else
                                          error.exit_code, "usage"))
    except KeyboardInterrupt:
        click.echo("distbrake: interrupted", err=True)
        return 130
    except BrokenPipeError:
        # The reader went away (`distbrake list | head`): not an error of ours.
        with contextlib.suppress(Exception):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as error:
        from .output import as_cli_error, report_error

        return report_error(app, as_cli_error(error, app))
    return result if isinstance(result, int) and not isinstance(result, bool) else EXIT_OK
