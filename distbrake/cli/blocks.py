"""The `block` and `unblock` commands: an operator stops a session, a glob of sessions, or the whole fleet.

`block SESSION...` / `block --match GLOB` halt sessions (every later check of
them, any tool, on any worker, raises LoopBrakeHalt); `block --all --yes` sets
the kill switch (`<prefix>:halt-all`): every check of every session, existing
and new, is refused within a second on every worker. `unblock` lifts either.
See `distbrake/operator.py`.
"""

from __future__ import annotations

import getpass
import re
import socket
from typing import Any

import click

from ..operator import WHO_CHARS
from .app import App, command
from .output import EXIT_USAGE, CliError, emit_json, escape_text, memory_hint, quote_text
from .sessions import check_targets, span_text

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(text: str | None) -> float | None:
    """`90`, `90s`, `15m`, `1h` or `2d` as seconds (None: not given)."""
    if text is None:
        return None
    found = _DURATION.match(text.strip().lower())
    seconds = float(found.group(1)) * _UNIT[found.group(2)] if found else 0.0
    if not 0 < seconds <= 10 * 365 * 86400:
        raise click.BadParameter(f"{text!r}: expected a duration such as 90s, 15m, 1h or 2d", param_hint="--ttl")
    return seconds


def default_who() -> str:
    """Who the block is by when --who is not given: user@host, cut to WHO_CHARS."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment
        user = "unknown"
    return f"{user}@{socket.gethostname()}"[:WHO_CHARS]


def _until(ttl: float | None, default: str) -> str:
    return f"for {span_text(ttl)}" if ttl is not None else default


@command("block")
@click.argument("sessions", nargs=-1, metavar="[SESSION]...")
@click.option("--match", "match", metavar="GLOB", default=None,
              help="Also every existing session whose id matches this glob (fnmatch, case-sensitive).")
@click.option("--all", "every", is_flag=True,
              help="Stop every session under the key prefix, existing and new (the kill switch).")
@click.option("--yes", is_flag=True, help="Confirm --all.")
@click.option("--reason", metavar="TEXT", default=None, help="Why (kept with the halt, shown to the host; "
              "at most 200 characters).")
@click.option("--ttl", metavar="DURATION", default=None,
              help="How long: 90s, 15m, 1h, 2d (default: the brake's TTL for sessions, none for --all).")
@click.option("--who", metavar="NAME", default=None, help="Who blocks (default: user@host).")
def block_command(
    app: App, sessions: tuple[str, ...], match: str | None, every: bool, yes: bool, reason: str | None,
    ttl: str | None, who: str | None, as_json: bool,
) -> None:
    """Halt SESSION... (and --match GLOB): every later check of them, any tool, on any worker, is refused.

    With --all --yes, set the fleet's kill switch instead: every check of every
    session under the key prefix is refused within a second, until
    `distbrake unblock --all` (or --ttl).
    """
    check_targets(sessions, match, every, "--all --yes")
    seconds = parse_ttl(ttl)
    if every and not yes:
        settings = app.settings()
        raise CliError(
            f"refusing to stop every session under prefix {quote_text(settings.key_prefix)} on "
            f"{settings.shown_url} without --yes", EXIT_USAGE, "usage",
        )
    who = default_who() if who is None else who
    with app.open() as brake:
        settings = brake.settings
        if every:
            brake.block_all(reason=reason, ttl_seconds=seconds, who=who)
            blocked = None
        else:
            blocked = brake.block(*sessions, match=match, reason=reason, ttl_seconds=seconds, who=who)
    lasts = seconds if seconds is not None or every else settings.ttl_seconds
    if as_json:
        data: dict[str, Any] = {
            "all": every, "blocked": blocked, "sessions": list(dict.fromkeys(sessions)), "match": match,
            "reason": reason, "who": who, "ttl_seconds": lasts, "key_prefix": settings.key_prefix,
        }
        emit_json(data)
    elif every:
        click.echo(
            f"kill switch set under prefix {quote_text(settings.key_prefix)} on {escape_text(app.backend)}: every "
            f"check of every session is refused within a second, {_until(lasts, 'until distbrake unblock --all')}")
    else:
        click.echo(
            f"blocked {blocked} session(s) under prefix {quote_text(settings.key_prefix)} on "
            f"{escape_text(app.backend)}: every check of them is refused {_until(lasts, '')} (distbrake unblock "
            "lifts it)")
    memory_hint(app, settings)


@command("unblock")
@click.argument("sessions", nargs=-1, metavar="[SESSION]...")
@click.option("--match", "match", metavar="GLOB", default=None,
              help="Also every halted session whose id matches this glob.")
@click.option("--all", "every", is_flag=True, help="Lift the kill switch (block --all).")
def unblock_command(app: App, sessions: tuple[str, ...], match: str | None, every: bool, as_json: bool) -> None:
    """Lift the halts of SESSION... (and of the halted sessions matching --match): their records are deleted
    and they start afresh. A session that is not halted is left as it is.

    With --all, lift the kill switch instead (sessions halted one by one stay
    halted: `unblock --match '*'` lifts those).
    """
    check_targets(sessions, match, every, "--all")
    with app.open() as brake:
        settings = brake.settings
        if every:
            was_set = brake.unblock_all()
        else:
            lifted = brake.unblock(*sessions, match=match)
    if as_json:
        emit_json({"all": True, "was_set": was_set, "key_prefix": settings.key_prefix} if every else
                  {"all": False, "unblocked": lifted, "key_prefix": settings.key_prefix})
    elif every:
        click.echo(f"kill switch {'lifted' if was_set else 'was not set'} under prefix "
                   f"{quote_text(settings.key_prefix)} on {escape_text(app.backend)}")
    else:
        click.echo(f"lifted {lifted} halt(s) under prefix {quote_text(settings.key_prefix)} on "
                   f"{escape_text(app.backend)}")
    memory_hint(app, settings)
