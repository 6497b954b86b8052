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
from ..model import advance, judge
from ..redis.sync import DistributedBrake
from ..rules import strip_fields
from ..settings import tool_rules_from_environment
from .app import App, command
from .output import (
    EXIT_DENIED,
    EXIT_USAGE,
    CliError,
    emit_json,
    escape_text,
    make_console,
    memory_hint,
    quote_text,
)


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


@command("hash")
@click.argument("tool")
@click.argument("args_json", metavar="ARGS_JSON")
def hash_command(app: App, tool: str, args_json: str, as_json: bool) -> None:
    """The call hash of TOOL with ARGS_JSON ('-' reads stdin), computed locally.

    The 12-character prefix is what denials, logs, `inspect` and `list` show,
    so an operator can tell which arguments a denied call had. The tool's
    ignore_fields (DISTBRAKE_TOOLS) apply, as in the brake.
    """
    args = parse_args_json(args_json)
    rules = tool_rules_from_environment(tool)  # only DISTBRAKE_TOOLS: no other setting is needed here
    ignored = [] if rules.exempt else list(rules.ignore_fields)
    if ignored:
        args = strip_fields(args, tuple(tuple(path.split(".")) for path in ignored))
    digest = call_hash(tool, args)
    if as_json:
        data: dict[str, Any] = {"tool_name": tool, "call_hash": digest, "hash_prefix": hash_prefix(digest)}
        if ignored:  # only for a tool with ignore_fields: the shape of every other answer is unchanged
            data["ignored_fields"] = ignored
        emit_json(data)
        return
    click.echo(f"call_hash    {digest}\nhash_prefix  {hash_prefix(digest)}")
    if ignored:
        click.echo(f"ignored      {', '.join(quote_text(field) for field in ignored)} (the tool's ignore_fields)")


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
        "warned": isinstance(outcome, Verdict) and outcome.warning is not None,
        "would_deny": isinstance(outcome, Verdict) and outcome.would_deny,
        "dry_run": False,
    }


def _dry_run(
    app: App, brake: DistributedBrake, tool: str, args: Any, session: str, as_json: bool
) -> None:
    """What `check` would answer for this call, from the stored record alone: nothing is written.

    The call is prepared as the real check prepares it (the tool's rules and
    ignore_fields), counted against the stored record by the rule model's
    streak step (without a call id) and judged by the model. Exit 3 when it
    would be denied, else 0 (shadow mode denies nothing). A cycle is not
    predicted: the record's ring is not read.
    """
    settings = brake.settings
    call = brake.prepare(tool, args, session)
    state = brake.inspect(session)  # reads only (HMGET, PTTL, TIME)
    exempt = isinstance(call, Verdict)
    prefix = hash_prefix(call_hash(tool, args)) if exempt else call.hash_prefix
    same = state is not None and state.hash_prefix == prefix
    count, _ = advance(state.hash_prefix if state else None, state.count if state else 0, None, None, prefix, None)
    outcome = "allowed" if isinstance(call, Verdict) else judge(count, call.rules).outcome
    limit = None if isinstance(call, Verdict) else call.max_repeats
    denied = outcome == "denied"
    if limit is None:
        verdict = f"would be allowed: tool {quote_text(tool)} is exempt"
    elif denied:
        verdict = f"would be denied: call {count} in a row reaches limit {limit} (call {prefix})"
    elif outcome == "would_deny":
        verdict = (f"would be allowed: call {count} in a row reaches limit {limit}, not enforced "
                   f"(shadow mode) (call {prefix})")
    else:
        warned = " and warned" if outcome == "warned" else ""
        verdict = f"would be allowed{warned}: count {count} of limit {limit} (call {prefix})"
    if as_json:
        emit_json({
            "allowed": not denied, "count": count, "limit": limit, "hash_prefix": prefix,
            "session_id": session, "tool_name": tool, "replayed": False,
            "exempt": limit is None, "decided_by": "dry-run",
            "message": f"dry run: {verdict}" if denied else None,
            "warned": outcome == "warned", "would_deny": outcome == "would_deny",
            "dry_run": True, "stored_count": state.count if state is not None else 0,
            "same_call_stored": same,
        })
    else:
        stored = ("no streak stored" if state is None else
                  f"the stored streak is this call, count {state.count}" if same else
                  f"the stored streak is another call ({escape_text(state.tool_name)}, "
                  f"{escape_text(state.hash_prefix)}), count {state.count}")
        make_console().print(Text(f"{escape_text(verdict)}; {stored}; dry run: nothing counted",
                                  style="bold red" if denied and sys.stdout.isatty() else ""))
        memory_hint(app, settings)
    if denied:
        raise click.exceptions.Exit(EXIT_DENIED)


@command("check")
@click.argument("tool")
@click.argument("args_json", metavar="ARGS_JSON")
@click.option("--session", "session", required=True, metavar="S", help="The session (agent) id.")
@click.option("--call-id", "call_id", default=None, metavar="ID",
              help="The host's id of this call (a retry with the same id is counted once).")
@click.option("--dry-run", "dry_run", is_flag=True,
              help="Only say whether this call would be denied, from the stored streak (the "
                   "tool's rules; a cycle is not predicted): nothing is counted or written "
                   "(exit 3 would be denied, 0 allowed).")
def check_command(
    app: App, *, tool: str, args_json: str, session: str, call_id: str | None, dry_run: bool,
    as_json: bool,
) -> None:
    """Count one call of TOOL with ARGS_JSON in SESSION, exactly as a worker would.

    Exit 0 when allowed, 3 when denied, 4 when the backend is unavailable
    (this command never falls back to an in-process brake). With --dry-run
    nothing is counted: the answer is what an identical call would get now.
    """
    args = parse_args_json(args_json)
    if dry_run and call_id is not None:
        raise CliError("--call-id cannot be used with --dry-run (a dry run counts nothing, so "
                       "there is no call to replay)", EXIT_USAGE, "usage")
    with app.open(on_backend_error="closed") as brake:
        if dry_run:
            _dry_run(app, brake, tool, args, session, as_json)
            return
        try:
            verdict = brake.check(tool, args, session_id=session, call_id=call_id)
        except LoopBrakeError as error:
            if as_json:
                emit_json(_check_json(error))
            else:
                make_console().print(Text(escape_text(str(error)), style="bold red"))
                memory_hint(app, brake.settings)
            raise click.exceptions.Exit(EXIT_DENIED) from None
    if as_json:
        emit_json(_check_json(verdict))
        return
    if verdict.exempt:
        click.echo(f"allowed: tool {quote_text(tool)} is exempt (not counted)")
    else:
        replay = " (a replay of this call id: counted once)" if verdict.replayed else ""
        click.echo(f"allowed: count {verdict.count} of limit {verdict.max_repeats} "
                   f"(call {verdict.hash_prefix}){replay}")
    memory_hint(app, brake.settings)
