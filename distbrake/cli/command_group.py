"""The `distbrake` command group: its global options, with every command attached."""

from __future__ import annotations

import os

import click

from .. import __version__
from .bench_command import bench_command
from .call_commands import check_command, hash_command
from .command_helpers import remember_json_flag
from .demo_command import demo_command
from .doctor_command import doctor_command
from .global_options import App
from .run_state import remember_secrets
from .session_commands import clear_command, inspect_command, list_command


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--url", metavar="URL", default=None,
              help="Backend URL (default: $DISTBRAKE_URL, else memory://). Passwords are never shown.")
@click.option("--timeout", "timeout", metavar="SECONDS", default=None,
              type=click.FloatRange(0, 60, min_open=True),
              help="Longest wait for Redis, per operation (default: $DISTBRAKE_TIMEOUT_SECONDS, "
                   "else 0.5).")
@click.option("--key-prefix", metavar="PREFIX", default=None,
              help="Key prefix of the brake (default: $DISTBRAKE_KEY_PREFIX, else distbrake).")
@click.option("--max-repeats", metavar="N", default=None, type=click.IntRange(min=1),
              help="The limit to judge streaks by (default: $DISTBRAKE_MAX_REPEATS, else 3).")
@click.option("--json", "as_json", is_flag=True, help="JSON output for the command.")
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
    remember_json_flag(as_json)
    remember_secrets(url)
    remember_secrets(os.environ.get("DISTBRAKE_URL"))
    ctx.obj = App(url=url, timeout=timeout, key_prefix=key_prefix, max_repeats=max_repeats)


for _command in (inspect_command, list_command, clear_command, hash_command, check_command,
                 doctor_command, bench_command, demo_command):
    cli.add_command(_command)
