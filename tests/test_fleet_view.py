"""The fleet view: counters written on denials and warnings only, read by `distbrake stats` and `distbrake top`.

Against the suite's real single node and Cluster. `top` runs in a real
terminal (tmux): its screen is read with capture-pane and it quits on `q`;
piped, it prints one plain snapshot. Neither command writes to Redis.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import time
import unicodedata
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from rich.cells import cell_len

from distbrake import AsyncDistributedBrake, DistributedBrake, LoopBrakeError
from distbrake.cli.fleet import short_id
from distbrake.cli.output import escape_text
from tests.backends import Checker
from tests.servers import RedisCluster, RedisServer

ROOT = Path(__file__).resolve().parent.parent
SECRET = "sk-live-FLEETsecret-91"
SESSION = "fleet-session-of-bob"
EVIL_TOOL = "read\x1b[2J\x1b]0;owned\x07file"
DEADLINE = 20.0
READS = {"ping", "scan", "hmget", "pttl", "time", "hgetall", "get", "info", "config|resetstat", "hello",
         "client|setinfo", "cluster|slots", "cluster|shards", "cluster|nodes", "cluster|info", "command",
         "command|docs", "readonly", "select"}


def env() -> dict[str, str]:
    found = {k: v for k, v in os.environ.items() if not k.startswith("DISTBRAKE_")}
    found["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), found.get("PYTHONPATH")]))
    found.pop("FORCE_COLOR", None)
    return found


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "distbrake", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env(), timeout=120, check=False)


def fleet_hashes(url: str, prefix: str) -> dict[str, Any]:
    reader = DistributedBrake.from_url(url, otel=False, fleet_stats=False)  # its client: one node or a Cluster
    client = reader.client
    try:
        keys = list(client.scan_iter(match=f"{prefix}:fleet:*", **({"target_nodes": "primaries"}
                                                                   if isinstance(client, redis.RedisCluster) else {})))
        return {k.decode(): client.hgetall(k) for k in keys} | {"ttl:" + k.decode(): client.pttl(k) for k in keys}
    finally:
        reader.close()


def wait_for_stats(url: str, prefix: str, wanted: dict[str, dict[str, int]]) -> dict[str, Any]:
    """`distbrake stats --json` once it shows `wanted` (the writes are in the background), bounded."""
    end = time.monotonic() + DEADLINE
    while True:
        result = cli("stats", "--url", url, "--key-prefix", prefix, "--json")
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        if data["tools"] == wanted or time.monotonic() > end:
            assert data["tools"] == wanted
            return data  # type: ignore[no-any-return]
        time.sleep(0.1)


async def deny_and_warn(brake: Checker) -> None:
    """search: 2 allowed, 1 warned, 2 denied; the evil tool: 1 warned, 1 denied; fetch: allowed only."""
    for tool, calls in (("search", 5), (EVIL_TOOL, 4), ("fetch", 1)):
        for _ in range(calls):
            try:
                await brake.check(tool, {"token": SECRET}, session_id=SESSION)
            except LoopBrakeError:
                pass
    await brake.check("fetch", {"token": SECRET + "2"}, session_id="other")


WANTED = {"search": {"denied": 2, "warned": 1, "halted": 0}, EVIL_TOOL: {"denied": 1, "warned": 1, "halted": 0}}


@pytest.mark.parametrize("store", ["redis", "cluster"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_denials_and_warnings_per_tool_per_minute_reach_stats(
    flavour: str, store: str, request: pytest.FixtureRequest,
) -> None:
    url = str(request.getfixturevalue("redis_url" if store == "redis" else "cluster_url"))
    prefix = f"fv{uuid.uuid4().hex[:6]}"
    kind = DistributedBrake if flavour == "sync" else AsyncDistributedBrake
    brake = Checker(kind.from_url(url, key_prefix=prefix, warn_at=3, max_repeats=4, otel=False))
    await deny_and_warn(brake)
    await brake.close()  # writes what was noted (the writer gathers notes for half a second)
    data = wait_for_stats(url, prefix, WANTED)
    assert [m for m in data["minutes"] if m["tools"]][-1]["tools"]["search"]["denied"] >= 1
    assert len(data["minutes"]) == 15

    stored = fleet_hashes(url, prefix)
    keys = [k for k in stored if not k.startswith("ttl:")]
    assert 1 <= len(keys) <= 2  # one hash per minute (two when the run crossed a minute)
    for key in keys:
        assert 0 < stored["ttl:" + key] <= 3600 * 1000
        assert all(f.startswith((b"d:", b"w:")) for f in stored[key])
    text = repr(stored)
    assert SECRET not in text and SESSION not in text and "other" not in text and "fetch" not in text

    text_out = cli("stats", "--url", url, "--key-prefix", prefix, "--since", "1h")
    assert text_out.returncode == 0, text_out.stderr
    assert "\x1b" not in text_out.stdout and "read\\x1b[2J\\x1b]0;owned\\x07file" in text_out.stdout
    lines = {line.split()[0]: line.split()[1:3] for line in text_out.stdout.splitlines()[2:]}
    assert lines["search"] == ["2", "1"]


def test_a_counter_field_written_by_something_else_is_read_within_the_brakes_bounds(redis_url: str) -> None:
    """The counters are data from outside: a field of any length (written by another program) is read as a brake
    writes it, the tool name cut to 64 characters, in --json too; a table shows at most 40 of them."""
    prefix = f"foreign{uuid.uuid4().hex[:6]}"
    client = redis.Redis.from_url(redis_url)
    client.hset(f"{prefix}:fleet:{int(time.time() // 60)}", "d:" + "x" * 5000, 7)
    client.close()
    data = json.loads(cli("stats", "--url", redis_url, "--key-prefix", prefix, "--json").stdout)
    assert data["tools"] == {"x" * 64: {"denied": 7, "warned": 0, "halted": 0}}
    table = cli("stats", "--url", redis_url, "--key-prefix", prefix).stdout
    assert "x" * 40 in table and "x" * 41 not in table and len(table.splitlines()) <= 5, table


def test_stats_rejects_a_window_beyond_what_redis_keeps(redis_url: str) -> None:
    result = cli("stats", "--url", redis_url, "--since", "2h")
    assert result.returncode == 2 and "between 1m and 60m" in result.stderr


def test_the_fleet_write_never_fails_a_check(redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    # A user that may run the brake but not write the counters: checks are unaffected, and one WARNING says why.
    user = ("nostats on >pw ~distbrake:* resetchannels -@all +evalsha +script|load +hget +hset +time +pexpire "
            "+ping")
    with RedisServer(acl_users=[user], name="nostats") as server:
        brake = DistributedBrake.from_url(server.url_with(username="nostats", password="pw"), otel=False)
        brake.check("t", 1, session_id="s")
        brake.check("t", 1, session_id="s")
        with pytest.raises(LoopBrakeError):
            brake.check("t", 1, session_id="s")
        assert brake.watch is not None
        brake.watch.flush()  # the first write: refused, and said
        with pytest.raises(LoopBrakeError):
            brake.check("t", 1, session_id="s")
        assert brake.health().state == "ok"
        assert brake.check("t", 2, session_id="s").decided_by == "redis"
        brake.close()  # writes what is pending: refused again, not said again
        said = [r.getMessage() for r in caplog.records if "fleet view is not written" in r.getMessage()]
        assert len(said) == 1
        again = DistributedBrake.from_url(server.url_with(username="nostats", password="pw"), otel=False, max_repeats=1)
        with pytest.raises(LoopBrakeError):
            again.check("t", 3, session_id="s")
        again.close()  # another brake: said once by it too (no state shared between brakes)
    said = [r.getMessage() for r in caplog.records if "fleet view is not written" in r.getMessage()]
    assert len(said) == 2 and "+hincrby" in said[0] and all(r.levelname == "WARNING" for r in caplog.records
                                                             if "fleet view" in r.getMessage())


def test_fleet_stats_off_writes_nothing(redis_url: str) -> None:
    brake = DistributedBrake.from_url(redis_url, fleet_stats=False, max_repeats=1, otel=False)
    with pytest.raises(LoopBrakeError):
        brake.check("t", 1)
    assert brake.watch is None  # nothing observes: the check pays one attribute test
    brake.close()
    assert fleet_hashes(redis_url, "distbrake") == {}


def _commands(server: RedisServer) -> set[str]:
    stats = server.command("INFO", "commandstats")
    text = stats.decode() if isinstance(stats, bytes) else str(stats)
    if isinstance(stats, dict):
        return {name.removeprefix("cmdstat_") for name in stats}
    return {line.split(":")[0].removeprefix("cmdstat_") for line in text.splitlines() if line.startswith("cmdstat_")}


class Tmux:
    """One tmux server of this test's own (its own socket), running one command in a `width`x40 terminal."""

    def __init__(self, command: list[str], width: int = 120) -> None:
        self.socket = f"distbrake-top-{uuid.uuid4().hex[:8]}"
        shell = " ".join(f"'{part}'" for part in command)
        subprocess.run(["tmux", "-L", self.socket, "new-session", "-d", "-s", "top", "-x", str(width), "-y", "40",
                        f"env -u COLUMNS -u LINES PYTHONPATH={ROOT} {shell}"], check=True, timeout=30, cwd=ROOT)

    def screen(self) -> str:
        return subprocess.run(["tmux", "-L", self.socket, "capture-pane", "-p", "-t", "top"], capture_output=True,
                              text=True, timeout=30, check=False).stdout

    def wait_for(self, text: str) -> str:
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never appeared:\n{self.screen()}")

    def alive(self) -> bool:
        return subprocess.run(["tmux", "-L", self.socket, "has-session", "-t", "top"], capture_output=True,
                              timeout=30, check=False).returncode == 0

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "-L", self.socket, "send-keys", "-t", "top", *keys], check=True, timeout=30)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30, check=False)


@pytest.fixture
def tmux_path() -> str:
    found = shutil.which("tmux")
    assert found, "tmux must be installed (apt-get install tmux)"
    return found


async def test_top_in_a_real_terminal_shows_streaks_and_denials_and_quits_on_q(
    tmux_path: str, redis_server: RedisServer, redis_url: str,
) -> None:
    brake = Checker(DistributedBrake.from_url(redis_url, warn_at=3, max_repeats=4, otel=False))
    await deny_and_warn(brake)
    wait_for_stats(redis_url, "distbrake", WANTED)
    await brake.close()
    redis_server.command("CONFIG", "RESETSTAT")
    terminal = Tmux([sys.executable, "-m", "distbrake", "top", "--url", redis_url])
    try:
        screen = terminal.wait_for("q quits")
        assert "Redis: ok, PING" in screen
        assert "longest streaks now" in screen and "denials per tool, last 15 min" in screen
        streak_rows = [line.split() for line in screen.splitlines() if line.startswith(SESSION)]
        assert sorted(row[1] for row in streak_rows) == ["fetch"]  # the session's last streak
        assert "read\\x1b[2J\\x1b]0;owned\\x07file" in screen  # escaped, never run by the terminal
        search = next(line for line in screen.splitlines() if line.startswith("search"))
        assert search.split()[1:3] == ["2", "1"]
        first = screen.splitlines()[0]
        # It refreshes every second: the clock in the first line moves on.
        end = time.monotonic() + DEADLINE
        while terminal.screen().splitlines()[0] == first and time.monotonic() < end:
            time.sleep(0.1)
        assert terminal.screen().splitlines()[0] != first
        terminal.keys("q")
        end = time.monotonic() + DEADLINE
        while terminal.alive() and time.monotonic() < end:
            time.sleep(0.1)
        assert not terminal.alive(), "q did not quit"
    finally:
        terminal.close()
    assert _commands(redis_server) <= READS, _commands(redis_server) - READS  # top only read


@pytest.mark.parametrize("session_id", [
    "x" * 50, "会" * 10 + "a" * 30, "a会" * 20, "❤\ufe0f" * 20, "e\u0301" * 40, "👍🏽" * 20, "👩\u200d💻" * 20,
])
@pytest.mark.parametrize("chars", [8, 26, 40])
def test_a_cut_id_fits_its_cells_and_never_parts_a_character_from_its_marks(session_id: str, chars: int) -> None:
    """What `top` shows of an id is at most `chars` terminal cells as rich draws them (a CJK character, an emoji
    with its variation selector, takes two), uses them (at most one cell lost to a wide character), and never
    starts its tail, nor ends its head, beside a mark drawn with the character before it."""
    whole, shown = escape_text(session_id), short_id(session_id, chars)  # (a joiner is escaped: never drawn)
    if cell_len(whole) <= chars:
        assert shown == whole
        return
    assert chars - 1 <= cell_len(shown) <= chars, shown
    head, tail = shown.split("…")
    assert whole.startswith(head) and whole.endswith(tail)
    for part in (tail, whole[len(head)]):
        assert not unicodedata.combining(part[0]) and part[0] not in "\ufe0f\U0001f3fd", shown


def test_top_in_an_80_column_terminal_shows_ids_whole_or_cut_in_the_middle_as_it_says(
    tmux_path: str, redis_url: str,
) -> None:
    """The common default terminal: a session id gets a third of the width (26 of 80), and the table never cuts
    it further (the other columns wrap): an id that fits shows whole, a longer one as its head, "…" and its tail,
    and the note says so. (Before, the table cut every id at its end, the note's 40 and "in the middle" untrue.)"""
    long_id, calm, blocked = "thread/run/0f8e9d2c-aaaa-bbbb-cccc-1234567890ab-run-42", "c" * 26, "b" * 24
    with DistributedBrake.from_url(redis_url, max_repeats=3, otel=False) as worker:
        for _ in range(2):
            worker.check("search_the_web", {"q": 1}, session_id=long_id)
        worker.check("fetch_the_page", {}, session_id=calm)
        worker.check("search", {}, session_id="会话" * 10)
        worker.block(blocked, reason="runaway spend on tool calls", who="ops-on-call")
    terminal = Tmux([sys.executable, "-m", "distbrake", "top", "--url", redis_url], width=80)
    try:
        screen = terminal.wait_for("q quits")
    finally:
        terminal.close()
    words = [line.split() for line in screen.splitlines() if line.strip()]
    assert calm in [row[0] for row in words] and "fetch_the_p" in screen, screen  # whole, on one line
    assert [blocked, "BLOCKED"] in [row[:2] for row in words], screen
    assert f"{long_id[:13]}…{long_id[-12:]}" in [row[0] for row in words], screen
    # a wide (CJK) id is cut by terminal cells, two a character: 13 cells of head, 12 of tail
    assert ["会话会话会话…会话会话会话", "search"] in [row[:2] for row in words], screen
    cut = {f"{long_id[:13]}…", "会话会话会话…"}
    assert "…" not in functools.reduce(lambda text, head: text.replace(head, ""), cut, screen), screen  # no other
    assert "ids wider than 26 columns are cut in the middle" in screen


@pytest.mark.parametrize("store", ["redis", "cluster"])
async def test_top_piped_prints_one_plain_snapshot(store: str, request: pytest.FixtureRequest) -> None:
    url = str(request.getfixturevalue("redis_url" if store == "redis" else "cluster_url"))
    brake = Checker(DistributedBrake.from_url(url, warn_at=3, max_repeats=4, otel=False))
    await deny_and_warn(brake)
    wait_for_stats(url, "distbrake", WANTED)
    await brake.close()
    result = cli("top", "--url", url)
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "q quits" not in result.stdout
    assert "longest streaks now" in result.stdout and "Redis: ok" in result.stdout
    assert SECRET not in result.stdout
    data = json.loads(cli("top", "--url", url, "--json").stdout)
    assert data["tools"] == WANTED and data["health"] == "ok"
    assert {s["session_id"] for s in data["streaks"]} == {SESSION, "other"}


def test_top_on_a_cluster_never_writes(redis_cluster: RedisCluster, cluster_url: str) -> None:
    for node in redis_cluster.masters:
        node.command("CONFIG", "RESETSTAT")
    assert cli("top", "--url", cluster_url).returncode == 0
    for node in redis_cluster.masters:
        assert _commands(node) <= READS, _commands(node) - READS


def test_an_async_brake_keeps_writing_after_moving_to_a_new_event_loop(redis_url: str) -> None:
    import asyncio

    prefix = f"fv{uuid.uuid4().hex[:6]}"
    brake = AsyncDistributedBrake.from_url(redis_url, key_prefix=prefix, max_repeats=1, otel=False)

    async def deny(tool: str) -> None:
        with pytest.raises(LoopBrakeError):
            await brake.check(tool, 1, session_id=tool)
        await brake.watch.aflush()  # type: ignore[union-attr]  # before this loop ends

    asyncio.run(deny("first"))
    asyncio.run(deny("second"))
    asyncio.run(brake.aclose())
    wait_for_stats(redis_url, prefix, {"first": {"denied": 1, "warned": 0, "halted": 0},
                                       "second": {"denied": 1, "warned": 0, "halted": 0}})


def test_a_user_granted_exactly_the_hint_gets_every_feature() -> None:
    # The ACL hint (doctor, errors, README) is built from one table of what each feature needs: a user granted
    # exactly that gets checks, the fleet view, `stats`, `list` and `clear` (it once lacked +hincrby and
    # +hgetall: the fleet view was silently not written and `stats` exited 4 suggesting the same grant).
    from distbrake.cli.output import acl_rules

    user = f"hinted on >pw ~distbrake:* resetchannels -@all {acl_rules(None)}"
    with RedisServer(acl_users=[user], name="hinted") as server:
        url = server.url_with(username="hinted", password="pw")
        brake = DistributedBrake.from_url(url, otel=False, max_repeats=1, on_backend_error="closed")
        minute = int(time.time() // 60)
        with pytest.raises(LoopBrakeError):
            brake.check("search", 1, session_id="s")
        brake.close()  # the fleet view's write is done (or refused) by now
        minutes = range(minute, int(time.time() // 60) + 1)
        assert sum(server.command("EXISTS", f"distbrake:fleet:{m}") for m in minutes) == 1
        stats = cli("stats", "--url", url, "--json")
        assert stats.returncode == 0, stats.stderr
        listed = cli("list", "--url", url, "--json")
        assert listed.returncode == 0 and len(json.loads(listed.stdout)["sessions"]) == 1
        assert cli("clear", "--url", url, "s").returncode == 0
        doctor = cli("doctor", "--url", url, "--json")
        assert [c for c in json.loads(doctor.stdout)["checks"] if c["status"] == "fail"] == []
