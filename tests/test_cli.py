"""The `distbrake` command line, run for real: `python -m distbrake` in a subprocess.

Against a real single redis-server, a real 3-master cluster, a server with a
password, a port with nothing listening and a socket that accepts but never
answers. Exit codes: 0 ok, 1 not found, 2 usage, 3 denied, 4 backend.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from distbrake import DistributedBrake, LoopBrakeError, call_hash
from tests.servers import RedisServer, free_port
from tests.waits import run_measured

ROOT = Path(__file__).resolve().parent.parent
RIGHT_PW = "s3cret-pw"
WRONG_PW = "wrong-pw"
TIMEOUT = 1.0
SLACK = 5.0  # generous: interpreter start-up and a loaded machine, never a tight bound


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DISTBRAKE_") and k != "DSH_LOOP_BRAKE_MAX_REPEATS"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("FORCE_COLOR", None)
    env.update(extra)
    return env


def run(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "distbrake", *args], input=stdin, capture_output=True,
        text=True, cwd=ROOT, env=_env(**env), timeout=120, check=False,
    )


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(result.stdout)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def no_secret(result: subprocess.CompletedProcess[str], *secrets: str) -> None:
    for secret in secrets:
        assert secret not in result.stdout, result.stdout
        assert secret not in result.stderr, result.stderr


@pytest.fixture
def hanging_port() -> Iterator[int]:
    """A socket that accepts connections (the kernel completes them) and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield int(listener.getsockname()[1])


# -- no backend needed -------------------------------------------------------------------------


def test_version_hash_and_invalid_json() -> None:
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("distbrake ")

    args = {"query": "weather", "n": 1.0, "nested": {"b": [1, 2, {"é": None}], "a": True}}
    result = run("hash", "search", json.dumps(args), "--json")
    assert result.returncode == 0, result.stderr
    data = as_json(result)
    assert data == {
        "tool_name": "search",
        "call_hash": call_hash("search", args),
        "hash_prefix": call_hash("search", args)[:12],
    }

    tools = json.dumps({"fetch": {"ignore_fields": ["nonce", "meta.id"]}})
    nonced = run("hash", "fetch", json.dumps({"url": "u", "nonce": 7, "meta": {"id": 1}}), "--json",
                 DISTBRAKE_TOOLS=tools)
    assert as_json(nonced) == {
        "tool_name": "fetch", "call_hash": call_hash("fetch", {"url": "u", "meta": {}}),
        "hash_prefix": call_hash("fetch", {"url": "u", "meta": {}})[:12], "ignored_fields": ["nonce", "meta.id"],
    }

    piped = run("hash", "search", "-", stdin=json.dumps(args, indent=3))
    assert piped.returncode == 0, piped.stderr
    assert f"hash_prefix  {call_hash('search', args)[:12]}" in piped.stdout
    assert call_hash("search", args) in piped.stdout

    secret = "sk-live-NEVER-ECHO-41"
    bad = run("hash", "search", '{"token": "' + secret)
    assert bad.returncode == 2
    line = one_line_error(bad)
    assert "not valid JSON" in line
    no_secret(bad, secret)


def test_check_json_decided_by_is_redis_when_allowed_and_when_denied() -> None:
    """On one backend, `check --json` names the same decider whether it allows or denies.

    memory:// is private to each process, so the denial comes from --max-repeats 1.
    """
    allowed = run("check", "search", "{}", "--session", "s", "--json")
    assert allowed.returncode == 0, allowed.stderr
    denied = run("--max-repeats", "1", "check", "search", "{}", "--session", "s", "--json")
    assert denied.returncode == 3, denied.stderr
    assert as_json(allowed)["allowed"] is True and as_json(denied)["allowed"] is False
    assert as_json(allowed)["decided_by"] == "redis"
    assert as_json(denied)["decided_by"] == "redis"


def test_usage_errors_are_one_line_exit_2() -> None:
    missing = run("check", "search", "{}")  # no --session
    assert missing.returncode == 2
    assert "--session" in one_line_error(missing)

    unknown = run("frobnicate")
    assert unknown.returncode == 2
    one_line_error(unknown)

    bad_url = run("--url", f"nosuch://user:{RIGHT_PW}@h:1", "list")
    assert bad_url.returncode == 4
    assert "configuration error" in one_line_error(bad_url)
    no_secret(bad_url, RIGHT_PW)


# -- a real single node --------------------------------------------------------------------------


def test_check_inspect_list_clear_on_a_real_server(redis_url: str) -> None:
    with DistributedBrake.from_url(redis_url) as brake:
        brake.check("search", {"q": "paris"}, session_id="stuck")  # count 1, in process
        for i in range(5):
            brake.check("read", {"i": i}, session_id=f"calm-{i}")
        brake.check("read", {"i": 0}, session_id="calm-0")  # count 2

    first = run("--url", redis_url, "check", "search", '{"q": "paris"}', "--session", "stuck",
                "--call-id", "c-2", "--json")
    assert first.returncode == 0, first.stderr
    verdict = as_json(first)
    assert verdict["allowed"] is True and verdict["count"] == 2 and verdict["limit"] == 3
    assert verdict["hash_prefix"] == call_hash("search", {"q": "paris"})[:12]
    assert set(verdict) == {"allowed", "count", "limit", "hash_prefix", "session_id", "tool_name",
                            "replayed", "exempt", "decided_by", "message", "warned", "would_deny", "dry_run"}
    assert verdict["dry_run"] is False

    denied = run("--url", redis_url, "check", "search", '{"q": "paris"}', "--session", "stuck")
    assert denied.returncode == 3
    assert "loop brake" in denied.stdout and "called 3 times in a row" in denied.stdout

    inspected = run("--url", redis_url, "inspect", "stuck", "--json")
    assert inspected.returncode == 0, inspected.stderr
    state = as_json(inspected)
    assert state["found"] is True
    assert state["tool_name"] == "search" and state["count"] == 3 and state["limit"] == 3
    assert state["limit_source"] == "record"  # the limit the fleet judged it by
    assert (state["max_repeats"], state["enforcing"], state["state"]) == (3, True, "denying")
    assert state["denying"] is True and state["next_denied"] is True
    assert 3500 < state["ttl_seconds"] <= 3600
    assert abs(state["updated_at"] - time.time()) < 60 and state["updated_at_iso"].endswith("Z")
    assert state["hash_prefix"] == verdict["hash_prefix"]

    human = run("--url", redis_url, "--max-repeats", "5", "inspect", "calm-0")
    assert human.returncode == 0, human.stderr
    assert "calm-0" in human.stdout and "5 (what if: --max-repeats)" in human.stdout
    assert "allowed: an identical call now would be call 3 of 5" in human.stdout
    assert "\x1b[" not in human.stdout  # no colour when piped

    missing = run("--url", redis_url, "--json", "inspect", "nobody")
    assert missing.returncode == 1
    assert as_json(missing) == {"found": False, "session_id": "nobody", "kill_switch": None}

    listed = run("--url", redis_url, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = as_json(listed)
    assert rows["matched"] == 6 and rows["shown"] == 6 and rows["truncated"] is False
    assert [r["session_id"] for r in rows["sessions"][:2]] == ["stuck", "calm-0"]
    assert [r["count"] for r in rows["sessions"]] == [3, 2, 1, 1, 1, 1]
    assert [r["denying"] for r in rows["sessions"]] == [True] + [False] * 5
    assert rows["sessions"][1]["next_denied"] is True

    filtered = run("--url", redis_url, "list", "--match", "calm-*", "--limit", "2", "--json")
    rows = as_json(filtered)
    assert rows["matched"] == 5 and rows["shown"] == 2 and rows["truncated"] is True
    assert rows["sessions"][0]["session_id"] == "calm-0"

    table = run("--url", redis_url, "list", "--min-count", "2")
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["session", "tool", "call", "count", "limit", "status", "ttl",
                                "updated"]
    assert lines[1].split()[:6] == ["stuck", "search", verdict["hash_prefix"], "3", "3", "DENYING"]
    assert "2 of 2 session(s) shown; 1 at or over the limit" in table.stdout

    cleared = run("--url", redis_url, "clear", "stuck", "nobody", "--json")
    assert cleared.returncode == 0, cleared.stderr
    assert as_json(cleared) == {"cleared": 1, "all": False, "key_prefix": "distbrake",
                                "sessions": {"stuck": True, "nobody": False}, "match": None, "matched": None,
                                "not_named": []}

    refused = run("--url", redis_url, "clear", "--all")
    assert refused.returncode == 2
    assert "--yes" in one_line_error(refused)
    with DistributedBrake.from_url(redis_url) as brake:
        assert len(list(brake.sessions())) == 5

    everything = run("--url", redis_url, "clear", "--all", "--yes")
    assert everything.returncode == 0, everything.stderr
    assert everything.stdout.startswith("cleared 5 session(s) under prefix 'distbrake'")
    with DistributedBrake.from_url(redis_url) as brake:
        assert list(brake.sessions()) == []


def test_doctor_on_a_real_server(redis_url: str) -> None:
    result = run("--url", redis_url, "--key-prefix", "myapp", "doctor", "--json",
                 DISTBRAKE_MAX_REPEATS="4")
    assert result.returncode == 0, result.stdout + result.stderr
    report = as_json(result)
    assert report["ok"] is True and report["mode"] == "single"
    assert report["server_version"].startswith(("6.", "7.", "8."))
    assert report["latency_ms"] > 0
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    for name in ("configuration", "connect", "latency", "server", "script", "permissions",
                 "end-to-end"):
        assert statuses[name] == "ok", report["checks"]
    config = report["config"]
    assert config["url"] == {"value": redis_url, "source": "argument"}
    assert config["key_prefix"] == {"value": "myapp", "source": "argument"}
    assert config["max_repeats"] == {"value": 4, "source": "variable DISTBRAKE_MAX_REPEATS"}
    assert config["ttl_seconds"]["source"] == "default"
    with DistributedBrake.from_url(redis_url, key_prefix="myapp") as brake:
        assert list(brake.sessions()) == []  # the probe was cleaned up

    human = run("--url", redis_url, "doctor")
    assert human.returncode == 0
    assert "all good" in human.stdout and "effective configuration" in human.stdout


def test_acl_restricted_users_are_diagnosed() -> None:
    partial = "~distbrake:* +ping +evalsha +eval +script|load +hmget +hget +hset +pttl"
    rules = [
        f"blind on >blind-pw {partial}",  # may not even ask ACL DRYRUN
        f"seer on >seer-pw {partial} +acl|whoami +acl|dryrun",
    ]
    with RedisServer(acl_users=rules, name="cli-acl") as server:
        blind = run("--url", server.url_with("blind", "blind-pw"), "doctor", "--json")
        seer = run("--url", server.url_with("seer", "seer-pw"), "doctor", "--json")
    for result in (blind, seer):
        assert result.returncode == 4
        no_secret(result, "blind-pw", "seer-pw")
        report = as_json(result)
        assert report["ok"] is False
        checks = {c["name"]: c for c in report["checks"]}
        # The script's own PEXPIRE is refused inside EVALSHA.
        assert checks["end-to-end"]["status"] == "fail"
        assert "permission missing" in checks["end-to-end"]["detail"]
        assert "ACL SETUSER" in checks["end-to-end"]["fix"]
        assert "+pexpire" in checks["end-to-end"]["fix"]
    assert {c["name"]: c["status"] for c in as_json(blind)["checks"]}["permissions"] == "warn"
    listed = next(c for c in as_json(seer)["checks"] if c["name"] == "permissions")
    assert listed["status"] == "fail"
    missing = listed["detail"].split("user 'seer' may not run: ")[1].split(" on keys ")[0].split(", ")
    assert {"PEXPIRE", "TIME", "SCAN", "DEL", "GET", "SET"} <= set(missing)  # GET, SET: the kill switch
    assert listed["fix"].startswith("grant them, e.g. ACL SETUSER seer +") and "+get +set" in listed["fix"]
    assert all(f"+{name.lower()}" in listed["fix"] for name in missing)


# -- a real cluster ----------------------------------------------------------------------------------


def test_list_doctor_clear_on_a_cluster(cluster_url: str) -> None:
    with DistributedBrake.from_url(cluster_url, max_repeats=10) as brake:
        for i in range(30):  # spread over every master's slots
            for _ in range(1 + i % 4):
                brake.check("fetch", {"url": "https://example.invalid"}, session_id=f"agent-{i}")

    listed = run("--url", cluster_url, "list", "--limit", "7", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = as_json(listed)
    assert rows["matched"] == 30 and rows["shown"] == 7 and rows["truncated"] is True
    assert [r["count"] for r in rows["sessions"]] == [4] * 7
    # judged by the limit the fleet judged them by (10, kept in each record), not the CLI's default 3
    assert all(r["limit"] == 10 and r["limit_source"] == "record" and not r["denying"] for r in rows["sessions"])
    what_if = run("--url", cluster_url, "list", "--limit", "7", "--json", "--max-repeats", "3")
    assert all(r["denying"] and r["limit_source"] == "what-if" for r in as_json(what_if)["sessions"])

    doctor = run("--url", cluster_url, "doctor", "--json")
    assert doctor.returncode == 0, doctor.stdout
    report = as_json(doctor)
    assert report["mode"] == "cluster" and len(report["nodes"]) == 3
    assert {c["status"] for c in report["checks"]} == {"ok"}
    assert "3 node(s)" in next(c["detail"] for c in report["checks"] if c["name"] == "script")

    cleared = run("--url", cluster_url, "clear", "--all", "--yes", "--json")
    assert cleared.returncode == 0, cleared.stderr
    assert as_json(cleared)["cleared"] == 30
    with DistributedBrake.from_url(cluster_url) as brake:
        assert list(brake.sessions()) == []


# -- passwords, unreachable and silent servers ---------------------------------------------------------


def test_wrong_and_right_password_never_shown() -> None:
    with RedisServer(password=RIGHT_PW, name="cli-auth") as server:
        wrong = f"redis://:{WRONG_PW}@127.0.0.1:{server.port}"
        right = f"redis://:{RIGHT_PW}@127.0.0.1:{server.port}"
        results = [
            run("--url", wrong, "inspect", "someone"),
            run("--url", wrong, "doctor"),
            run("--json", "check", "t", "{}", "--session", "s", DISTBRAKE_URL=wrong),
            run("--url", right, "doctor"),
            run("doctor", "--json", DISTBRAKE_URL=right),
            run("--url", right, "check", "t", "{}", "--session", "s"),
        ]
    for result in results:
        no_secret(result, RIGHT_PW, WRONG_PW)
    inspect_wrong, doctor_wrong, check_wrong, doctor_right, doctor_env, check_right = results
    assert inspect_wrong.returncode == 4
    assert "refused the credentials" in one_line_error(inspect_wrong)
    assert ":***@" in inspect_wrong.stderr
    assert doctor_wrong.returncode == 4
    assert "FAIL" in doctor_wrong.stdout and "refused the credentials" in doctor_wrong.stdout
    assert check_wrong.returncode == 4
    assert as_json(check_wrong)["error"]["kind"] == "auth"
    assert doctor_right.returncode == 0, doctor_right.stdout
    assert f"redis://:***@127.0.0.1:{server.port}" in doctor_right.stdout
    assert doctor_env.returncode == 0
    assert as_json(doctor_env)["config"]["url"] == {
        "value": f"redis://:***@127.0.0.1:{server.port}", "source": "variable DISTBRAKE_URL"}
    assert check_right.returncode == 0 and "count 1 of limit 3" in check_right.stdout


def timed(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """`run(*args)` and its time less the run-queue delay of its process (tests/waits.py): on a loaded machine a CLI
    that ran late is not charged for the cores it waited for (a loaded run took 9.9 s for a 1 s timeout)."""
    return run_measured([sys.executable, "-m", "distbrake", *args], cwd=ROOT, env=_env())


def test_nothing_listening_exits_4_fast() -> None:
    port = free_port()
    result, took = timed("--url", f"redis://127.0.0.1:{port}", "--timeout", str(TIMEOUT), "list")
    assert took < TIMEOUT + SLACK
    assert result.returncode == 4
    assert "unreachable" in one_line_error(result)


def test_silent_server_exits_4_within_the_timeout(hanging_port: int) -> None:
    url = f"redis://127.0.0.1:{hanging_port}"
    for args in (["check", "search", "{}", "--session", "s"], ["doctor", "--json"]):
        result, took = timed("--url", url, "--timeout", str(TIMEOUT), *args)
        assert took < TIMEOUT + SLACK, args
        assert result.returncode == 4, args
        if args[0] == "doctor":
            report = as_json(result)
            assert report["ok"] is False
            connect = next(c for c in report["checks"] if c["name"] == "connect")
            assert connect["status"] == "fail" and "did not answer within 1 s" in connect["detail"]
            assert connect["fix"]
        else:
            assert "did not answer within 1 s" in one_line_error(result)


# -- demo and bench -------------------------------------------------------------------------------------


def test_demo_on_the_embedded_default() -> None:
    result = run("demo")
    assert result.returncode == 0, result.stderr
    assert "shared streak: agent bravo's identical call ran on worker-" in result.stdout
    assert "the count came from the shared store" in result.stdout
    assert "denied agent bravo" in result.stdout
    assert "calls made: " in result.stdout

    data = as_json(run("demo", "--workers", "3", "--calls", "5", "--json"))
    assert data["mode"] == "threads" and data["backend"] == "memory://"
    assert data["denied"] >= 1 and all(d["agent"] == "bravo" for d in data["denials"])
    proof = data["shared_streak"]
    assert proof["holds"] is True
    assert proof["own_calls"] < proof["max_repeats"] <= proof["shared_count"]
    assert len(set(proof["workers_in_order"])) > 1
    assert len(data["workers"]) == 3
    assert sum(w["calls"] for w in data["workers"]) == data["calls"]


def test_demo_on_redis_uses_processes(redis_url: str) -> None:
    data = as_json(run("--url", redis_url, "demo", "--workers", "2", "--json"))
    assert data["mode"] == "processes" and data["shared_streak"]["holds"] is True
    assert len({w["label"] for w in data["workers"]}) == 2  # two distinct pids
    with DistributedBrake.from_url(redis_url) as brake:
        assert list(brake.sessions()) == []  # cleaned up


BENCH_FIELDS = {
    "backend", "key_prefix", "checks", "tasks", "sessions", "sync_checks_per_second", "sync_p50_us", "sync_p99_us",
    "worker_cpu_us_per_check", "async_checks_per_second", "async_p50_us", "async_p99_us",
    "server_cpu_us_per_check", "server_total_cpu_us_per_check", "server_checks_per_core_second",
    "memory_bytes_per_session", "sessions_per_gb", "cleared", "not_available",
}


def _timed_checks_are_measured(report: dict[str, Any], checks: int) -> None:
    assert set(report) == BENCH_FIELDS
    assert (report["checks"], report["tasks"]) == (checks, 64)
    for mode in ("sync", "async"):
        assert report[f"{mode}_checks_per_second"] > 0
        assert 0 < report[f"{mode}_p50_us"] <= report[f"{mode}_p99_us"]
    assert report["worker_cpu_us_per_check"] > 0


def _script_calls(server: RedisServer) -> int:
    stats = server.info("commandstats")
    calls = 0
    for name in ("evalsha", "eval"):
        found = re.search(r"calls=(\d+)", stats.get(f"cmdstat_{name}", "calls=0"))
        assert found is not None
        calls += int(found.group(1))
    return calls


def test_bench_measures_a_real_redis_in_absolute_terms_and_deletes_what_it_wrote(
    redis_server: RedisServer, redis_url: str,
) -> None:
    before = _script_calls(redis_server)
    # 2,000 sessions (~430 KB): an idle client of the shared server gives back 16-32 KB of buffers at any moment
    result = run("--url", redis_url, "bench", "--checks", "640", "--sessions", "2000", "--json")
    assert result.returncode == 0, result.stderr
    report = as_json(result)
    _timed_checks_are_measured(report, 640)
    assert report["backend"] == redis_url and report["not_available"] == {}
    assert re.fullmatch(r"bench[0-9a-f]{4}", report["key_prefix"])
    assert _script_calls(redis_server) - before >= 2 * 640 + 2000  # every timed check ran the script
    script, total = report["server_cpu_us_per_check"], report["server_total_cpu_us_per_check"]
    assert 0 < script < total  # the script's own time is a part of the server's CPU per check
    assert report["server_checks_per_core_second"] == pytest.approx(1e6 / total, rel=0.01)
    assert 50 < report["memory_bytes_per_session"] < 2000
    assert report["sessions_per_gb"] == pytest.approx(1e9 / report["memory_bytes_per_session"], rel=0.01)
    # 2,000 sessions for memory, one sync session, 64 async tasks' warm-up and timed sessions, the warm-up
    assert report["cleared"] == 2000 + 1 + 2 * 64 + 1
    assert redis_server.client().dbsize() == 0

    # 1,000 sessions (~200 KB): the growth of used_memory over 100 (~20 KB) was within what a client of an earlier
    # test, going away meanwhile, gives back, and the figure came out n/a
    text = run("--url", redis_url, "bench", "--checks", "64", "--sessions", "1000")
    assert text.returncode == 0, text.stderr
    assert "server CPU per check: the script (INFO commandstats)" in text.stdout
    assert "sessions per GB of server memory" in text.stdout and "n/a" not in text.stdout
    assert "deleted" in text.stdout and redis_server.client().dbsize() == 0


def test_bench_on_a_cluster_sums_its_masters(cluster_url: str) -> None:
    # 2,000 sessions (~440 KB over three masters): over 300 (~66 KB), the query buffers other clients of the
    # shared Cluster give back while idle (16-32 KB each, per master) moved the figure from 55 to 373 B, and CI
    # once read 29 B
    report = as_json(run("--url", cluster_url, "bench", "--checks", "64", "--sessions", "2000", "--json"))
    _timed_checks_are_measured(report, 64)
    assert report["not_available"] == {} and report["server_cpu_us_per_check"] > 0
    assert 50 < report["memory_bytes_per_session"] < 2000
    with DistributedBrake.from_url(cluster_url) as brake:
        assert list(brake.sessions()) == []


def test_bench_on_memory_reports_what_it_cannot_know_as_not_available() -> None:
    result = run("bench", "--checks", "64", "--json")
    assert result.returncode == 0, result.stderr
    report = as_json(result)
    _timed_checks_are_measured(report, 64)
    server = ("server_cpu_us_per_check", "server_total_cpu_us_per_check", "server_checks_per_core_second",
              "memory_bytes_per_session", "sessions_per_gb")
    assert [report[field] for field in server] == [None] * len(server)
    assert set(report["not_available"]) == {"server_cpu_us_per_check", "memory_bytes_per_session"}
    assert all("memory://" in why for why in report["not_available"].values())
    text = run("bench", "--checks", "64")
    assert text.returncode == 0 and text.stdout.count("n/a") == len(server)
    assert "not available: memory:// is the embedded store" in text.stdout

    down = run("--url", f"redis://127.0.0.1:{free_port()}", "bench", "--timeout", "1")
    assert down.returncode == 4 and "unreachable" in one_line_error(down)


def test_help_and_version_load_no_redis_client_pydantic_or_rich() -> None:
    code = (
        "import sys\n"
        "from distbrake.cli import main\n"
        "try:\n"
        "    main([sys.argv[1]])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in ('redis', 'pydantic', 'rich', 'fakeredis') if m in sys.modules), file=sys.stderr)\n"
    )
    for flag in ("--help", "--version"):
        done = subprocess.run([sys.executable, "-c", code, flag], check=True, capture_output=True, text=True,
                              timeout=60)
        assert done.stderr.strip() == "[]", (flag, done.stderr)
        assert "distbrake" in done.stdout


def test_denial_error_is_a_loop_brake_error_text(redis_url: str) -> None:
    """The text `check` prints on denial is the library's own error message."""
    with DistributedBrake.from_url(redis_url, max_repeats=1) as brake, \
            pytest.raises(LoopBrakeError) as caught:
        brake.check("x", {}, session_id="one")
    result = run("--url", redis_url, "--max-repeats", "1", "check", "x", "{}", "--session", "two")
    assert result.returncode == 3
    assert result.stdout.strip() == str(caught.value)


def test_shell_completion_script() -> None:
    result = run(_DISTBRAKE_COMPLETE="bash_source")
    assert result.returncode == 0
    assert "_distbrake_completion" in result.stdout and "complete " in result.stdout
