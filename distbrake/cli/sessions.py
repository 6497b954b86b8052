"""The `inspect`, `list` and `clear` commands: read and forget the streaks, and how a streak is shown."""

from __future__ import annotations

import heapq
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from ..core import SessionState
from ..model import Halt, Rules, judge
from ..operator import KillState
from ..settings import BrakeSettings
from .app import App, command
from .output import (
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    CliError,
    emit_json,
    escape_text,
    make_console,
    make_table,
    memory_hint,
    print_renderable,
    quote_text,
)

# -- a streak as JSON fields and as short text ------------------------------------------------------


def _limit(settings: BrakeSettings, tool: str) -> tuple[int | None, str]:
    limit = settings.limit_for(tool)
    if limit is None:
        return None, "exempt"
    if tool in settings.tool_max_repeats:
        return limit, "tool_max_repeats"
    return limit, "max_repeats"


def iso_time(timestamp: float) -> str:
    if not timestamp:
        return ""
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds").replace(
        "+00:00", "Z")


def span_text(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


def by_operator(halt: Halt) -> bool:
    return halt.kind in ("block", "kill")


def halt_json(halt: Halt | None) -> dict[str, Any] | None:
    """A halt's JSON fields (None: not halted)."""
    if halt is None:
        return None
    return {
        "kind": halt.kind, "by": "operator" if by_operator(halt) else "rule", "since": halt.since,
        "since_iso": iso_time(halt.since), "who": halt.who, "reason": halt.reason, "tool_name": halt.tool_name,
        "count": halt.count, "limit": halt.limit,
    }


def kill_json(kill: KillState | None) -> dict[str, Any] | None:
    """The kill switch's JSON fields (None: not set)."""
    return None if kill is None else {**(halt_json(kill.halt) or {}), "ttl_seconds": kill.ttl_seconds}


def halt_word(halt: Halt) -> str:
    """BLOCKED (an operator's) or HALTED (a rule's)."""
    return "BLOCKED" if by_operator(halt) else "HALTED"


def _why(halt: Halt, now: float) -> str:
    """Who or what halted, why, and since when (escaped): " by ops: reason, since ..."."""
    if by_operator(halt):
        why = (f" by {escape_text(halt.who)}" if halt.who else "") + (
            f": {escape_text(halt.reason)}" if halt.reason else "")
    elif halt.kind == "repeat":
        why = f" by the streak rule ({escape_text(halt.tool_name)} {halt.count} times in a row, halt_at {halt.limit})"
    else:
        why = f" by the cycle rule (a cycle repeated {halt.limit} times)"
    return why + (f", since {iso_time(halt.since)} ({span_text(now - halt.since)} ago)" if halt.since else "")


def halt_text(halt: Halt, now: float) -> str:
    """A session's halt as text (escaped)."""
    return halt_word(halt) + _why(halt, now)


def kill_text(kill: KillState, now: float) -> str:
    """The kill switch as a line (escaped)."""
    return (f"KILL SWITCH SET{_why(kill.halt, now)}: every check of every session is refused "
            f"({ttl_text(kill.ttl_seconds)}; distbrake unblock --all lifts it)")


def state_json(state: SessionState, settings: BrakeSettings, what_if: bool = False) -> dict[str, Any]:
    """A session's state with its limit and what the next identical call would get.

    The rules are the ones the record says its last check was judged by (what
    the fleet decided); an explicit `--max-repeats` (`what_if`) judges by that
    limit instead, and a record from before records kept them by this run's
    settings. The judgements are the rule model's: `denying` only when calls
    are really denied (a shadow session `would_deny`).
    """
    rules = state.rules
    source = "record"
    if rules is None:
        rules = settings.rules_for(state.tool_name)
        source = _limit(settings, state.tool_name)[1]
    if what_if:
        base = rules or Rules(settings.max_repeats)
        rules, source = Rules(settings.max_repeats, None, base.enforce), "what-if"
    now = None if rules is None else judge(state.count, rules).outcome
    following = None if rules is None else judge(state.count + 1, rules).outcome
    return {
        "session_id": state.session_id,
        "tool_name": state.tool_name,
        "hash_prefix": state.hash_prefix,
        "count": state.count,
        "limit": None if rules is None else rules.max_repeats,
        "limit_source": source,
        "denying": now == "denied",
        "would_deny": now == "would_deny",
        "next_denied": following == "denied",
        "next_would_deny": following == "would_deny",
        "max_repeats": state.max_repeats,
        "enforcing": state.enforcing,
        "state": halt_word(state.halt).lower() if state.halt is not None else state.state,
        "halted": state.halted,
        "halt": halt_json(state.halt),
        "ttl_seconds": state.ttl_seconds,
        "updated_at": state.updated_at,
        "updated_at_iso": iso_time(state.updated_at),
    }


def status_text(data: Mapping[str, Any]) -> Text:
    halt = data["halt"]
    if halt is not None:
        why = f" by {halt['who']}" if halt["who"] else ""
        why += f": {halt['reason']}" if halt["reason"] else ""
        word = "BLOCKED" if halt["by"] == "operator" else f"HALTED ({halt['kind']})"
        return Text(escape_text(word + why)[:60], style="bold red")
    if data["denying"]:
        return Text("DENYING", style="bold red")
    if data["would_deny"]:
        return Text("would deny (shadow)", style="yellow")
    if data["next_denied"]:
        return Text("next denied", style="yellow")
    if data["limit"] is None:
        return Text("exempt", style="dim")
    return Text("")


def limit_text(data: Mapping[str, Any]) -> str:
    if data["limit"] is None:
        return "none (tool is exempt)"
    if data["limit_source"] == "record":
        shadow = "" if data["enforcing"] is not False else ", shadow mode: not enforced"
        return f"{data['limit']} (the limit its last check was judged by{shadow})"
    if data["limit_source"] == "what-if":
        return f"{data['limit']} (what if: --max-repeats)"
    if data["limit_source"] == "tool_max_repeats":
        return f"{data['limit']} (per-tool limit for {escape_text(data['tool_name'])})"
    return f"{data['limit']} (max_repeats)"


def ttl_text(ttl: float | None) -> str:
    return "no expiry" if ttl is None else f"{span_text(ttl)} left"


# -- inspect -----------------------------------------------------------------------------------


@command("inspect")
@click.argument("session")
def inspect_command(app: App, session: str, as_json: bool) -> None:
    """Show SESSION's streak: tool, call hash prefix, count, limit, TTL, last update.

    Exit 1 when the session has no streak (never seen, cleared or expired).
    """
    with app.open() as brake:
        state = brake.inspect(session)
        settings = brake.settings
        kill = brake.kill_switch()
    if state is None:
        if as_json:
            emit_json({"found": False, "session_id": session, "kill_switch": kill_json(kill)})
        else:
            if kill is not None:
                make_console().print(Text(kill_text(kill, time.time())))
            make_console(stderr=True).print(Text(
                f"distbrake: no streak for session {quote_text(session)} in "
                f"{escape_text(app.backend)} (prefix {quote_text(settings.key_prefix)}): never "
                "seen, cleared, or expired"))
            memory_hint(app, settings)
        raise click.exceptions.Exit(EXIT_NOT_FOUND)
    data = state_json(state, settings, what_if=app.max_repeats is not None)
    if as_json:
        emit_json({"found": True, **data, "kill_switch": kill_json(kill)})
        return
    now = time.time()
    if kill is not None:
        make_console().print(Text(kill_text(kill, now)))
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold" if sys.stdout.isatty() else "")
    grid.add_column()
    grid.add_row("session", Text(escape_text(state.session_id)))
    grid.add_row("tool", Text(escape_text(state.tool_name)))
    grid.add_row("call", Text(f"{escape_text(state.hash_prefix)}  (hash prefix; `distbrake hash` "
                              "computes it)"))
    grid.add_row("count", Text(f"{state.count} identical call(s) in a row"))
    grid.add_row("limit", Text(limit_text(data)))
    if state.halt is not None:
        grid.add_row("halt", Text(halt_text(state.halt, now), style="bold red"))
    if state.halt is not None:
        verdict = Text("REFUSED: the session is halted (any tool); distbrake unblock lifts it", style="bold red")
    elif data["limit"] is None:
        verdict = Text("allowed (the tool is exempt)")
    elif data["next_denied"]:
        verdict = Text(
            f"DENIED: an identical call now would be call {state.count + 1} in a row "
            f"(count + 1 >= limit {data['limit']})", style="bold red")
    elif data["next_would_deny"]:
        verdict = Text(
            f"allowed, not enforced (shadow mode): an identical call now would be call {state.count + 1} "
            f"in a row (count + 1 >= limit {data['limit']})", style="yellow")
    else:
        verdict = Text(
            f"allowed: an identical call now would be call {state.count + 1} of "
            f"{data['limit']} (denied from {data['limit']})", style="green")
    grid.add_row("next identical", verdict)
    grid.add_row("ttl", Text(ttl_text(state.ttl_seconds)))
    grid.add_row("last update", Text(
        f"{iso_time(state.updated_at)} ({span_text(now - state.updated_at)} ago)" if state.updated_at
        else "unknown"))
    print_renderable(make_console(), grid)


# -- list ---------------------------------------------------------------------------------------


@command("list")
@click.option("--match", "match", metavar="GLOB", default=None,
              help="Only session ids matching this glob (fnmatch, case-sensitive).")
@click.option("--min-count", metavar="N", default=1, show_default=True,
              type=click.IntRange(min=1), help="Only streaks of at least N identical calls.")
@click.option("--limit", "limit", metavar="N", default=50, show_default=True,
              type=click.IntRange(min=0), help="Show at most N sessions (0: all).")
def list_command(
    app: App, match: str | None, min_count: int, limit: int, as_json: bool
) -> None:
    """Sessions with streaks, longest first; streaks at or over the limit are flagged.

    Uses SCAN (never KEYS), on one node or every node of a cluster.
    """
    matched = 0

    def wanted(states: Iterator[SessionState]) -> Iterator[SessionState]:
        nonlocal matched
        for state in states:
            if state.count >= min_count or state.halted:
                matched += 1
                yield state

    def order(state: SessionState) -> tuple[bool, int, float, str]:
        return (state.halted, state.count, state.updated_at, state.session_id)

    with app.open() as brake:
        settings = brake.settings
        kill = brake.kill_switch()
        found = wanted(brake.sessions(match))
        top = heapq.nlargest(limit, found, key=order) if limit else sorted(
            found, key=order, reverse=True)
    rows = [state_json(state, settings, what_if=app.max_repeats is not None) for state in top]
    if as_json:
        emit_json({
            "sessions": rows, "matched": matched, "shown": len(rows),
            "truncated": matched > len(rows), "match": match, "min_count": min_count,
            "key_prefix": settings.key_prefix, "max_repeats": settings.max_repeats,
            "halted": sum(1 for row in rows if row["halted"]), "kill_switch": kill_json(kill),
        })
        return
    console = make_console()
    if kill is not None:
        console.print(Text(kill_text(kill, time.time())))
    if not rows:
        console.print(Text(
            f"no streaks in {escape_text(app.backend)} (prefix {quote_text(settings.key_prefix)}"
            + (f", match {quote_text(match)}" if match else "")
            + (f", min count {min_count}" if min_count > 1 else "") + ")"))
        memory_hint(app, settings)
        return
    now = time.time()
    table = make_table("session", "tool", "call", "count", "limit", "status", "ttl", "updated")
    for column in (3, 4):
        table.columns[column].justify = "right"
    for data in rows:
        table.add_row(
            Text(escape_text(data["session_id"])), Text(escape_text(data["tool_name"])),
            Text(escape_text(data["hash_prefix"])),
            str(data["count"]), "-" if data["limit"] is None else str(data["limit"]),
            status_text(data),
            "none" if data["ttl_seconds"] is None else span_text(data["ttl_seconds"]),
            f"{span_text(now - data['updated_at'])} ago" if data["updated_at"] else "",
        )
    print_renderable(console, table)
    denying = sum(1 for d in rows if d["denying"] and not d["halted"])
    halted = sum(1 for d in rows if d["halted"])
    summary = f"{len(rows)} of {matched} session(s) shown"
    if matched > len(rows):
        summary += " (halted, then longest first; --limit 0 shows all)"
    if halted:
        summary += f"; {halted} halted or blocked (every check of them is refused; distbrake unblock lifts it)"
    if denying:
        summary += f"; {denying} at or over the limit (their identical calls are being denied)"
    console.print(Text(summary))


# -- clear ---------------------------------------------------------------------------------------


GLOB_CHARS = frozenset("*?[")


def check_targets(sessions: tuple[str, ...], match: str | None, every: bool, all_flag: str) -> None:
    """The usage rule `block`, `unblock` and `clear` share: SESSION names and/or --match, or `all_flag`."""
    if every and (sessions or match is not None):
        raise click.UsageError("give SESSION names (or --match) or --all, not both")
    if not every and not sessions and match is None:
        raise click.UsageError(f"name at least one SESSION, or use --match GLOB, or {all_flag}")


@command("clear")
@click.argument("sessions", nargs=-1, metavar="[SESSION]...")
@click.option("--match", "match", metavar="GLOB", default=None,
              help="Also every existing session whose id matches this glob (fnmatch, case-sensitive); more than "
                   "one needs --yes.")
@click.option("--all", "clear_all", is_flag=True, help="Clear every session under the key prefix.")
@click.option("--yes", is_flag=True, help="Confirm --all, or a --match of more than one session.")
def clear_command(
    app: App, sessions: tuple[str, ...], match: str | None, clear_all: bool, yes: bool, as_json: bool
) -> None:
    """Forget the streaks of SESSION... (and of the sessions matching --match GLOB, or of every session with
    --all --yes); a halt is lifted with its record.

    Clearing a session that has no streak is not an error; the count says
    how many streaks were actually removed. A SESSION with a glob character
    (* ? [) that names no session exits 1: use --match for a pattern.
    """
    check_targets(sessions, match, clear_all, "--all --yes")
    if clear_all and not yes:
        settings = app.settings()
        raise CliError(
            f"refusing to clear every session under prefix {quote_text(settings.key_prefix)} on "
            f"{settings.shown_url} without --yes",
            EXIT_USAGE, "usage",
        )
    matched: int | None = None
    with app.open() as brake:
        settings = brake.settings
        if clear_all:
            cleared = brake.clear_all()
            results: dict[str, bool] | None = None
        else:
            if match is not None and not yes and (would := sum(1 for _ in brake.sessions(match))) > 1:
                raise CliError(
                    f"refusing to clear {would} sessions matching {quote_text(match)} under prefix "
                    f"{quote_text(settings.key_prefix)} on {settings.shown_url} without --yes", EXIT_USAGE, "usage")
            results = {session: brake.clear(session) for session in dict.fromkeys(sessions)}
            matched = None if match is None else brake.clear_matching(match)
            cleared = sum(results.values()) + (matched or 0)
    globs = [s for s, done in (results or {}).items() if not done and GLOB_CHARS.intersection(s)]
    if as_json:
        data: dict[str, Any] = {"cleared": cleared, "all": clear_all,
                                "key_prefix": settings.key_prefix}
        if results is not None:
            data["sessions"] = results
            data["match"], data["matched"], data["not_named"] = match, matched, globs
        emit_json(data)
        if globs:
            raise click.exceptions.Exit(EXIT_NOT_FOUND)
    elif results is None:
        click.echo(f"cleared {cleared} session(s) under prefix {quote_text(settings.key_prefix)} "
                   f"on {escape_text(app.backend)}")
    else:
        missing = [s for s, done in results.items() if not done and s not in globs]
        parts = []
        if len(results) > len(globs):
            parts.append(f"cleared {cleared - (matched or 0)} of {len(results) - len(globs)} session(s)" + (
                " (no streak: " + ", ".join(quote_text(s) for s in missing) + ")" if missing else ""))
        if match is not None:
            parts.append(f"cleared {matched} session(s) matching {quote_text(match)}")
        if parts:
            click.echo("; ".join(parts))
    if globs:
        raise CliError("; ".join(f"no session is named {quote_text(s)}" for s in globs)
                       + "; to clear by pattern use --match", EXIT_NOT_FOUND, "not_found")
    memory_hint(app, settings)
