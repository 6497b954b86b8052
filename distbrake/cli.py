"""The `distbrake` command line (see README, "CLI").

    distbrake [--url URL] [--timeout S] [--key-prefix P] [--max-repeats N] COMMAND ...

Commands: inspect, list, clear, hash, check, doctor, bench, demo. Every
command that reports takes `--json` (before or after the command name).

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
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar
from urllib.parse import quote, unquote

import click
import redis.exceptions
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import __version__
from .base import SessionState
from .errors import (
    BrakeUnavailableError,
    ConfigurationError,
    DistbrakeError,
    LoopBrakeError,
    UnsupportedArgumentsError,
)
from .identity import call_hash, hash_prefix
from .redis_brake import DistributedBrake
from .settings import BrakeSettings, value_sources
from .slot import FIELDS, script_source
from .urls import parse_url, redact_url

if TYPE_CHECKING:
    from .demo import DemoReport

__all__ = ["EXIT_CODES", "cli", "main"]

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_DENIED = 3
EXIT_BACKEND = 4
EXIT_INTERNAL = 70
EXIT_CODES = {
    EXIT_OK: "ok (check: allowed)",
    EXIT_NOT_FOUND: "not found (inspect: no such session)",
    EXIT_USAGE: "usage error",
    EXIT_DENIED: "denied (check)",
    EXIT_BACKEND: "backend unreachable or misconfigured",
    EXIT_INTERNAL: "internal error (a bug)",
}

F = TypeVar("F", bound=Callable[..., Any])



# -- run-wide state: output mode and the secrets to keep out of every message ---------------


@dataclass
class _Run:
    json: bool = False
    secrets: set[str] = field(default_factory=set)
    backend: str = "memory://"
    timeout: float = 0.5


_run = _Run()

_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def _remember_secrets(url: str | None) -> None:
    """Note the password (and sentinel password) of `url`, in every spelling a message may use."""
    if not url:
        return
    try:
        parsed = parse_url(url)
    except DistbrakeError:
        match = re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://[^@/?#]*?:([^@/?#]*)@", url)
        candidates = [match.group(1)] if match else []
    else:
        candidates = [parsed.password or "", parsed.options.get("sentinel_password", "")]
    for secret in candidates:
        if len(secret) >= 3:
            _run.secrets.update({secret, unquote(secret), quote(secret, safe="")})


def scrub(text: str) -> str:
    """`text` with URL passwords redacted and every known secret replaced by ***."""
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    for secret in sorted(_run.secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return text


def _one_line(text: str) -> str:
    return scrub(" ".join(str(text).split()))


# -- output ---------------------------------------------------------------------------------


def _console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    terminal = stream.isatty()
    # Colour and box drawing only on a terminal; piped output is plain, wide text.
    return Console(
        file=stream, highlight=False, emoji=False, soft_wrap=not terminal,
        width=None if terminal else int(os.environ.get("COLUMNS", "0") or 0) or 200,
    )


def _table(*columns: str, title: str | None = None) -> Table:
    terminal = sys.stdout.isatty()
    return Table(
        *columns, title=title, box=box.SIMPLE_HEAD if terminal else None,
        show_edge=False, pad_edge=False, header_style="bold" if terminal else "",
        title_justify="left", title_style="bold" if terminal else "",
    )


def _print(console: Console, renderable: Any) -> None:
    """Print a rich renderable; piped, without the padding rich puts at line ends."""
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable)
    lines = captured.get().splitlines()
    console.file.write("".join(line.rstrip() + "\n" for line in lines))


def _emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def _note(text: str) -> None:
    """A hint for a human (stderr), never in --json output."""
    if not _run.json:
        _console(stderr=True).print(Text(_one_line(text), style="dim"))


# -- errors -------------------------------------------------------------------------------


class CliError(Exception):
    """An error the CLI reports as one line with an exit code."""

    def __init__(self, message: str, code: int, kind: str = "error") -> None:
        super().__init__(message)
        self.code = code
        self.kind = kind


def _backend_problem(error: BaseException) -> tuple[str, str, str]:
    """(kind, what happened, the fix) for a backend failure, password-free."""
    backend, timeout = _run.backend, _run.timeout
    if isinstance(error, BrakeUnavailableError) and error.__cause__ is not None:
        error = error.__cause__
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, redis.exceptions.AuthenticationError):
        return (
            "auth",
            f"backend {backend} refused the credentials ({text})",
            "fix the user name and password (the user:password@ part of --url or DISTBRAKE_URL)",
        )
    if isinstance(error, redis.exceptions.NoPermissionError) or (
        isinstance(error, redis.exceptions.ResponseError)
        and ("can't run this command" in text or "no permissions" in text.lower())
    ):
        return (
            "permission",
            f"backend {backend} denied a command to this user, permission missing ({text})",
            "grant the brake's user what it needs, e.g. "
            f"ACL SETUSER <user> {needed_rules()} ~<key_prefix>:*",
        )
    if isinstance(error, redis.exceptions.ReadOnlyError):
        return (
            "read-only",
            f"backend {backend} is a read-only replica ({text})",
            "point --url at the primary (or use redis+sentinel:// to follow it)",
        )
    if isinstance(error, (redis.exceptions.TimeoutError, TimeoutError)):
        return (
            "timeout",
            f"backend {backend} did not answer within {timeout:g} s ({text})",
            "check that it is a Redis server (TLS needs rediss://) that is up and not paused, "
            "or raise --timeout on a slow network",
        )
    if isinstance(error, redis.exceptions.ResponseError) and text.startswith(("MOVED", "ASK")):
        return (
            "cluster",
            f"backend {backend} is a Redis Cluster node ({text})",
            "use redis+cluster://host:port[,host:port...]",
        )
    if isinstance(error, (redis.exceptions.ConnectionError, ConnectionError, OSError)):
        return (
            "unreachable",
            f"backend {backend} is unreachable ({text})",
            "start Redis there, or point --url / DISTBRAKE_URL at a running server",
        )
    if isinstance(error, redis.exceptions.RedisClusterException):
        return (
            "cluster",
            f"Redis Cluster at {backend} is unusable ({text})",
            "check that the nodes in the URL are up and that the cluster is healthy "
            "(CLUSTER INFO: cluster_state:ok)",
        )
    return (
        "backend",
        f"backend {backend} failed: {type(error).__name__}: {text}",
        "run `distbrake doctor` for a diagnosis",
    )


def _as_cli_error(error: BaseException) -> CliError:
    if isinstance(error, CliError):
        return error
    if isinstance(error, LoopBrakeError):
        return CliError(str(error), EXIT_DENIED, "denied")
    if isinstance(error, BrakeUnavailableError):
        cause = error.__cause__
        if cause is not None:
            kind, what, fix = _backend_problem(cause)
            return CliError(f"{what}; {fix}", EXIT_BACKEND, kind)
        return CliError(str(error), EXIT_BACKEND, "unavailable")
    if isinstance(error, ConfigurationError):
        return CliError(f"configuration error: {error}", EXIT_BACKEND, "configuration")
    if isinstance(error, UnsupportedArgumentsError):
        return CliError(str(error), EXIT_USAGE, "usage")
    if isinstance(error, DistbrakeError):  # ScriptReplyError and the like: the backend's side
        return CliError(f"backend {_run.backend}: {error}", EXIT_BACKEND, "backend")
    if isinstance(error, (redis.exceptions.RedisError, redis.exceptions.RedisClusterException,
                          OSError, TimeoutError)):
        kind, what, fix = _backend_problem(error)
        return CliError(f"{what}; {fix}", EXIT_BACKEND, kind)
    return CliError(
        f"internal error ({type(error).__name__}: {error}); please report it",
        EXIT_INTERNAL, "internal",
    )


def _report_error(error: CliError) -> int:
    message = _one_line(str(error))
    if _run.json:
        _emit_json({"error": {"exit_code": error.code, "kind": error.kind, "message": message}})
    click.echo(f"distbrake: {message}", err=True)
    return error.code


# -- the global options --------------------------------------------------------------------


@dataclass
class App:
    """What the global options asked for."""

    url: str | None
    timeout: float | None
    key_prefix: str | None
    max_repeats: int | None

    def given(self) -> dict[str, Any]:
        """The settings given on the command line (the "argument" source)."""
        return {
            "url": self.url, "timeout_seconds": self.timeout, "key_prefix": self.key_prefix,
            "max_repeats": self.max_repeats,
        }

    def settings(self, **extra: Any) -> BrakeSettings:
        """The effective settings: these options > DISTBRAKE_* variables > defaults."""
        options = {k: v for k, v in self.given().items() if k != "url"}
        return DistributedBrake.settings_for_url(self.url, None, **options, **extra)

    def brake(self, **extra: Any) -> DistributedBrake:
        settings = self.settings(**extra)
        _run.backend = redact_url(settings.url or "memory://")
        _run.timeout = settings.timeout_seconds
        return DistributedBrake.from_url(settings=settings)

    @contextlib.contextmanager
    def open(self, **extra: Any) -> Iterator[DistributedBrake]:
        brake = self.brake(**extra)
        try:
            yield brake
        finally:
            with contextlib.suppress(Exception):
                brake.close()


def _json_flag(value: bool) -> bool:
    _run.json = _run.json or value
    return _run.json


def json_option(function: F) -> F:
    """`--json` on a command (it may also be given before the command)."""

    def remember(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        return _json_flag(value)

    return click.option(
        "--json", "as_json", is_flag=True, callback=remember, expose_value=True,
        help="Print JSON (stable field names, see the README) instead of text.",
    )(function)


def _is_memory(settings: BrakeSettings) -> bool:
    return parse_url(settings.url or "memory://").kind == "memory"


def _memory_hint(settings: BrakeSettings) -> None:
    if _is_memory(settings):
        _note(
            "note: memory:// is private to this process, so this command sees only its own "
            "streaks; pass --url redis://... (or set DISTBRAKE_URL) to reach your fleet's store"
        )


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
    _json_flag(as_json)
    _remember_secrets(url)
    _remember_secrets(os.environ.get("DISTBRAKE_URL"))
    ctx.obj = App(url=url, timeout=timeout, key_prefix=key_prefix, max_repeats=max_repeats)


# -- session state as text and JSON -----------------------------------------------------------


def _limit(settings: BrakeSettings, tool: str) -> tuple[int | None, str]:
    limit = settings.limit_for(tool)
    if limit is None:
        return None, "exempt"
    if tool in settings.tool_max_repeats:
        return limit, "tool_max_repeats"
    return limit, "max_repeats"


def _iso(timestamp: float) -> str:
    if not timestamp:
        return ""
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds").replace(
        "+00:00", "Z")


def _span(seconds: float) -> str:
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


def state_json(state: SessionState, settings: BrakeSettings) -> dict[str, Any]:
    """A session's state with its limit and what the next identical call would get."""
    limit, source = _limit(settings, state.tool_name)
    return {
        "session_id": state.session_id,
        "tool_name": state.tool_name,
        "hash_prefix": state.hash_prefix,
        "count": state.count,
        "limit": limit,
        "limit_source": source,
        "denying": limit is not None and state.count >= limit,
        "next_denied": limit is not None and state.count + 1 >= limit,
        "ttl_seconds": state.ttl_seconds,
        "updated_at": state.updated_at,
        "updated_at_iso": _iso(state.updated_at),
    }


def _status(data: Mapping[str, Any]) -> Text:
    if data["denying"]:
        return Text("DENYING", style="bold red")
    if data["next_denied"]:
        return Text("next denied", style="yellow")
    if data["limit"] is None:
        return Text("exempt", style="dim")
    return Text("")


def _limit_text(data: Mapping[str, Any]) -> str:
    if data["limit"] is None:
        return "none (tool is exempt)"
    if data["limit_source"] == "tool_max_repeats":
        return f"{data['limit']} (per-tool limit for {data['tool_name']})"
    return f"{data['limit']} (max_repeats)"


def _ttl_text(ttl: float | None) -> str:
    return "no expiry" if ttl is None else f"{_span(ttl)} left"


# -- inspect -----------------------------------------------------------------------------------


@cli.command("inspect", short_help="One session's streak (exit 1 when there is none).")
@click.argument("session")
@json_option
@click.pass_obj
def inspect_command(app: App, session: str, as_json: bool) -> None:
    """Show SESSION's streak: tool, call hash prefix, count, limit, TTL, last update.

    Exit 1 when the session has no streak (never seen, cleared or expired).
    """
    with app.open() as brake:
        state = brake.inspect(session)
        settings = brake.settings
    if state is None:
        if as_json:
            _emit_json({"found": False, "session_id": session})
        else:
            _console(stderr=True).print(Text(
                f"distbrake: no streak for session {session!r} in {_run.backend} "
                f"(prefix {settings.key_prefix!r}): never seen, cleared, or expired"))
            _memory_hint(settings)
        raise click.exceptions.Exit(EXIT_NOT_FOUND)
    data = state_json(state, settings)
    if as_json:
        _emit_json({"found": True, **data})
        return
    now = time.time()
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold" if sys.stdout.isatty() else "")
    grid.add_column()
    grid.add_row("session", Text(state.session_id))
    grid.add_row("tool", Text(state.tool_name))
    grid.add_row("call", Text(f"{state.hash_prefix}  (hash prefix; `distbrake hash` computes it)"))
    grid.add_row("count", Text(f"{state.count} identical call(s) in a row"))
    grid.add_row("limit", Text(_limit_text(data)))
    if data["limit"] is None:
        verdict = Text("allowed (the tool is exempt)")
    elif data["next_denied"]:
        verdict = Text(
            f"DENIED: an identical call now would be call {state.count + 1} in a row "
            f"(count + 1 >= limit {data['limit']})", style="bold red")
    else:
        verdict = Text(
            f"allowed: an identical call now would be call {state.count + 1} of "
            f"{data['limit']} (denied from {data['limit']})", style="green")
    grid.add_row("next identical", verdict)
    grid.add_row("ttl", Text(_ttl_text(state.ttl_seconds)))
    grid.add_row("last update", Text(
        f"{_iso(state.updated_at)} ({_span(now - state.updated_at)} ago)" if state.updated_at
        else "unknown"))
    _print(_console(), grid)


# -- list ---------------------------------------------------------------------------------------


@cli.command("list", short_help='Sessions with streaks, longest first.')
@click.option("--match", "match", metavar="GLOB", default=None,
              help="Only session ids matching this glob (fnmatch, case-sensitive).")
@click.option("--min-count", metavar="N", default=1, show_default=True,
              type=click.IntRange(min=1), help="Only streaks of at least N identical calls.")
@click.option("--limit", "limit", metavar="N", default=50, show_default=True,
              type=click.IntRange(min=0), help="Show at most N sessions (0: all).")
@json_option
@click.pass_obj
def list_command(
    app: App, match: str | None, min_count: int, limit: int, as_json: bool
) -> None:
    """Sessions with streaks, longest first; streaks at or over the limit are flagged.

    Uses SCAN (never KEYS), on one node or every node of a cluster.
    """
    import heapq

    matched = 0

    def wanted(states: Iterator[SessionState]) -> Iterator[SessionState]:
        nonlocal matched
        for state in states:
            if state.count >= min_count:
                matched += 1
                yield state

    def order(state: SessionState) -> tuple[int, float, str]:
        return (state.count, state.updated_at, state.session_id)

    with app.open() as brake:
        settings = brake.settings
        found = wanted(brake.sessions(match))
        top = heapq.nlargest(limit, found, key=order) if limit else sorted(
            found, key=order, reverse=True)
    rows = [state_json(state, settings) for state in top]
    if as_json:
        _emit_json({
            "sessions": rows, "matched": matched, "shown": len(rows),
            "truncated": matched > len(rows), "match": match, "min_count": min_count,
            "key_prefix": settings.key_prefix, "max_repeats": settings.max_repeats,
        })
        return
    console = _console()
    if not rows:
        console.print(Text(
            f"no streaks in {_run.backend} (prefix {settings.key_prefix!r}"
            + (f", match {match!r}" if match else "")
            + (f", min count {min_count}" if min_count > 1 else "") + ")"))
        _memory_hint(settings)
        return
    now = time.time()
    table = _table("session", "tool", "call", "count", "limit", "status", "ttl", "updated")
    for column in (3, 4):
        table.columns[column].justify = "right"
    for data in rows:
        table.add_row(
            Text(data["session_id"]), Text(data["tool_name"]), data["hash_prefix"],
            str(data["count"]), "-" if data["limit"] is None else str(data["limit"]),
            _status(data),
            "none" if data["ttl_seconds"] is None else _span(data["ttl_seconds"]),
            f"{_span(now - data['updated_at'])} ago" if data["updated_at"] else "",
        )
    _print(console, table)
    denying = sum(1 for d in rows if d["denying"])
    summary = f"{len(rows)} of {matched} session(s) shown"
    if matched > len(rows):
        summary += " (longest first; --limit 0 shows all)"
    if denying:
        summary += f"; {denying} at or over the limit (their identical calls are being denied)"
    console.print(Text(summary))


# -- clear ---------------------------------------------------------------------------------------


@cli.command("clear", short_help='Forget streaks: SESSION... or --all --yes.')
@click.argument("sessions", nargs=-1, metavar="[SESSION]...")
@click.option("--all", "clear_all", is_flag=True, help="Clear every session under the key prefix.")
@click.option("--yes", is_flag=True, help="Confirm --all.")
@json_option
@click.pass_obj
def clear_command(
    app: App, sessions: tuple[str, ...], clear_all: bool, yes: bool, as_json: bool
) -> None:
    """Forget the streaks of SESSION... (or of every session with --all --yes).

    Clearing a session that has no streak is not an error; the count says
    how many streaks were actually removed.
    """
    if clear_all and sessions:
        raise click.UsageError("give SESSION names or --all, not both")
    if not clear_all and not sessions:
        raise click.UsageError("name at least one SESSION, or use --all --yes")
    if clear_all and not yes:
        settings = app.settings()
        raise CliError(
            f"refusing to clear every session under prefix {settings.key_prefix!r} on "
            f"{redact_url(settings.url or 'memory://')} without --yes",
            EXIT_USAGE, "usage",
        )
    with app.open() as brake:
        settings = brake.settings
        if clear_all:
            cleared = brake.clear_all()
            results: dict[str, bool] | None = None
        else:
            results = {session: brake.clear(session) for session in dict.fromkeys(sessions)}
            cleared = sum(results.values())
    if as_json:
        data: dict[str, Any] = {"cleared": cleared, "all": clear_all,
                                "key_prefix": settings.key_prefix}
        if results is not None:
            data["sessions"] = results
        _emit_json(data)
        return
    if results is None:
        click.echo(f"cleared {cleared} session(s) under prefix {settings.key_prefix!r} "
                   f"on {_run.backend}")
        return
    missing = [s for s, done in results.items() if not done]
    line = f"cleared {cleared} of {len(results)} session(s)"
    if missing:
        line += " (no streak: " + ", ".join(repr(s) for s in missing) + ")"
    click.echo(line)


# -- hash and check ----------------------------------------------------------------------------


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


@cli.command("hash", short_help='The call hash of TOOL + ARGS_JSON, computed locally.')
@click.argument("tool")
@click.argument("args_json", metavar="ARGS_JSON")
@json_option
def hash_command(tool: str, args_json: str, as_json: bool) -> None:
    """The call hash of TOOL with ARGS_JSON ('-' reads stdin), computed locally.

    The 12-character prefix is what denials, logs, `inspect` and `list` show,
    so an operator can tell which arguments a denied call had.
    """
    args = parse_args_json(args_json)
    digest = call_hash(tool, args)
    if as_json:
        _emit_json({"tool_name": tool, "call_hash": digest, "hash_prefix": hash_prefix(digest)})
        return
    click.echo(f"call_hash    {digest}\nhash_prefix  {hash_prefix(digest)}")


@cli.command("check", short_help='Count one call as a worker would (exit 3 when denied).')
@click.argument("tool")
@click.argument("args_json", metavar="ARGS_JSON")
@click.option("--session", "session", required=True, metavar="S", help="The session (agent) id.")
@click.option("--call-id", "call_id", default=None, metavar="ID",
              help="The host's id of this call (a retry with the same id is counted once).")
@json_option
@click.pass_obj
def check_command(
    app: App, *, tool: str, args_json: str, session: str, call_id: str | None, as_json: bool
) -> None:
    """Count one call of TOOL with ARGS_JSON in SESSION, exactly as a worker would.

    Exit 0 when allowed, 3 when denied, 4 when the backend is unavailable
    (this command never falls back to an in-process brake).
    """
    args = parse_args_json(args_json)
    with app.open(on_backend_error="closed") as brake:
        settings = brake.settings
        try:
            verdict = brake.check(tool, args, session_id=session, call_id=call_id)
        except LoopBrakeError as error:
            if as_json:
                _emit_json({
                    "allowed": False, "count": error.count, "limit": error.max_repeats,
                    "hash_prefix": error.hash_prefix, "session_id": error.session_id,
                    "tool_name": error.tool_name, "replayed": False, "exempt": False,
                    "decided_by": "redis" if not _is_memory(settings) else "memory",
                    "message": str(error),
                })
            else:
                _console().print(Text(str(error), style="bold red"))
                _memory_hint(settings)
            raise click.exceptions.Exit(EXIT_DENIED) from None
    if as_json:
        _emit_json({
            "allowed": True, "count": verdict.count, "limit": verdict.max_repeats,
            "hash_prefix": verdict.hash_prefix, "session_id": verdict.session_id,
            "tool_name": verdict.tool_name, "replayed": verdict.replayed,
            "exempt": verdict.exempt, "decided_by": verdict.decided_by, "message": None,
        })
        return
    if verdict.exempt:
        click.echo(f"allowed: tool {tool!r} is exempt (not counted)")
    else:
        replay = " (a replay of this call id: counted once)" if verdict.replayed else ""
        click.echo(f"allowed: count {verdict.count} of limit {verdict.max_repeats} "
                   f"(call {verdict.hash_prefix}){replay}")
    _memory_hint(settings)


# -- doctor --------------------------------------------------------------------------------------


@dataclass
class Finding:
    name: str
    status: str  # ok | warn | fail | skip
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": _one_line(self.detail),
                "fix": _one_line(self.fix)}


def _nodes(client: Any, label: str) -> list[tuple[str, Any]]:
    """(name, per-node client) of each primary: every master of a cluster, else the one."""
    primaries = getattr(client, "get_primaries", None)
    if callable(primaries):
        return [(str(node.name), client.get_redis_connection(node)) for node in primaries()]
    return [(label, client)]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _unknown_command(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, redis.exceptions.ResponseError) and (
        "unknown command" in text or "unknown subcommand" in text or "not found" in text
    )


# Sample arguments for ACL DRYRUN of the commands the script may run ({key}: a slot key).
_SAMPLE_ARGS: dict[str, tuple[str, ...]] = {
    "HGET": ("{key}", "h"), "HSET": ("{key}", "h", "x"), "HMGET": ("{key}", "h"),
    "HDEL": ("{key}", "h"), "HINCRBY": ("{key}", "n", "1"), "PEXPIRE": ("{key}", "1000"),
    "EXPIRE": ("{key}", "10"), "SET": ("{key}", "x"), "TIME": (), "PING": (),
}


def script_commands() -> list[str]:
    """The commands lua/brake.lua runs (ACL checks each of them inside the script)."""
    found = re.findall(r"redis\.p?call\(\s*['\"](\w+)['\"]", script_source())
    return list(dict.fromkeys(name.upper() for name in found))


def _needed_commands(key: str, pattern: str, sha: str, source: str) -> list[tuple[str, ...]]:
    """Every command the brake and its operations send, with sample arguments."""
    argv = ("x" * 24, "3", "3600000", "tool", "session")
    commands: list[tuple[str, ...]] = [
        ("EVALSHA", sha, "1", key, *argv),
        ("EVAL", source, "1", key, *argv),
        ("SCRIPT", "LOAD", source),
    ]
    for name in script_commands():
        sample = _SAMPLE_ARGS.get(name, ("{key}",))
        commands.append((name, *(key if a == "{key}" else a for a in sample)))
    commands += [
        ("HMGET", key, *(f.decode() for f in FIELDS)),
        ("PTTL", key),
        ("SCAN", "0", "MATCH", pattern, "COUNT", "500"),
        ("DEL", key),
        ("PING",),
    ]
    unique: dict[str, tuple[str, ...]] = {}
    for command in commands:
        unique.setdefault(_command_name(command), command)
    return list(unique.values())


def _command_name(command: tuple[str, ...]) -> str:
    return " ".join(command[:2]) if command[0] == "SCRIPT" else command[0]


def needed_rules() -> str:
    """ACL rules granting every command the brake needs (keys not included)."""
    names = [_command_name(c) for c in _needed_commands("k", "k:*", "0" * 40, "")]
    return " ".join("+" + name.lower().replace(" ", "|") for name in names)


def _grant_hint(user: str, prefix: str, commands: list[str]) -> str:
    rules = " ".join("+" + c.lower().replace(" ", "|") for c in commands)
    return f"ACL SETUSER {user} {rules} ~{prefix}:*  (and the same in your ACL file / on every node)"


class Doctor:
    """The checks of `distbrake doctor`, in order; any "fail" makes the exit code 4."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.findings: list[Finding] = []
        self.server: dict[str, Any] = {"mode": None, "version": None, "nodes": []}
        self.latency_ms: float | None = None
        self.config: dict[str, dict[str, Any]] = {}

    def add(self, name: str, status: str, detail: str, fix: str = "") -> None:
        self.findings.append(Finding(name, status, detail, fix))

    def fail_backend(self, name: str, error: BaseException) -> None:
        _, what, fix = _backend_problem(error)
        self.add(name, "fail", what, fix)

    @property
    def ok(self) -> bool:
        return all(f.status != "fail" for f in self.findings)

    def run(self) -> None:
        try:
            settings = self.app.settings()
        except ConfigurationError as error:
            self.add("configuration", "fail", str(error),
                     "correct the value named above (command-line option or DISTBRAKE_* variable)")
            return
        self.configuration(settings)
        _run.backend = redact_url(settings.url or "memory://")
        _run.timeout = settings.timeout_seconds
        parsed = parse_url(settings.url or "memory://")
        try:
            brake = DistributedBrake.from_url(settings=settings.model_copy(
                update={"on_backend_error": "closed"}))
        except Exception as error:  # a cluster client connects when built
            self.fail_backend("connect", error)
            return
        try:
            if self.connect(brake):
                nodes = _nodes(brake.client, _run.backend)
                if self.server_info(parsed.kind, nodes):
                    self.script(nodes)
                    self.permissions(brake, nodes)
                    self.end_to_end(brake, nodes)
        finally:
            with contextlib.suppress(Exception):
                brake.close()

    def configuration(self, settings: BrakeSettings) -> None:
        sources = value_sources(self.app.given())
        for name in BrakeSettings.model_fields:
            value: Any = getattr(settings, name)
            if name == "url":
                value = redact_url(value or "memory://")
            elif isinstance(value, frozenset):
                value = sorted(value)
            self.config[name] = {"value": value, "source": sources.get(name, "default")}
        self.add("configuration", "ok", "valid (sources below)")

    def connect(self, brake: DistributedBrake) -> bool:
        samples = []
        try:
            for _ in range(5):
                start = time.perf_counter()
                brake.ping()
                samples.append((time.perf_counter() - start) * 1000)
        except Exception as error:
            self.fail_backend("connect", error)
            return False
        self.latency_ms = statistics.median(samples)
        self.add("connect", "ok", f"PONG from {_run.backend}")
        self.add("latency", "ok", f"{self.latency_ms:.2f} ms round trip (median of 5 PINGs)")
        return True

    def server_info(self, kind: str, nodes: list[tuple[str, Any]]) -> bool:
        if kind == "memory":
            from importlib.metadata import version

            self.server.update(mode="embedded", version=f"fakeredis {version('fakeredis')}",
                               nodes=["memory"])
            self.add("server", "ok", f"embedded {self.server['version']} (in this process only: "
                     "a fleet needs a Redis URL)")
            return True
        versions, modes, policies = set(), set(), set()
        for name, client in nodes:
            try:
                server = client.info("server")
                memory = client.info("memory")
            except redis.exceptions.NoPermissionError as error:
                self.add("server", "warn", f"{name}: may not run INFO ({_one_line(str(error))})",
                         "optional: grant +info to see the server version and mode here")
                self.server["nodes"] = [n for n, _ in nodes]
                self.server["mode"] = {"cluster": "cluster", "sentinel": "sentinel"}.get(kind, "single")
                return True
            except Exception as error:
                self.fail_backend("server", error)
                return False
            versions.add(str(server.get("redis_version", "?")))
            modes.add(str(server.get("redis_mode", "standalone")))
            policies.add((str(memory.get("maxmemory_policy", "?")), int(memory.get("maxmemory", 0))))
        mode = "sentinel" if kind == "sentinel" else ("cluster" if "cluster" in modes else "single")
        self.server.update(mode=mode, version=", ".join(sorted(versions)), nodes=[n for n, _ in nodes])
        where = f"{len(nodes)} master(s)" if mode == "cluster" else "1 node"
        self.add("server", "ok", f"Redis {self.server['version']}, mode {mode} ({where})")
        if kind in ("redis", "unix") and "cluster" in modes:
            self.add("mode", "fail", "the server is a Redis Cluster node but the URL is for a single "
                     "node: keys in other slots would fail with MOVED",
                     "use redis+cluster://host:port[,host:port...]")
            return False
        evicting = sorted(p for p, limit in policies if limit and p != "noeviction")
        if evicting:
            self.add("memory policy", "warn",
                     f"maxmemory is set with policy {', '.join(evicting)}: idle streaks may be "
                     "evicted early under memory pressure",
                     "fine for most fleets (a looping session is never idle); use noeviction "
                     "or more memory if every streak must live its full TTL")
        return True

    def script(self, nodes: list[tuple[str, Any]]) -> None:
        source = script_source()
        expected = hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest()
        for name, client in nodes:
            try:
                sha = _text(client.script_load(source))
            except Exception as error:
                self.fail_backend("script", error)
                return
            if sha != expected:
                self.add("script", "fail", f"{name}: SCRIPT LOAD returned {sha}, expected {expected}",
                         "the server altered the script: check for a proxy rewriting commands")
                return
        self.add("script", "ok", f"lua/brake.lua loads (sha {expected[:12]}) on {len(nodes)} node(s)")

    def permissions(self, brake: DistributedBrake, nodes: list[tuple[str, Any]]) -> None:
        source = script_source()
        sha = hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest()
        key = brake.key("distbrake-doctor-probe")
        commands = _needed_commands(key, brake.key_pattern, sha, source)
        denied: dict[str, str] = {}
        user = "default"
        for name, client in nodes:
            try:
                user = _text(client.execute_command("ACL", "WHOAMI"))
                for command in commands:
                    answer = _text(client.execute_command("ACL", "DRYRUN", user, *command))
                    if answer != "OK":
                        denied.setdefault(_command_name(command), f"{name}: {answer}")
            except redis.exceptions.NoPermissionError:
                self.add("permissions", "warn",
                         "this user may not run ACL WHOAMI / ACL DRYRUN, so its permissions "
                         "cannot be listed (the end-to-end check below still exercises them)",
                         "optional: grant +acl|whoami +acl|dryrun for a full report; the brake "
                         f"needs {needed_rules()} on ~{brake.settings.key_prefix}:*")
                return
            except Exception as error:
                if _unknown_command(error):
                    self.add("permissions", "skip",
                             "ACL DRYRUN is not available on this server (Redis < 7 or embedded)")
                    return
                self.fail_backend("permissions", error)
                return
        if denied:
            first = next(iter(denied.values()))
            self.add("permissions", "fail",
                     f"user {user!r} may not run: {', '.join(denied)} on keys {brake.key_pattern} "
                     f"({_one_line(first)})",
                     "grant them, e.g. " + _grant_hint(user, brake.settings.key_prefix, list(denied)))
            return
        names = ", ".join(_command_name(c) for c in commands)
        self.add("permissions", "ok", f"user {user!r} may run {names} on {brake.settings.key_prefix}:*")

    def end_to_end(self, brake: DistributedBrake, nodes: list[tuple[str, Any]]) -> None:
        session = f"distbrake-doctor-{uuid.uuid4().hex[:12]}"
        try:
            verdict = brake.check("distbrake-doctor", {"probe": session}, session_id=session)
            state = brake.inspect(session)
            removed = brake.clear(session)
            for _, client in nodes:
                client.scan(0, match=brake.key_pattern, count=10)
        except Exception as error:
            with contextlib.suppress(Exception):
                brake.clear(session)
            if isinstance(error, LoopBrakeError):
                self.add("end-to-end", "fail", f"a first call was denied: {error}",
                         "max_repeats must be at least 2 for a brake that allows anything")
                return
            self.fail_backend("end-to-end", error)
            return
        if state is None or state.count != verdict.count or not removed:
            self.add("end-to-end", "fail",
                     f"check counted {verdict.count}, inspect read {state and state.count}, "
                     f"clear removed {removed}",
                     "another process may share this key prefix with a different layout: "
                     "use a dedicated --key-prefix")
            return
        self.add("end-to-end", "ok",
                 f"check counted {verdict.count}, inspect read it back (ttl "
                 f"{_ttl_text(state.ttl_seconds)}), clear removed it, SCAN allowed")

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "backend": _run.backend,
            "mode": self.server["mode"],
            "server_version": self.server["version"],
            "nodes": self.server["nodes"],
            "latency_ms": None if self.latency_ms is None else round(self.latency_ms, 3),
            "checks": [f.to_json() for f in self.findings],
            "config": self.config,
        }

    def print(self) -> None:
        console = _console()
        terminal = sys.stdout.isatty()
        styles = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
        console.print(Text(f"distbrake doctor: {_run.backend}", style="bold" if terminal else ""))
        table = _table("", "check", "result")
        for finding in self.findings:
            result = Text(_one_line(finding.detail))
            if finding.fix and finding.status in ("fail", "warn"):
                result.append(f"\nfix: {_one_line(finding.fix)}", style="cyan" if terminal else "")
            table.add_row(Text(finding.status.upper() if finding.status == "fail" else finding.status,
                               style=styles.get(finding.status, "") if terminal else ""),
                          finding.name, result)
        _print(console, table)
        if self.config:
            config = _table("setting", "value", "source", title="effective configuration")
            for name, item in self.config.items():
                value = item["value"]
                shown = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
                config.add_row(name, Text(scrub(shown)), item["source"])
            _print(console, config)
        failed = [f.name for f in self.findings if f.status == "fail"]
        if failed:
            console.print(Text(f"problems: {', '.join(failed)} (exit {EXIT_BACKEND})",
                               style="bold red" if terminal else ""))
        else:
            console.print(Text("all good", style="green" if terminal else ""))


@cli.command("doctor", short_help='Diagnose connection, mode, script, permissions, config.')
@json_option
@click.pass_obj
def doctor_command(app: App, as_json: bool) -> None:
    """Diagnose the backend: connection, version, mode, latency, script, permissions, config.

    Exit 4 when something is wrong (each problem comes with its fix).
    The end-to-end check writes one probe key under the prefix and deletes it.
    """
    doctor = Doctor(app)
    doctor.run()
    if as_json:
        _emit_json(doctor.to_json())
    else:
        doctor.print()
    if not doctor.ok:
        raise click.exceptions.Exit(EXIT_BACKEND)


# -- bench ------------------------------------------------------------------------------------------


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


@cli.command("bench", short_help="Benchmark figures, as ratios to the server's own floor.")
@click.option("--quick", is_flag=True, help="A small run (a few seconds; noisier figures).")
@click.option("--sessions", metavar="N", default=None, type=click.IntRange(min=100),
              help="Sessions for the memory figure (default 20000; --quick 2000).")
@click.option("--only", "only", multiple=True, metavar="FIGURE",
              type=click.Choice(["sync_check_latency", "async_throughput", "memory_per_session",
                                 "inprocess_check", "call_hash_1mb"]),
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

    The memory figure writes N short-lived keys under a dedicated prefix and
    clears them: run it only on a server you may fill.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from .bench import STAGES, run_bench

    settings = app.settings()
    _run.backend = redact_url(settings.url or "memory://")
    url = settings.url or "memory://"
    timeout = max(settings.timeout_seconds, 5.0)
    with app.open() as brake:  # fail fast (exit 4) when the server is not there
        brake.ping()
    progress = Progress(
        TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
        console=_console(stderr=True), transient=True, disable=as_json or not sys.stderr.isatty(),
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
        _emit_json(report.to_json())
        return
    terminal = sys.stdout.isatty()
    table = _table("figure", "ours", "floor", "ratio", "target", "result",
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
    console = _console()
    _print(console, table)
    for figure in report.figures:
        if figure.note:
            console.print(Text(f"{figure.key}: {scrub(figure.note)}", style="dim" if terminal else ""))


# -- demo ---------------------------------------------------------------------------------------------


@cli.command("demo", short_help='A small fleet with one stuck agent: watch the brake stop it.')
@click.option("--workers", metavar="N", default=4, show_default=True,
              type=click.IntRange(2, 32), help="Workers in the fleet (processes on Redis, "
                                              "threads on memory://).")
@click.option("--calls", metavar="N", default=8, show_default=True, type=click.IntRange(1, 1000),
              help="Tool calls per agent.")
@click.option("--keep", is_flag=True,
              help="Leave the demo's sessions in the store (see them with `distbrake list`).")
@click.option("--pace", metavar="SECONDS", default=None, type=click.FloatRange(0, 5),
              help="How long each allowed tool call runs (default: 0.05 on a terminal, else 0).")
@json_option
@click.pass_obj
def demo_command(
    app: App, *, workers: int, calls: int, keep: bool, pace: float | None, as_json: bool
) -> None:
    """A small fleet where one agent gets stuck repeating a call, and the brake stops it.

    Three agents' calls are dealt round-robin over the workers; agent
    "bravo" gets stuck. Each worker has its own brake; the streak is shared
    through the store, so the denial lands on a worker that saw fewer than
    max_repeats of the identical calls itself.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from .demo import AGENTS, STUCK_AGENT, DemoOutcome, plan_calls, run_demo

    settings = app.settings()
    _run.backend = redact_url(settings.url or "memory://")
    _run.timeout = settings.timeout_seconds
    url = settings.url or "memory://"
    terminal = sys.stdout.isatty()
    console = _console()
    limit = settings.limit_for("search") or settings.max_repeats
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
                kind = ("threads (memory:// is private to one process)" if _is_memory(settings)
                        else "processes")
                console.print(Text(f"demo: {workers} worker {kind} on {_run.backend}; agents "
                                   f"{', '.join(AGENTS)} ({STUCK_AGENT} is stuck); "
                                   f"max_repeats {limit}"))
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
        report = run_demo(url, workers=workers, calls=calls, max_repeats=app.max_repeats,
                          key_prefix=app.key_prefix, timeout_seconds=app.timeout, keep=keep,
                          pace=(0.05 if terminal and not as_json else 0.0) if pace is None else pace,
                          progress=on_progress)
    finally:
        progress.stop()
    if as_json:
        _emit_json(report.to_json())
    else:
        _print_demo(report, console, terminal, keep)
    if report.errors:
        raise CliError("demo workers could not reach the backend: " + "; ".join(report.errors),
                       EXIT_BACKEND, "unreachable")


def _print_demo(report: DemoReport, console: Console, terminal: bool, keep: bool) -> None:
    table = _table("worker", "runs as",
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
    _print(console, table)
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


# -- entry point ---------------------------------------------------------------------------------------


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
        message = _one_line(error.format_message())
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
        return _report_error(_as_cli_error(error))
    return result if isinstance(result, int) and not isinstance(result, bool) else EXIT_OK
