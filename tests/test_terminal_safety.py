"""Session ids and tool names never control the operator's terminal (issue 12.5).

MCP clients choose session ids, agents choose tool names, and both end up in
the records `distbrake list` and `inspect` show. Here records with hostile ids
and tool names are written through a real brake on a real redis-server, then
the real CLI runs in subprocesses (`list`, `inspect`, `check`, `check
--dry-run`, `clear`, `doctor`, `demo`, error paths): its human output must
hold no raw control character (no ESC, CSI, OSC, BEL, C1, DEL, bidi override,
and no newline inside a table cell), each hostile text shown escaped, while
`--json` gives back the exact text. Last, `list` runs in a real terminal
(tmux): the window title it had is still there, and every row is intact.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import unicodedata
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from distbrake import DistributedBrake, call_hash
from tests.test_cli import ROOT, _env, run

# (raw session id, how a terminal must show it). Each id <= 128 UTF-8 bytes (kept whole).
HOSTILE_IDS: list[tuple[str, str]] = [
    ("agent\x1b]0;PWNED-TITLE\x07", "agent\\x1b]0;PWNED-TITLE\\x07"),  # OSC 0: window title, BEL
    ("agent\x1b]2;PWNED-TITLE-2\x1b\\", "agent\\x1b]2;PWNED-TITLE-2\\x1b\\"),  # OSC 2, ST
    ("\x1b[2J\x1b[Hcleared", "\\x1b[2J\\x1b[Hcleared"),  # clear screen, cursor home
    ("\x1bcreset", "\\x1bcreset"),  # RIS: full terminal reset
    ("\x1b[5mblink\x1b[0m", "\\x1b[5mblink\\x1b[0m"),  # SGR blink
    ("real\nfake-row  search  000000000000  99  3  DENYING",
     "real\\nfake-row  search  000000000000  99  3  DENYING"),  # a newline fakes a table row
    ("visible\rhidden", "visible\\rhidden"),
    ("abc\x08\x08\x08xyz", "abc\\x08\\x08\\x08xyz"),  # backspaces overwrite
    ("c1\x9b2Jcsi", "c1\\u009b2Jcsi"),  # C1 CSI
    ("c1\x9d0;C1-TITLE\x9c", "c1\\u009d0;C1-TITLE\\u009c"),  # C1 OSC ... ST
    ("next\x85line", "next\\u0085line"),  # C1 NEL
    ("del\x7fete", "del\\x7fete"),
    ("nul\x00byte", "nul\\x00byte"),
    ("user\u202egnp.exe", "user\\u202egnp.exe"),  # bidi RIGHT-TO-LEFT OVERRIDE
    ("a\u2066isolated\u2069b", "a\\u2066isolated\\u2069b"),  # bidi isolate
    ("agent\u200b7", "agent\\u200b7"),  # zero-width space: looks like "agent7"
    ("line\u2028separator", "line\\u2028separator"),
    ("\x1b]8;;https://evil.invalid\x1b\\click\x1b]8;;\x1b\\",
     "\\x1b]8;;https://evil.invalid\\x1b\\click\\x1b]8;;\\x1b\\"),  # OSC 8 hyperlink
    ("\x1bP+q544e\x1b\\dcs", "\\x1bP+q544e\\x1b\\dcs"),  # DCS (terminal query)
    ("tab\there", "tab\\there"),
    ("[bold red]markup[/bold red]", "[bold red]markup[/bold red]"),  # rich markup: shown as is
]
# (raw tool name, shown), dealt to the ids in turn. Each <= 64 UTF-8 bytes.
HOSTILE_TOOLS: list[tuple[str, str]] = [
    ("search\x1b]0;TOOL-TITLE\x07", "search\\x1b]0;TOOL-TITLE\\x07"),
    ("tool\nfake  row", "tool\\nfake  row"),
    ("t\u202eloot", "t\\u202eloot"),
    ("\x9b31mred", "\\u009b31mred"),
]
ARGS = {"q": "x"}


def tool_of(index: int) -> tuple[str, str]:
    return HOSTILE_TOOLS[index % len(HOSTILE_TOOLS)]


# The ids a command line can carry (argv cannot hold NUL: that one is seen through `list`).
ARGV_IDS = [(i, raw, shown) for i, (raw, shown) in enumerate(HOSTILE_IDS) if "\x00" not in raw]


def raw_controls(text: str) -> list[str]:
    """Characters that act on a terminal: every C0 but the line feed, DEL, C1, format, separators."""
    return [
        c for c in text
        if c != "\n" and unicodedata.category(c) in ("Cc", "Cf", "Cs", "Zl", "Zp")
    ]


class Audit:
    """Every output checked, and what it found: the figures the test prints."""

    def __init__(self) -> None:
        self.runs = 0
        self.bytes = 0
        self.raw: list[tuple[str, str]] = []

    def check(self, result: subprocess.CompletedProcess[str], what: str) -> None:
        self.runs += 1
        for stream in (result.stdout, result.stderr):
            self.bytes += len(stream.encode("utf-8", "surrogatepass"))
            self.raw.extend((what, repr(c)) for c in raw_controls(stream))
        assert "Traceback" not in result.stderr, (what, result.stderr)


def run_all(commands: Iterable[tuple[str, ...]]) -> list[subprocess.CompletedProcess[str]]:
    """Run CLI commands two at a time (two cores); results in order."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return list(pool.map(lambda args: run(*args), commands))


@pytest.fixture
def hostile_url(redis_url: str) -> str:
    """The single node with one record per hostile id, each at count 2 (the next call is denied)."""
    with DistributedBrake.from_url(redis_url) as brake:
        for index, (session, _) in enumerate(HOSTILE_IDS):
            for _ in range(2):
                brake.check(tool_of(index)[0], ARGS, session_id=session)
    return redis_url


@pytest.mark.slow
def test_hostile_ids_and_tool_names_are_escaped_everywhere(hostile_url: str) -> None:
    url = hostile_url
    audit = Audit()

    # list: one line per record, each id and tool escaped on its own row
    listed = run("--url", url, "list", "--limit", "0")
    assert listed.returncode == 0, listed.stderr
    audit.check(listed, "list")
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["session", "tool", "call", "count", "limit", "status", "ttl",
                                "updated"]
    assert len(lines) == 1 + len(HOSTILE_IDS) + 1, listed.stdout  # header, rows, summary
    assert lines[-1] == f"{len(HOSTILE_IDS)} of {len(HOSTILE_IDS)} session(s) shown"
    rows = lines[1:-1]
    for index, (_, shown) in enumerate(HOSTILE_IDS):
        mine = [row for row in rows if row.startswith(shown + "  ")]
        assert len(mine) == 1, (shown, listed.stdout)
        assert tool_of(index)[1] in mine[0] and " 2 " in mine[0] and "next denied" in mine[0]

    # list --json: the exact ids and tool names, and no raw control character either
    exact = run("--url", url, "list", "--json", "--limit", "0")
    assert exact.returncode == 0, exact.stderr
    audit.check(exact, "list --json")
    sessions = {s["session_id"]: s["tool_name"] for s in json.loads(exact.stdout)["sessions"]}
    assert sessions == {raw: tool_of(i)[0] for i, (raw, _) in enumerate(HOSTILE_IDS)}

    # inspect, human and JSON, for every id
    human = run_all(("--url", url, "inspect", raw) for _, raw, _ in ARGV_IDS)
    machine = run_all(("--url", url, "inspect", raw, "--json") for _, raw, _ in ARGV_IDS)
    for (index, raw, shown), text, data in zip(ARGV_IDS, human, machine, strict=True):
        assert text.returncode == 0 and data.returncode == 0, (shown, text.stderr, data.stderr)
        audit.check(text, f"inspect {shown}")
        audit.check(data, f"inspect --json {shown}")
        fields = dict(line.split(None, 1) for line in text.stdout.splitlines()
                      if line and not line.startswith("next identical"))
        assert fields["session"] == shown and fields["tool"] == tool_of(index)[1], text.stdout
        assert len(text.stdout.splitlines()) == 8, text.stdout  # no line of its own for an id
        state = json.loads(data.stdout)
        assert state["session_id"] == raw and state["tool_name"] == tool_of(index)[0]
        assert state["hash_prefix"] == call_hash(tool_of(index)[0], ARGS)[:12]

    # check: a dry run names the stored (hostile) tool; a real check is denied, naming it
    few = HOSTILE_IDS[:len(HOSTILE_TOOLS)]
    dry = run_all(("--url", url, "check", "other", "{}", "--session", raw, "--dry-run")
                  for raw, _ in few)
    denied = run_all(("--url", url, "check", tool_of(i)[0], json.dumps(ARGS), "--session", raw)
                     for i, (raw, _) in enumerate(few))
    for index, ((_, shown), maybe, no) in enumerate(zip(few, dry, denied, strict=True)):
        audit.check(maybe, f"check --dry-run {shown}")
        audit.check(no, f"check {shown}")
        assert maybe.returncode == 0 and f"another call ({tool_of(index)[1]}, " in maybe.stdout
        assert no.returncode == 3, no.stderr
        assert no.stdout.startswith(f'loop brake: tool "{tool_of(index)[1]}" called 3 times')
        assert len(no.stdout.splitlines()) == 1

    # error paths: no such session, nothing to clear, unknown command, a hostile URL and prefix
    title = "\x1b]0;ERR-TITLE\x07"
    errors = run_all([
        ("--url", url, "inspect", f"nobody{title}\n"),
        ("--url", url, "clear", f"nobody{title}"),
        (f"frob{title}",),
        ("--url", f"redis://bad{title}host:1", "--timeout", "0.5", "list"),
        ("--url", f"redis://bad{title}host:1", "--timeout", "0.5", "list", "--json"),
        ("--url", url, "--key-prefix", f"p{title}", "list"),
        ("--url", f"memory://demo{title}", "demo", "--workers", "2", "--calls", "4"),
    ])
    for result in errors:
        audit.check(result, "error path " + " ".join(result.args[3:]))
    missing, clear, unknown, bad_url, bad_url_json, bad_prefix, demo = errors
    assert missing.returncode == 1
    assert "no streak for session 'nobody\\x1b]0;ERR-TITLE\\x07\\n'" in missing.stderr
    assert clear.returncode == 0 and "(no streak: 'nobody\\x1b]0;ERR-TITLE\\x07')" in clear.stdout
    assert unknown.returncode == 2 and "frob\\x1b]0;ERR-TITLE\\x07" in unknown.stderr
    assert bad_url.returncode == 4 and "bad\\x1b]0;ERR-TITLE\\x07host" in bad_url.stderr
    assert bad_url_json.returncode == 4
    assert "bad\\x1b]0;ERR-TITLE\\x07host" in json.loads(bad_url_json.stdout)["error"]["message"]
    assert bad_prefix.returncode == 4 and "key_prefix" in bad_prefix.stderr
    assert demo.returncode == 0, demo.stderr
    assert "on memory://demo\\x1b]0;ERR-TITLE\\x07;" in demo.stdout

    # doctor: the configuration table shows a hostile per-tool limit's name escaped
    doctor = run("--url", url, "doctor",
                 DISTBRAKE_TOOL_MAX_REPEATS=json.dumps({f"tool{title}\n": 5}))
    audit.check(doctor, "doctor")
    assert doctor.returncode == 0, doctor.stdout
    assert "tool_max_repeats" in doctor.stdout

    hostile = len(HOSTILE_IDS) + len(HOSTILE_TOOLS)
    print(f"\nterminal safety: {len(HOSTILE_IDS)} hostile session ids and {len(HOSTILE_TOOLS)} "
          f"hostile tool names ({hostile} texts) through {audit.runs} CLI runs, "
          f"{audit.bytes} bytes of stdout+stderr: {len(audit.raw)} raw escapes")
    assert audit.raw == [], audit.raw[:20]


def _tmux(socket: Path, *args: str, timeout: float = 30) -> str:
    # The server's environment is the client's: without COLUMNS/LINES, so that the pane's size
    # (250 x 60) is what the CLI sees.
    env = {k: v for k, v in _env().items() if k not in ("COLUMNS", "LINES", "TMUX")}
    done = subprocess.run(["tmux", "-u", "-S", str(socket), "-f", "/dev/null", *args],
                          capture_output=True, text=True, timeout=timeout, check=True, env=env)
    return done.stdout


@pytest.fixture
def tmux_socket(tmp_path: Path) -> Any:
    if shutil.which("tmux") is None:
        pytest.fail("tmux is needed for the real-terminal test (apt-get install -y tmux)")
    socket = tmp_path / "tmux.sock"
    yield socket
    subprocess.run(["tmux", "-S", str(socket), "kill-server"], capture_output=True, check=False)


def test_list_in_a_real_terminal_keeps_the_title_and_the_rows(
    hostile_url: str, tmux_socket: Path, tmp_path: Path
) -> None:
    """`distbrake list` on a tmux pane: the pane title stays, every row is on one line of its own."""
    title = "distbrake-test-title"
    env = _env()
    script = tmp_path / "list.sh"
    tmux = f"tmux -S {shlex.quote(str(tmux_socket))}"
    script.write_text(
        "#!/bin/sh\n"
        f"{tmux} wait-for go\n"  # until the test has set the title
        f"{shlex.quote(sys.executable)} -m distbrake --url {shlex.quote(hostile_url)} list "
        "--limit 0\n"
        "echo \"[exit $?]\"\n"
        f"{tmux} wait-for -S listed\n"
        "exec cat\n"  # keep the pane (and what it shows) until the server is killed
    )
    script.chmod(0o755)
    env_args = [arg for key, value in env.items() if key in ("PYTHONPATH", "PATH", "HOME", "LANG")
                for arg in ("-e", f"{key}={value}")]
    _tmux(tmux_socket, "new-session", "-d", "-s", "brake", "-x", "250", "-y", "60",
          "-c", str(ROOT), *env_args, str(script))
    _tmux(tmux_socket, "select-pane", "-t", "brake", "-T", title)
    assert _tmux(tmux_socket, "display-message", "-p", "-t", "brake", "#{pane_title}").strip() == title
    _tmux(tmux_socket, "wait-for", "-S", "go")
    _tmux(tmux_socket, "wait-for", "listed", timeout=120)

    shown_title = _tmux(tmux_socket, "display-message", "-p", "-t", "brake",
                        "#{pane_title}").strip()
    screen = _tmux(tmux_socket, "capture-pane", "-p", "-J", "-t", "brake", "-S", "-", "-E", "-")
    lines = [line.rstrip() for line in screen.splitlines() if line.strip()]
    assert "[exit 0]" in lines, screen
    header = next(i for i, line in enumerate(lines) if line.split()[:3] == ["session", "tool", "call"])
    summary = next(i for i, line in enumerate(lines) if "session(s) shown" in line)
    rows = [line for line in lines[header + 1:summary] if not set(line) <= set("─━- ")]
    intact = [
        shown for index, (_, shown) in enumerate(HOSTILE_IDS)
        if len(mine := [row for row in rows if row.startswith(shown + "  ")]) == 1
        and tool_of(index)[1] in mine[0] and "next denied" in mine[0]
    ]
    print(f"\ntmux: pane title {shown_title!r} (set to {title!r} before the run), "
          f"{len(intact)} of {len(HOSTILE_IDS)} hostile rows intact, {len(rows)} rows on screen")
    assert shown_title == title, "an escape sequence from a session id set the pane title"
    assert len(intact) == len(HOSTILE_IDS), screen
    assert len(rows) == len(HOSTILE_IDS), screen
    assert lines[summary] == f"{len(HOSTILE_IDS)} of {len(HOSTILE_IDS)} session(s) shown"


def test_the_denial_log_line_escapes_a_tool_name_s_control_characters(caplog: pytest.LogCaptureFixture) -> None:
    from distbrake import LoopBrake, LoopBrakeError

    brake = LoopBrake(1)
    with caplog.at_level("WARNING", logger="distbrake"), pytest.raises(LoopBrakeError):
        brake.check("evil\x1b[2J\x1b]0;owned\x07", {}, session_id="s")
    line = caplog.records[-1].getMessage()
    assert "\x1b" not in line and "\x07" not in line and "evil\\x1b[2J" in line
