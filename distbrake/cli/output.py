"""What the CLI prints: rich consoles and tables, --json, scrubbed one-line text, exit codes and errors."""

from __future__ import annotations

import json
import os
import re
import sys
import unicodedata
from collections.abc import Collection
from typing import Any

import click
from rich import box
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from ..errors import (
    BrakeUnavailableError,
    ConfigurationError,
    DistbrakeError,
    LoopBrakeError,
    UnsupportedArgumentsError,
)
from ..redis.acl import needed_rules
from ..redis_errors import REDIS_FAILURES, classify
from ..settings import BrakeSettings
from ..urls import ParsedURL, redact_url
from .app import App

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

_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


class CliError(Exception):
    """An error the CLI reports as one line with an exit code."""

    def __init__(self, message: str, code: int, kind: str = "error") -> None:
        super().__init__(message)
        self.code = code
        self.kind = kind


# -- text ---------------------------------------------------------------------------------------

# Characters that act on a terminal or on the layout instead of showing: C0, DEL, C1 (Cc), format
# characters such as the bidi overrides U+202A..U+202E / U+2066..U+2069 and zero-width ones (Cf),
# line and paragraph separators (Zl, Zp), and lone surrogates (Cs, from undecodable argv bytes).
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _unsafe(char: str) -> bool:
    return unicodedata.category(char) in _UNSAFE_CATEGORIES


def _escape_char(char: str) -> str:
    named = _NAMED_ESCAPES.get(char)
    if named is not None:
        return named
    code = ord(char)
    if code < 0x80:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape_text(text: str) -> str:
    """`text` safe for a terminal: every control, format or separator character shown as an escape.

    C0 controls, DEL and C1 controls become `\\x1b`, `\\n`, `\\r`, `\\t`, `\\u009b`;
    bidi overrides, zero-width and other format characters, U+2028/U+2029 and
    lone surrogates become `\\u202e` and the like. Everything else (any printable
    Unicode, backslashes included) is kept, so the function is idempotent and
    may meet a text twice. Every piece of text from outside (session ids, tool
    names, server replies, URLs, error messages) goes through it before it
    reaches the terminal; `--json` output carries the exact text instead.
    """
    if text.isascii() and text.isprintable():
        return text  # the common case: nothing to escape
    return "".join(_escape_char(c) if _unsafe(c) else c for c in text)


def quote_text(text: str) -> str:
    """`text` escaped and in single quotes, for naming a session, tool or prefix in a message."""
    return "'" + escape_text(text) + "'"


def scrub(text: str, secrets: Collection[str]) -> str:
    """`text` with URL passwords redacted and every one of `secrets` replaced by ***."""
    text = _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return text


def one_line(text: str, secrets: Collection[str]) -> str:
    """`text` scrubbed, on one line and escaped (`escape_text`), as every message the CLI prints is."""
    return escape_text(scrub(" ".join(str(text).split()), secrets))


# -- rich output for people, JSON for programs -----------------------------------------------------


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    terminal = stream.isatty()
    # Colour and box drawing only on a terminal; piped output is plain, wide text.
    return Console(
        file=stream, highlight=False, emoji=False, soft_wrap=not terminal,
        width=None if terminal else int(os.environ.get("COLUMNS", "0") or 0) or 200,
    )


def make_table(*columns: str, title: str | Text | None = None, whole: tuple[str, ...] = ()) -> Table:
    """A table of `columns`; those named in `whole` are never wrapped (on a narrow terminal the others wrap, a word
    too long for its column folded onto the next line, never cut off; too narrow for that, a `whole` column is cut,
    with a "…")."""
    terminal = sys.stdout.isatty()
    return Table(
        *(Column(name, no_wrap=name in whole, overflow="ellipsis" if name in whole else "fold") for name in columns),
        title=title,
        box=box.SIMPLE_HEAD if terminal else None,
        show_edge=False, pad_edge=False, header_style="bold" if terminal else "",
        title_justify="left", title_style="bold" if terminal else "",
    )


def print_renderable(console: Console, renderable: Any) -> None:
    """Print a rich renderable; piped, without the padding rich puts at line ends."""
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable)
    lines = captured.get().splitlines()
    console.file.write("".join(line.rstrip() + "\n" for line in lines))


_NOT_PLAIN_ASCII = re.compile(r"[^\x00-\x7e]")  # DEL and everything beyond ASCII


def _json_escape(match: re.Match[str]) -> str:
    data = match.group(0).encode("utf-16-be", "surrogatepass")
    return "".join(f"\\u{int.from_bytes(data[i:i + 2], 'big'):04x}" for i in range(0, len(data), 2))


def json_text(data: Any) -> str:
    """`data` as JSON: exact (json.loads gives `data` back), and never a raw control character.

    json.dumps escapes C0 controls itself; DEL, C1 controls, format characters
    (bidi overrides), line separators and lone surrogates are written as
    `\\uXXXX` escapes too (they can only occur inside JSON strings), so JSON on a
    terminal is as safe as the text output, and still exact.
    """
    text = json.dumps(data, indent=2, ensure_ascii=False)
    return _NOT_PLAIN_ASCII.sub(lambda m: _json_escape(m) if _unsafe(m.group(0)) else m.group(0), text)


def emit_json(data: Any) -> None:
    click.echo(json_text(data))


def note(app: App, text: str) -> None:
    """A hint for a human (stderr), never in --json output."""
    if not app.json:
        make_console(stderr=True).print(Text(one_line(text, app.secrets), style="dim"))


def memory_hint(app: App, settings: BrakeSettings) -> None:
    if settings.parsed_url.connector == "memory":
        note(app,
             "note: memory:// is private to this process, so this command sees only its own "
             "streaks; pass --url redis://... (or set DISTBRAKE_URL) to reach your fleet's store")


# -- errors: what went wrong, its fix, its exit code -------------------------------------------------


def acl_rules(settings: BrakeSettings | None) -> str:
    """The ACL command rules the brake's user needs on this backend (keys not included).

    redis-py sends SELECT when it connects to a database other than 0, so
    such a URL needs `+select` too.
    """
    rules = needed_rules()
    if settings is not None and settings.parsed_url.db:
        rules += " +select"
    return rules


def acl_setuser_hint(settings: BrakeSettings | None) -> str:
    """`ACL SETUSER ...` granting everything the brake needs on `settings`' backend and key prefix."""
    if settings is None:
        return f"ACL SETUSER <user> {acl_rules(None)} ~<key_prefix>:*"
    user = settings.parsed_url.username or "default"  # no user name in the URL: the default user
    return f"ACL SETUSER {user} {acl_rules(settings)} ~{settings.key_prefix}:*"


def password_example(parsed: ParsedURL) -> str:
    """The run's URL (shown form) with a `<PASSWORD>` placeholder where its password goes.

    (The angle brackets also keep `scrub` from taking the placeholder for a password.)
    """
    scheme, _, rest = (parsed.redacted or f"{parsed.scheme}://host").partition("://")
    if parsed.username is not None and "@" in rest:
        user, _, after = rest.rpartition("@")
        return f"{scheme}://{user.partition(':')[0]}:<PASSWORD>@{after}"
    return f"{scheme}://:<PASSWORD>@{rest} (<USER>:<PASSWORD>@ for an ACL user)"


def backend_problem(error: BaseException, app: App) -> tuple[str, str, str]:
    """(kind, what happened, the fix) for a backend failure, password-free."""
    backend, timeout, settings = app.backend, app.timeout_seconds, app.resolved
    if isinstance(error, BrakeUnavailableError) and error.__cause__ is not None:
        error = error.__cause__
    text = " ".join(str(error).split()) or type(error).__name__
    cause = classify(error).cause  # what the error means: redis_errors.py decides it
    if cause == "auth":
        if settings is not None and not settings.parsed_url.password:
            # Without a password redis-py sends no AUTH; the server's answer ("HELLO must be
            # called with the client already authenticated", "Authentication required") says
            # only that one is needed.
            return (
                "auth",
                f"backend {backend} requires a password and the URL has none",
                "the server requires a password: put it in the URL, "
                f"{password_example(settings.parsed_url)}, in --url or DISTBRAKE_URL",
            )
        return (
            "auth",
            f"backend {backend} refused the credentials ({text})",
            "fix the user name and password (the user:password@ part of --url or DISTBRAKE_URL)",
        )
    if cause == "permission":
        return (
            "permission",
            f"backend {backend} denied a command to this user, permission missing ({text})",
            f"grant the brake's user what it needs, e.g. {acl_setuser_hint(settings)}",
        )
    if cause == "read-only":
        return (
            "read-only",
            f"backend {backend} is a read-only replica ({text})",
            "point --url at the primary (or use redis+sentinel:// to follow it)",
        )
    if cause == "timeout":
        return (
            "timeout",
            f"backend {backend} did not answer within {timeout:g} s ({text})",
            "check that it is a Redis server (TLS needs rediss://) that is up and not paused, "
            "or raise --timeout on a slow network",
        )
    if cause == "redirect":
        return (
            "cluster",
            f"backend {backend} is a Redis Cluster node ({text})",
            "use redis+cluster://host:port[,host:port...]",
        )
    if cause == "unreachable":
        return (
            "unreachable",
            f"backend {backend} is unreachable ({text})",
            "start Redis there, or point --url / DISTBRAKE_URL at a running server",
        )
    if cause == "cluster":
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


def as_cli_error(error: BaseException, app: App) -> CliError:
    """The exit code, kind and message an error (of ours, the library's, redis-py's, or a bug) gets."""
    if isinstance(error, CliError):
        return error
    if isinstance(error, LoopBrakeError):
        return CliError(str(error), EXIT_DENIED, "denied")
    if isinstance(error, BrakeUnavailableError):
        cause = error.__cause__
        if cause is not None:
            kind, what, fix = backend_problem(cause, app)
            return CliError(f"{what}; {fix}", EXIT_BACKEND, kind)
        return CliError(str(error), EXIT_BACKEND, "unavailable")
    if isinstance(error, ConfigurationError):
        return CliError(f"configuration error: {error}", EXIT_BACKEND, "configuration")
    if isinstance(error, UnsupportedArgumentsError):
        return CliError(str(error), EXIT_USAGE, "usage")
    if isinstance(error, DistbrakeError):  # ScriptReplyError and the like: the backend's side
        return CliError(f"backend {app.backend}: {error}", EXIT_BACKEND, "backend")
    if isinstance(error, REDIS_FAILURES):
        kind, what, fix = backend_problem(error, app)
        return CliError(f"{what}; {fix}", EXIT_BACKEND, kind)
    return CliError(
        f"internal error ({type(error).__name__}: {error}); please report it",
        EXIT_INTERNAL, "internal",
    )


def report_error(app: App, error: CliError) -> int:
    """Print `error` as one line on stderr (with --json, also as JSON on stdout); its exit code."""
    message = one_line(str(error), app.secrets)
    if app.json:
        emit_json({"error": {"exit_code": error.code, "kind": error.kind, "message": message}})
    click.echo(f"distbrake: {message}", err=True)
    return error.code
