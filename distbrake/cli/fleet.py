"""The `stats` and `top` commands: the fleet view, read from Redis (never written).

`stats` prints denials, halts and warnings per tool (per minute in `--json`)
from the counters the brakes keep (see `telemetry/fleet.py`), the halted and
blocked sessions and the kill switch; `top` is a live view refreshed every
second: the kill switch, halted sessions and the longest streaks now, denials
per tool over the last minutes as a small chart, and the backend's health. `q` quits; piped
(not a terminal), `top` prints one plain snapshot and exits.
"""

from __future__ import annotations

import contextlib
import heapq
import re
import select
import sys
import time
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import click
from rich.cells import cell_len
from rich.console import Group
from rich.text import Text

from ..core import SessionState
from ..operator import KillState
from ..redis.sync import DistributedBrake
from ..redis_errors import REDIS_FAILURES
from ..telemetry.fleet import RETENTION_MINUTES, Tally, read_minutes
from .app import App, command
from .output import emit_json, escape_text, make_console, make_table, print_renderable
from .sessions import halt_json, halt_word, iso_time, kill_json, kill_text, span_text, state_json, status_text

BARS = " ▁▂▃▄▅▆▇█"
TOP_STREAKS = 10
TOP_TOOLS = 10
ID_CHARS = 40  # a session id wider than this is shown as its head, "…" and its tail (where a UUID or run id ends)
MIN_ID_CHARS = 8  # ... or wider than a third of a narrow terminal, down to this
OTHER_COLUMNS = 30  # what a table leaves the columns beside the session's at least
SHOWN_TOOL_CHARS = 40  # a table shows at most this much of a tool name
UNKNOWN = "unknown: Redis unreachable"
_SINCE = re.compile(r"^(\d+)([mh]?)$")

Minutes = list[tuple[int, dict[str, Tally]]]


def parse_since(text: str) -> int:
    """`15m`, `1h` or `15` (minutes) as a number of minutes, 1 to RETENTION_MINUTES."""
    match = _SINCE.match(text.strip().lower())
    if not match:
        raise click.BadParameter(f"{text!r}: expected minutes such as 15m, or 1h")
    minutes = int(match.group(1)) * (60 if match.group(2) == "h" else 1)
    if not 1 <= minutes <= RETENTION_MINUTES:
        raise click.BadParameter(f"{text!r}: between 1m and {RETENTION_MINUTES}m (what Redis keeps)")
    return minutes


def totals(minutes: Minutes) -> dict[str, Tally]:
    """{tool: (denied, warned, halted)} over every minute, most denied (then halted) first."""
    found: dict[str, list[int]] = {}
    for _, tools in minutes:
        for tool, counts in tools.items():
            entry = found.setdefault(tool, [0, 0, 0])
            for index, count in enumerate(counts):
                entry[index] += count
    ranked = sorted(found.items(), key=lambda item: (-item[1][0], -item[1][2], -item[1][1], item[0]))
    return {tool: (d, w, h) for tool, (d, w, h) in ranked}


def _counts(tally: Tally) -> dict[str, int]:
    return {"denied": tally[0], "warned": tally[1], "halted": tally[2]}


def chart(values: list[int]) -> str:
    """A bar per value, scaled to the largest (a space for zero)."""
    top = max(values, default=0)
    if top <= 0:
        return " " * len(values)
    return "".join(BARS[0] if v <= 0 else BARS[max(1, round(v / top * (len(BARS) - 1)))] for v in values)


def stats_json(minutes: Minutes, backend: str, prefix: str, minutes_back: int) -> dict[str, Any]:
    """The counters of the last `minutes_back` minutes (the window asked for, even when none could be read)."""
    return {
        "backend": backend,
        "key_prefix": prefix,
        "since_minutes": minutes_back,
        "tools": {tool: _counts(tally) for tool, tally in totals(minutes).items()},
        "minutes": [
            {"minute": iso_time(minute * 60),
             "tools": {tool: _counts(tally) for tool, tally in sorted(tools.items())}}
            for minute, tools in minutes
        ],
    }


def tools_table(minutes: Minutes, title: str, limit: int | None = None) -> Any:
    table = make_table("tool", "denied", "warned", "halted", "denials per minute, oldest first", title=Text(title))
    ranked = list(totals(minutes).items())
    for tool, (denied, warned, halted) in ranked[:limit] if limit else ranked:
        per_minute = [tools.get(tool, (0, 0, 0))[0] for _, tools in minutes]
        table.add_row(Text(escape_text(tool[:SHOWN_TOOL_CHARS])), str(denied), str(warned), str(halted),
                      Text(chart(per_minute)))
    return table


def halted_sessions(brake: DistributedBrake) -> list[SessionState]:
    """The halted and blocked sessions now (SCAN), most recent first."""
    found = [state for state in brake.sessions() if state.halt is not None]
    return sorted(found, key=lambda s: -(s.halt.since if s.halt else 0.0))


def halts_json(halted: list[SessionState], kill: KillState | None) -> dict[str, Any]:
    """The halted sessions and the kill switch, as stats and top print them in --json."""
    return {
        "kill_switch": kill_json(kill),
        "halted_sessions": [{"session_id": s.session_id, "state": halt_word(s.halt).lower() if s.halt else "",
                             "ttl_seconds": s.ttl_seconds, "halt": halt_json(s.halt)} for s in halted],
    }


def id_chars(width: int) -> int:
    """How many terminal cells of a session id a table `width` cells wide shows: a third of the width, at most
    ID_CHARS, leaving the other columns OTHER_COLUMNS, at least MIN_ID_CHARS. The session column is never wrapped
    by the table (the other columns wrap instead), so on a terminal of 40 columns or more what `short_id` cuts,
    in the middle, is all that is cut (narrower, the table cuts it again, with a "…" at its end)."""
    return max(MIN_ID_CHARS, min(ID_CHARS, width // 3, width - OTHER_COLUMNS))


def cut_note(chars: int) -> str:
    return f"ids wider than {chars} columns are cut in the middle; distbrake list --json shows them whole"


def _attached(character: str) -> bool:
    """A character drawn with the one before it (a combining mark, a variation selector, a skin tone): never the
    first of a tail, nor the next after a head. (Joiners never get here: `escape_text` shows them as escapes.)"""
    return (bool(unicodedata.combining(character)) or "\ufe00" <= character <= "\ufe0f"
            or "\U0001f3fb" <= character <= "\U0001f3ff")


def _head(text: str, cells: int) -> str:
    """The longest start of `text` at most `cells` terminal cells wide (as rich measures it), not parting a
    character from what is drawn with it."""
    end = 0
    while end < len(text) and cell_len(text[:end + 1]) <= cells:
        end += 1
    while 0 < end < len(text) and _attached(text[end]):
        end -= 1
    return text[:end]


def _tail(text: str, cells: int) -> str:
    """The longest end of `text` at most `cells` terminal cells wide, not starting with a character drawn with
    the one before it."""
    start = len(text)
    while start > 0 and cell_len(text[start - 1:]) <= cells:
        start -= 1
    while start < len(text) and _attached(text[start]):
        start += 1
    return text[start:]


def short_id(session_id: str, chars: int = ID_CHARS) -> str:
    """A session id for a table column, escaped: whole, or its head and tail around "…", at most `chars` terminal
    cells wide (a wide character, CJK say, takes two)."""
    shown = escape_text(session_id)
    if cell_len(shown) <= chars:
        return shown
    head = _head(shown, chars - 1 - (chars - 1) // 2)
    return head + "…" + _tail(shown, chars - 1 - cell_len(head))


def any_cut(states: list[SessionState], chars: int) -> bool:
    """Whether a table of these sessions cuts an id (then the view says how to get it whole)."""
    return any(cell_len(escape_text(state.session_id)) > chars for state in states)


def halts_table(halted: list[SessionState], at: float, chars: int, limit: int | None = None) -> Any:
    table = make_table("session", "state", "who", "why", "since", "ttl", title=Text("halted and blocked sessions"),
                       whole=("session",))
    for state in halted[:limit] if limit else halted:
        halt = state.halt
        if halt is None:
            continue
        why = halt.reason if halt.who or halt.reason else f"{halt.kind} rule ({halt.tool_name[:SHOWN_TOOL_CHARS]})"
        table.add_row(
            Text(short_id(state.session_id, chars)), halt_word(halt), Text(escape_text(halt.who)),
            Text(escape_text(why[:60])), f"{span_text(at - halt.since)} ago" if halt.since else "",
            "none" if state.ttl_seconds is None else span_text(state.ttl_seconds),
        )
    return table


@command("stats")
@click.option("--since", "since", metavar="DURATION", default="15m", show_default=True,
              help=f"How far back: minutes (15m) or hours (1h), at most {RETENTION_MINUTES}m.")
def stats_command(app: App, since: str, as_json: bool) -> None:
    """Denials and warnings per tool, per minute, as every brake on this Redis counted them.

    The brakes write one small counter hash per minute under the key prefix
    (only when a call is denied or warned; kept an hour). This reads them.
    """
    minutes_back = parse_since(since)
    with app.open() as brake:
        minutes = read_minutes(brake.client, brake.settings.key_prefix, minutes_back)
        prefix = brake.settings.key_prefix
        kill = brake.kill_switch()
        halted = halted_sessions(brake)
    if as_json:
        emit_json({**stats_json(minutes, app.backend, prefix, minutes_back), **halts_json(halted, kill)})
        return
    console = make_console()
    now, chars = time.time(), id_chars(console.width)
    if kill is not None:
        console.print(Text(kill_text(kill, now)))
    if halted:
        print_renderable(console, halts_table(halted, now, chars))
        if any_cut(halted, chars):
            console.print(Text(cut_note(chars)))
    title = f"denials, warnings and halts on {escape_text(app.backend)}, last {minutes_back} min"
    if not any(tools for _, tools in minutes):
        console.print(Text(f"no denials or warnings on {escape_text(app.backend)} in the last {minutes_back} min "
                           f"(prefix {escape_text(prefix)})"))
        return
    print_renderable(console, tools_table(minutes, title))


# -- top --------------------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """What one refresh of `top` read."""

    at: float
    health: str
    latency_ms: float | None = None
    streaks: list[dict[str, Any]] = field(default_factory=list)  # state_json of the longest streaks
    shown: list[SessionState] = field(default_factory=list)  # every session a table shows
    minutes: Minutes = field(default_factory=list)
    halted: list[SessionState] = field(default_factory=list)
    kill: KillState | None = None


def take_snapshot(brake: DistributedBrake, minutes_back: int) -> Snapshot:
    """Read (never write) the streaks, the counters and a PING's latency."""
    now = time.time()
    try:
        start = time.perf_counter()
        brake.ping()
        latency = (time.perf_counter() - start) * 1000
        states = list(brake.sessions())
        longest = heapq.nlargest(TOP_STREAKS, states, key=lambda s: (s.count, s.updated_at))
        streaks = [state_json(state, brake.settings) for state in longest]
        halted = sorted((s for s in states if s.halt is not None), key=lambda s: -(s.halt.since if s.halt else 0.0))
        minutes = read_minutes(brake.client, brake.settings.key_prefix, minutes_back, now)
        kill = brake.kill_switch()
    except REDIS_FAILURES as error:
        return Snapshot(now, f"unreachable ({type(error).__name__})")
    return Snapshot(now, "ok", latency, streaks, longest + halted[:TOP_STREAKS], minutes, halted, kill)


def render(snapshot: Snapshot, backend: str, minutes_back: int, interactive: bool, width: int) -> Group:
    """The view, for a terminal `width` columns wide: the kill switch, the halted sessions, the longest streaks
    (each state in `list`'s words) and the denials per tool; during an outage each pane says it is unknown."""
    chars = id_chars(width)
    health = (f"ok, PING {snapshot.latency_ms:.1f} ms" if snapshot.latency_ms is not None else snapshot.health)
    head = Text(f"distbrake top  {escape_text(backend)}  {iso_time(snapshot.at)}  Redis: {health}",
                style="bold" if interactive else "")
    streaks = make_table("session", "tool", "count", "limit", "status", "idle",
                         title=Text("longest streaks now"), whole=("session",))
    for data in snapshot.streaks:
        streaks.add_row(
            Text(short_id(data["session_id"], chars)), Text(escape_text(data["tool_name"][:SHOWN_TOOL_CHARS])),
            str(data["count"]), "-" if data["limit"] is None else str(data["limit"]), status_text(data),
            span_text(snapshot.at - data["updated_at"]),
        )
    known = snapshot.latency_ms is not None
    parts: list[Any] = [head]
    if snapshot.kill is not None:
        parts.append(Text(kill_text(snapshot.kill, snapshot.at), style="bold red" if interactive else ""))
    if snapshot.halted or not known:
        parts.append(halts_table(snapshot.halted, snapshot.at, chars, TOP_STREAKS))
    if not known:
        parts.append(Text(UNKNOWN))
    parts.append(streaks)
    if not snapshot.streaks:
        parts.append(Text("(no streaks)" if known else UNKNOWN))
    parts.append(tools_table(snapshot.minutes, f"denials per tool, last {minutes_back} min", TOP_TOOLS))
    if not any(tools for _, tools in snapshot.minutes):
        parts.append(Text("(no denials or warnings)" if known else UNKNOWN))
    if any_cut(snapshot.shown, chars):
        parts.append(Text(cut_note(chars)))
    if interactive:
        parts.append(Text("q quits", style="dim"))
    return Group(*parts)


@contextlib.contextmanager
def _keys() -> Iterator[None]:
    """The terminal in cbreak mode (a key is read as it is pressed), restored afterwards."""
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _quit_pressed(timeout: float) -> bool:
    """Wait up to `timeout` for a key; True when it is q (or Q)."""
    ready, _, _ = select.select([sys.stdin], [], [], timeout)
    if not ready:
        return False
    key = sys.stdin.read(1)
    return key in ("q", "Q", "")


@command("top")
@click.option("--since", "since", metavar="DURATION", default="15m", show_default=True,
              help="Minutes of denials the chart shows (15m, 1h).")
@click.option("--interval", metavar="SECONDS", default=1.0, show_default=True,
              type=click.FloatRange(0.1, 60), help="Refresh period.")
def top_command(app: App, since: str, interval: float, as_json: bool) -> None:
    """A live view of the fleet, refreshed every second: `q` quits. It only reads from Redis.

    Not on a terminal (piped), or with --json, it prints one snapshot and exits.
    """
    from rich.live import Live

    minutes_back = parse_since(since)
    interactive = sys.stdout.isatty() and sys.stdin.isatty() and not as_json
    with app.open() as brake:
        if not interactive:
            snapshot = take_snapshot(brake, minutes_back)
            if as_json:
                data = stats_json(snapshot.minutes, app.backend, brake.settings.key_prefix, minutes_back)
                data["health"] = snapshot.health
                data["streaks"] = snapshot.streaks
                data.update(halts_json(snapshot.halted, snapshot.kill))
                if snapshot.latency_ms is None:  # unreachable: nothing is known (not "none")
                    data.update(dict.fromkeys(("streaks", "halted_sessions", "kill_switch", "tools", "minutes")))
                emit_json(data)
            else:
                console = make_console()
                print_renderable(console, render(snapshot, app.backend, minutes_back, False, console.width))
            return
        console = make_console()
        with _keys(), Live(render(take_snapshot(brake, minutes_back), app.backend, minutes_back, True, console.width),
                           console=console, auto_refresh=False, screen=True) as live:
            while not _quit_pressed(interval):  # the width read again each time: the terminal may be resized
                live.update(render(take_snapshot(brake, minutes_back), app.backend, minutes_back, True, console.width),
                            refresh=True)
