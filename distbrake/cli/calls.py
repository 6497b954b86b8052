"""The `hash` and `check` commands: one call's hash, and counting one call as a worker would."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import click
from rich.text import Text

from ..core import Verdict
from ..errors import LoopBrakeError
from ..identity import call_hash, hash_prefix
from .app import App, command
from .output import EXIT_DENIED, EXIT_USAGE, CliError, emit_json, make_console, memory_hint


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def parse_args_json(text: str) -> Any:
    """ARGS_JSON ('-': standard input) as a value; a usage error never echoes the input."""
    if text == "-":
        data: bytes = sys.stdin.buffer.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise CliError("ARGS_JSON on stdin is not UTF-8", EXIT_USAGE, "usage") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as error:
        raise CliError(
            f"ARGS_JSON is not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})",
            EXIT_USAGE, "usage",
        ) from None
    except ValueError as error:  # NaN, Infinity
        raise CliError(f"ARGS_JSON is not valid JSON: {error}", EXIT_USAGE, "usage") from None
    except RecursionError:
        raise CliError("ARGS_JSON is nested too deeply", EXIT_USAGE, "usage") from None


@command("hash", short_help='The call hash of TOOL + ARGS_JSON, computed locally.')
@click.argument("tool")
@click.argument("args_json", metavar="ARGS_JSON")
def hash_command(app: App, tool: str, args_json: str, as_json: bool) -> None:
    """The call hash of TOOL with ARGS_JSON ('-' reads stdin), computed locally.

    The 12-character prefix is what denials, logs, `inspect` and `list` show,
    so an operator can tell which arguments a denied call had.
    """
    args = parse_args_json(args_json)
    digest = call_hash(tool, args)
    if as_json:
        emit_json({"tool_name": tool, "call_hash": digest, "hash_prefix": hash_prefix(digest)})
        return
    click.echo(f"call_hash    {digest}\nhash_prefix  {hash_prefix(digest)}")


def _check_json(outcome: Verdict | LoopBrakeError) -> dict[str, Any]:
    """`check --json`: the verdict of an allowed call, or the error of a denied one, in one shape."""
    allowed = isinstance(outcome, Verdict)
    return {
        "allowed": allowed, "count": outcome.count, "limit": outcome.max_repeats,
        "hash_prefix": outcome.hash_prefix, "session_id": outcome.session_id,
        "tool_name": outcome.tool_name,
        "replayed": isinstance(outcome, Verdict) and outcome.replayed,
        "exempt": isinstance(outcome, Verdict) and outcome.exempt,
        # on_backend_error="closed": only the Redis step (memory:// included) can deny
        "decided_by": outcome.decided_by if isinstance(outcome, Verdict) else "redis",
        "message": None if allowed else str(outcome),
    }


@command("check", short_help='Count one call as a worker would (exit 3 when denied).')
@click.argument("tool")
@click.argument("args_json", metavar="ARGS_JSON")
@click.option("--session", "session", required=True, metavar="S", help="The session (agent) id.")
@click.option("--call-id", "call_id", default=None, metavar="ID",
              help="The host's id of this call (a retry with the same id is counted once).")
def check_command(
    app: App, *, tool: str, args_json: str, session: str, call_id: str | None, as_json: bool
) -> None:
    """Count one call of TOOL with ARGS_JSON in SESSION, exactly as a worker would.

    Exit 0 when allowed, 3 when denied, 4 when the backend is unavailable
    (this command never falls back to an in-process brake).
    """
    args = parse_args_json(args_json)
    with app.open(on_backend_error="closed") as brake:
        try:
            verdict = brake.check(tool, args, session_id=session, call_id=call_id)
        except LoopBrakeError as error:
            if as_json:
                emit_json(_check_json(error))
            else:
                make_console().print(Text(str(error), style="bold red"))
                memory_hint(app, brake.settings)
            raise click.exceptions.Exit(EXIT_DENIED) from None
    if as_json:
        emit_json(_check_json(verdict))
        return
    if verdict.exempt:
        click.echo(f"allowed: tool {tool!r} is exempt (not counted)")
    else:
        replay = " (a replay of this call id: counted once)" if verdict.replayed else ""
        click.echo(f"allowed: count {verdict.count} of limit {verdict.max_repeats} "
                   f"(call {verdict.hash_prefix}){replay}")
    memory_hint(app, brake.settings)
