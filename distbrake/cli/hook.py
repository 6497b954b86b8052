"""`distbrake hook <host>`: a coding agent's pre/post tool hook (stdin: the host's event, stdout: its answer).

The plain form runs without click (hosts/command.py, reached from
`distbrake/__main__.py`); this command declares the same options for `--help`,
and runs `--self-test` and any form the fast parser leaves to click.
"""

from __future__ import annotations

import sys

import click

from ..hosts import HOSTS
from ..hosts.command import emit, read_event
from ..hosts.run import HookOptions, run_hook, self_test
from .app import App, command


@command("hook")
@click.argument("host", type=click.Choice(HOSTS))
@click.option("--on-error", type=click.Choice(["allow", "deny"]), default="allow", show_default=True,
              help="Input the hook cannot read, or a brake that fails: allow the call (and say so on stderr), "
                   "or deny it (fail-closed).")
@click.option("--scope", type=click.Choice(["session", "run"]), default="session", show_default=True,
              help="Count per host session, or per turn (Claude Code prompt_id, Codex turn_id, Cursor "
                   "generation_id; hosts without one: per session).")
@click.option("--store", metavar="PATH", default=None,
              help="The streak file used without DISTBRAKE_URL (default: $XDG_CACHE_HOME/distbrake/"
                   "streaks.sqlite3, else ~/.cache/distbrake/streaks.sqlite3).")
@click.option("--self-test", "run_self_test", is_flag=True,
              help="Send the host's documented example event until it is denied, on the configured backend "
                   "(a private session, cleared afterwards); exit 4 when the answers are wrong.")
def hook_command(
    app: App, host: str, on_error: str, scope: str, store: str | None, run_self_test: bool, as_json: bool
) -> None:
    """Answer one hook event of HOST (claude-code, codex, gemini, cursor) read from stdin.

    \b
    Allowed calls answer nothing the host acts on; the Nth identical call in a
    row is denied in the host's own shape, with the brake's text for the model.
    Unreadable input is allowed with one line on stderr (exit 0) unless
    --on-error deny.
    """
    options = HookOptions(
        app.url, app.timeout, app.key_prefix, app.max_repeats, on_error,  # type: ignore[arg-type]
        scope, store,  # type: ignore[arg-type]
    )
    if run_self_test:
        passed, line = self_test(host, options)
        click.echo(line)
        click.get_current_context().exit(0 if passed else 4)
    code = emit(run_hook(host, read_event(sys.stdin.buffer), options), sys.stdout, sys.stderr)
    click.get_current_context().exit(code)
