"""The console script: run the command group, turn every outcome into an exit code and one line."""

from __future__ import annotations

import contextlib
import logging
import os
import sys

import click

from .command_group import cli
from .command_helpers import emit_json
from .exit_codes import EXIT_OK, EXIT_USAGE, CliError, as_cli_error
from .run_state import current_run, one_line


def _report_error(error: CliError) -> int:
    message = one_line(str(error))
    if current_run.json:
        emit_json({"error": {"exit_code": error.code, "kind": error.kind, "message": message}})
    click.echo(f"distbrake: {message}", err=True)
    return error.code


def _quiet_library_logs() -> None:
    # The CLI reports denials and failures itself; keep the library's warnings
    # (which go to stderr when logging is not configured) out of its output.
    log = logging.getLogger("distbrake")
    if not log.handlers:
        log.addHandler(logging.NullHandler())


def main(argv: list[str] | None = None) -> None:
    """The `distbrake` console script: run the CLI and exit with its code."""
    _quiet_library_logs()
    code = _run_cli(argv)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    sys.exit(code)


def _run_cli(argv: list[str] | None) -> int:
    try:
        result = cli.main(args=argv, prog_name="distbrake", standalone_mode=False)
    except click.exceptions.Exit as done:
        return int(done.exit_code)
    except click.exceptions.Abort:
        click.echo("distbrake: interrupted", err=True)
        return 130
    except click.ClickException as error:  # usage errors: one line, exit 2
        no_args = getattr(click.exceptions, "NoArgsIsHelpError", None)
        if no_args is not None and isinstance(error, no_args) and error.ctx is not None:
            click.echo(error.ctx.get_help())  # bare `distbrake`: the help, as usage (exit 2)
            return EXIT_USAGE
        message = one_line(error.format_message())
        if isinstance(error, click.UsageError) and error.ctx is not None:
            message += f" (see: {error.ctx.command_path} --help)"
        return _report_error(CliError(message, EXIT_USAGE if error.exit_code == 2 else
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
        return _report_error(as_cli_error(error))
    return result if isinstance(result, int) and not isinstance(result, bool) else EXIT_OK
