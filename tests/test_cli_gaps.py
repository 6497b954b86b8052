"""The operator's small gaps (issue 28.6), from the real CLI in subprocesses against a real redis-server.

`clear --match GLOB [--yes]` and a glob given as a session id; `top` and
`list` saying a streak's state in the same words; `top` cutting a long id in
the middle and saying how to get it whole; `top` during an outage saying each
pane is unknown; `demo --keep` leaving something stuck to look at, and the
demo on memory:// saying how to see processes share a streak.
"""

from __future__ import annotations

import shlex
import subprocess
import uuid

from distbrake import DistributedBrake
from tests.servers import RedisServer
from tests.test_cli import as_json, run

RUNS = [f"thread/run/{uuid.UUID(int=n)}" for n in (1, 2, 3)]
LONG = "thread/run/" + "x" * 200  # longer than the 128 bytes a record keeps of an id: reached by its key


def cli(url: str, prefix: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI on `prefix`, its tables 120 columns wide (whatever terminal, if any, the test runs in)."""
    return run("--url", url, "--key-prefix", prefix, *args, COLUMNS="120")


def ids(url: str, prefix: str) -> set[str]:
    return {row["session_id"] for row in as_json(run("--url", url, "--key-prefix", prefix, "list", "--json"))[
        "sessions"]}


def test_clear_match_clears_a_glob_and_a_glob_as_an_id_says_so(redis_url: str) -> None:
    with DistributedBrake.from_url(redis_url, key_prefix="gaps", otel=False) as worker:
        for session in [*RUNS, LONG, "other"]:
            worker.check("search", {"q": 1}, session_id=session)
    every = {*RUNS, LONG[:128], "other"}
    assert ids(redis_url, "gaps") == every

    as_id = run("--url", redis_url, "--key-prefix", "gaps", "clear", "thread/run/*")
    assert as_id.returncode == 1 and as_id.stdout == ""
    assert as_id.stderr.strip() == ("distbrake: no session is named 'thread/run/*'; to clear by pattern use "
                                    "--match")
    as_id_json = run("--url", redis_url, "--key-prefix", "gaps", "clear", "thread/run/*", "other", "--json")
    assert as_id_json.returncode == 1
    assert as_json(as_id_json)["not_named"] == ["thread/run/*"] and as_json(as_id_json)["cleared"] == 1

    refused = run("--url", redis_url, "--key-prefix", "gaps", "clear", "--match", "thread/run/*")
    assert refused.returncode == 2 and "refusing to clear 4 sessions matching 'thread/run/*'" in refused.stderr
    assert "--yes" in refused.stderr and ids(redis_url, "gaps") == every - {"other"}

    one = run("--url", redis_url, "--key-prefix", "gaps", "clear", "--match", f"*{RUNS[0][-6:]}")
    assert one.returncode == 0 and one.stdout.startswith(f"cleared 1 session(s) matching '*{RUNS[0][-6:]}'")
    cleared = run("--url", redis_url, "--key-prefix", "gaps", "clear", "--match", "thread/run/*", "--yes", "--json")
    assert cleared.returncode == 0, cleared.stderr
    assert as_json(cleared)["matched"] == 3 and as_json(cleared)["cleared"] == 3  # the long id too, by its key
    assert ids(redis_url, "gaps") == set()
    both = run("--url", redis_url, "--key-prefix", "gaps", "clear", "--all", "--match", "x")
    assert both.returncode == 2 and "not both" in both.stderr


def test_top_says_a_streaks_state_in_lists_words_and_how_to_see_a_cut_id_whole(redis_url: str) -> None:
    with DistributedBrake.from_url(redis_url, key_prefix="words", otel=False, max_repeats=3) as worker:
        for _ in range(2):  # count 2 of 3: the next identical call is denied
            worker.check("search", {"q": 1}, session_id=RUNS[0])
        worker.check("fetch", {}, session_id="calm")
    listed = cli(redis_url, "words", "list").stdout
    assert next(line for line in listed.splitlines() if line.startswith(RUNS[0])).split()[5:7] == ["next", "denied"]
    top = cli(redis_url, "words", "top").stdout
    row = next(line for line in top.splitlines() if line.startswith("thread/run/"))
    assert row.split()[0] == f"{RUNS[0][:20]}…{RUNS[0][-19:]}" and row.split()[4:6] == ["next", "denied"]
    assert "ids wider than 40 columns are cut in the middle; distbrake list --json shows them whole" in top
    assert " ok " not in top and "(no streaks)" not in top
    streaks = {s["session_id"]: s for s in as_json(cli(redis_url, "words", "top", "--json"))["streaks"]}
    assert streaks[RUNS[0]]["next_denied"] is True and streaks["calm"]["next_denied"] is False
    short = cli(redis_url, "words", "clear", "--match", "thread/*", "--yes")
    assert short.returncode == 0
    assert "cut in the middle" not in cli(redis_url, "words", "top").stdout


def test_top_during_an_outage_says_every_pane_is_unknown() -> None:
    with RedisServer(name="gone") as server:
        url = server.url
        assert run("--url", url, "top").stdout.count("(no streaks)") == 1  # up and empty
    down = run("--url", url, "--timeout", "0.5", "top")
    assert down.returncode == 0, down.stderr
    assert "Redis: unreachable" in down.stdout and down.stdout.count("unknown: Redis unreachable") == 3
    assert "(no streaks)" not in down.stdout and "(no denials or warnings)" not in down.stdout
    data = as_json(run("--url", url, "--timeout", "0.5", "top", "--since", "5m", "--json"))
    assert data["health"].startswith("unreachable") and data["streaks"] is None and data["tools"] is None
    assert data["since_minutes"] == 5  # the window asked for, known or not (it said 0 during an outage)


def test_demo_keep_leaves_the_stuck_and_the_blocked_session_and_says_how_to_see_them(redis_url: str) -> None:
    prefix = f"demo{uuid.uuid4().hex[:4]}"
    shown = run("--url", redis_url, "--key-prefix", prefix, "demo", "--workers", "2", "--keep")
    assert shown.returncode == 0, shown.stderr
    commands = [shlex.split(line)[1:] for line in shown.stdout.splitlines() if line.startswith("  distbrake ")]
    assert [c[4] for c in commands] == ["list", "inspect", "clear"] and "kept to look at:" in shown.stdout
    listed = as_json(run(*commands[0], "--json"))["sessions"]
    assert {(row["session_id"].rsplit("-", 1)[1], row["state"]) for row in listed} == {
        ("bravo", "halted"), ("charlie", "blocked")}
    inspected = run(*commands[1])
    assert inspected.returncode == 0 and "REFUSED: the session is halted" in inspected.stdout
    assert commands[2][-2:] == ["(removes", "them)"]
    assert run(*commands[2][:-2]).stdout.startswith("cleared 2 session(s)")
    assert as_json(run("--url", redis_url, "--key-prefix", prefix, "list", "--json"))["sessions"] == []


def test_the_demo_on_memory_says_how_to_see_processes_share_a_streak() -> None:
    shown = run("demo", "--workers", "2", "--keep")
    assert shown.returncode == 0, shown.stderr
    assert "to see processes share a streak, run distbrake --url redis://localhost:6379/0 demo" in shown.stdout
    assert "memory:// keeps nothing once the demo exits" in shown.stdout and "kept to look at" not in shown.stdout

