"""The CLI for an on-call engineer (issues 12.12 and 15.4), run for real in subprocesses.

* a URL without a password against a `requirepass` server says that a password
  is needed (not "HELLO must be called with the client already authenticated");
* doctor's ACL fix includes `+select` when the URL names a database other than 0;
* doctor's eviction advice says which maxmemory policies can lose a streak;
* the global options are accepted after the command too (the later one wins)
  and shown in every command's --help;
* `check --dry-run` answers "would this call be denied?" and writes nothing;
* `demo --calls N` makes N calls per agent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from distbrake import DistributedBrake, call_hash
from tests.servers import RedisServer, free_port
from tests.test_cli import as_json, no_secret, one_line_error, run

PW = "req-pass-4471"
COMMANDS = ("inspect", "list", "clear", "block", "unblock", "hash", "check", "doctor", "bench", "demo", "stats", "top",
            "proxy")


@pytest.fixture(scope="module")
def locked() -> Iterator[RedisServer]:
    """A server with `requirepass`, and a user who may do everything but SELECT."""
    with RedisServer(password=PW, acl_users=["nosel on >nosel-pw ~* +@all -select"],
                     name="cli-locked") as server:
        yield server


def _check(report: dict[str, Any], name: str) -> dict[str, str]:
    return next(c for c in report["checks"] if c["name"] == name)


# -- issue 12.12: what a missing password, a missing +select and eviction get told ---------------


def test_a_missing_password_is_named_as_such(locked: RedisServer) -> None:
    url = f"redis://127.0.0.1:{locked.port}"
    listed = run("--url", url, "list")
    assert listed.returncode == 4
    line = one_line_error(listed)
    assert "HELLO" not in line and "already authenticated" not in line
    assert f"backend {url} requires a password and the URL has none" in line
    assert (f"the server requires a password: put it in the URL, redis://:<PASSWORD>@127.0.0.1:"
            f"{locked.port}") in line

    as_user = run("--url", f"redis://brake@127.0.0.1:{locked.port}", "--json", "check", "t", "{}",
                  "--session", "s")
    assert as_user.returncode == 4
    error = as_json(as_user)["error"]
    assert error["kind"] == "auth"
    assert f"redis://brake:<PASSWORD>@127.0.0.1:{locked.port}" in error["message"]

    doctor = run("--url", url, "doctor", "--json")
    assert doctor.returncode == 4
    connect = _check(as_json(doctor), "connect")
    assert connect["status"] == "fail" and "requires a password" in connect["detail"]
    assert connect["fix"].startswith("the server requires a password: put it in the URL, ")

    wrong = run("--url", f"redis://:not-it@127.0.0.1:{locked.port}", "list")
    assert wrong.returncode == 4 and "refused the credentials" in one_line_error(wrong)
    for result in (listed, as_user, doctor, wrong):
        no_secret(result, PW, "not-it")


def test_doctor_asks_for_select_when_the_url_names_another_database(locked: RedisServer) -> None:
    url = locked.url_with("nosel", "nosel-pw", db=2)
    doctor = run("--url", url, "doctor", "--json")
    assert doctor.returncode == 4
    connect = _check(as_json(doctor), "connect")
    assert "'select' command" in connect["detail"]
    assert "ACL SETUSER nosel " in connect["fix"] and " +select " in connect["fix"]
    assert connect["fix"].endswith(" ~distbrake:*")

    listed = run("--url", url, "list")
    assert listed.returncode == 4 and "+select" in one_line_error(listed)
    no_secret(doctor, "nosel-pw")
    no_secret(listed, "nosel-pw")

    # On database 0 nothing is selected, and nothing asks for +select.
    full = run("--url", locked.url_with(password=PW, db=0), "doctor", "--json")
    assert full.returncode == 0, full.stdout
    assert "SELECT" not in _check(as_json(full), "permissions")["detail"]
    on_db2 = run("--url", locked.url_with(password=PW, db=2), "doctor", "--json")
    assert on_db2.returncode == 0, on_db2.stdout
    assert _check(as_json(on_db2), "permissions")["detail"].endswith(
        ", SELECT on distbrake:*")  # ACL DRYRUN'd, as a connection sends it


@pytest.mark.parametrize("policy", ["volatile-lru", "volatile-random", "allkeys-lfu", "volatile-ttl"])
def test_eviction_advice_names_the_policies_that_can_lose_a_streak(
    redis_server: RedisServer, redis_url: str, policy: str
) -> None:
    before = redis_server.command("CONFIG", "GET", "maxmemory-policy")
    try:
        redis_server.command("CONFIG", "SET", "maxmemory", "512mb", "maxmemory-policy", policy)
        report = as_json(run("--url", redis_url, "doctor", "--json"))
    finally:
        redis_server.command("CONFIG", "SET", "maxmemory", "0", "maxmemory-policy", before[1])
    advice = _check(report, "memory policy")
    assert advice["status"] == "warn"
    assert f"maxmemory-policy {policy}" in advice["detail"]
    assert "may evict any streak record, a looping session's too" in advice["detail"]
    assert "every allkeys-* and volatile-* policy can" in advice["detail"]
    assert "never idle" not in advice["detail"] + advice["fix"]
    assert "set maxmemory-policy noeviction (only it never evicts" in advice["fix"]


def test_noeviction_gets_no_eviction_warning(redis_server: RedisServer, redis_url: str) -> None:
    before = redis_server.command("CONFIG", "GET", "maxmemory-policy")
    try:
        redis_server.command("CONFIG", "SET", "maxmemory", "512mb", "maxmemory-policy",
                             "noeviction")
        report = as_json(run("--url", redis_url, "doctor", "--json"))
    finally:
        redis_server.command("CONFIG", "SET", "maxmemory", "0", "maxmemory-policy", before[1])
    assert report["ok"] is True
    assert "memory policy" not in {c["name"] for c in report["checks"]}


# -- issue 15.4: global options anywhere ------------------------------------------------------------


def test_global_options_after_the_command(redis_url: str) -> None:
    with DistributedBrake.from_url(redis_url, key_prefix="oncall") as brake:
        brake.check("search", {"q": 1}, session_id="s1")
        brake.check("search", {"q": 1}, session_id="s1")

    after = run("list", "--url", redis_url, "--key-prefix", "oncall", "--json")
    assert after.returncode == 0, after.stderr
    assert [s["session_id"] for s in as_json(after)["sessions"]] == ["s1"]

    nowhere = f"redis://127.0.0.1:{free_port()}"
    # Both given: the one after the command wins (the one before points at nothing).
    both = run("--url", nowhere, "--max-repeats", "9", "inspect", "s1", "--url", redis_url,
               "--key-prefix", "oncall", "--max-repeats", "2", "--json")
    assert both.returncode == 0, both.stderr
    state = as_json(both)
    assert state["count"] == 2 and state["limit"] == 2 and state["denying"] is True
    # And the other way round: the one after wins over a good one before.
    reverse = run("--url", redis_url, "list", "--url", nowhere, "--timeout", "0.5")
    assert reverse.returncode == 4 and "unreachable" in one_line_error(reverse)

    before_only = run("--url", redis_url, "--key-prefix", "oncall", "--json", "inspect", "s1")
    assert before_only.returncode == 0 and as_json(before_only)["limit"] == 3

    secret_a, secret_b = "before-secret-1", "after-secret-2"
    hidden = run("--url", f"redis://:{secret_a}@127.0.0.1:{free_port()}", "list",
                 "--url", f"redis://:{secret_b}@127.0.0.1:{free_port()}", "--timeout", "0.5")
    assert hidden.returncode == 4
    no_secret(hidden, secret_a, secret_b)

    for name in COMMANDS:
        help_text = run(name, "--help").stdout
        for option in ("--url URL", "--timeout SECONDS", "--key-prefix PREFIX",
                       "--max-repeats N", "--json"):
            assert option in help_text, (name, option)
        assert '"what if"' in " ".join(help_text.split()), name


# -- check --dry-run -------------------------------------------------------------------------------


WRITES = {"evalsha", "eval", "hset", "hincrby", "pexpire", "expire", "del", "set", "unlink",
          "script|load", "hdel", "flushall", "flushdb"}


def _commands(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def test_check_dry_run_predicts_and_writes_nothing(redis_url: str) -> None:
    args = {"q": "paris"}
    with DistributedBrake.from_url(redis_url) as brake:
        brake.check("search", args, session_id="agent")
        brake.check("search", args, session_id="agent")  # count 2 of 3: the next one is denied
        brake.check("search", args, session_id="calm")  # count 1
        key = brake.key("agent")
    client = redis.Redis.from_url(redis_url)
    dump, ttl = client.dump(key), client.pttl(key)
    dirty = client.info("persistence")["rdb_changes_since_last_save"]
    calls = _commands(client)

    denied = run("--url", redis_url, "check", "search", json.dumps(args), "--session", "agent",
                 "--dry-run", "--json")
    human = run("--url", redis_url, "check", "search", json.dumps(args), "--session", "agent",
                "--dry-run")
    other = run("--url", redis_url, "check", "search", '{"q": "lyon"}', "--session", "agent",
                "--dry-run", "--json")
    calm = run("--url", redis_url, "check", "search", json.dumps(args), "--session", "calm",
               "--dry-run", "--json")
    nobody = run("--url", redis_url, "check", "search", json.dumps(args), "--session", "nobody",
                 "--dry-run", "--json")

    # Nothing written: the record, its TTL (not refreshed), the dirty counter, no write command.
    assert client.dump(key) == dump
    assert client.pttl(key) <= ttl
    assert client.info("persistence")["rdb_changes_since_last_save"] == dirty
    ran = {name: n - calls.get(name, 0) for name, n in _commands(client).items()
           if n != calls.get(name, 0)}
    assert not set(ran) & WRITES, ran
    assert ran.get("hmget", 0) >= 5, ran  # the dry runs read the records
    assert client.exists(DistributedBrake.from_url(redis_url).key("nobody")) == 0

    prefix = call_hash("search", args)[:12]
    assert denied.returncode == 3, denied.stderr
    verdict = as_json(denied)
    assert verdict["dry_run"] is True and verdict["allowed"] is False
    assert (verdict["count"], verdict["limit"], verdict["stored_count"]) == (3, 3, 2)
    assert verdict["hash_prefix"] == prefix and verdict["decided_by"] == "dry-run"
    assert verdict["same_call_stored"] is True and verdict["message"].startswith("dry run: ")
    assert human.returncode == 3
    assert human.stdout.startswith(f"would be denied: call 3 in a row reaches limit 3 (call {prefix})")
    assert "dry run: nothing counted" in human.stdout

    assert other.returncode == 0 and as_json(other)["count"] == 1
    assert as_json(other)["same_call_stored"] is False
    assert calm.returncode == 0 and as_json(calm)["count"] == 2 and as_json(calm)["allowed"]
    assert nobody.returncode == 0 and as_json(nobody)["stored_count"] == 0

    # The prediction holds: the real check now is denied, as call 3.
    real = run("--url", redis_url, "check", "search", json.dumps(args), "--session", "agent",
               "--json")
    assert real.returncode == 3 and as_json(real)["count"] == 3
    assert as_json(real)["dry_run"] is False

    replay = run("--url", redis_url, "check", "search", "{}", "--session", "a", "--dry-run",
                 "--call-id", "c1")
    assert replay.returncode == 2 and "--call-id" in one_line_error(replay)


# The dry run, inspect and the real check judge by one rule model (issue 22): they agree on the
# rules a dry run once stated on its own (ignore_fields, shadow mode).
AGREEING = [
    pytest.param({"DISTBRAKE_TOOLS": '{"search": {"ignore_fields": ["nonce"]}}'},
                 [{"q": "p", "nonce": n} for n in range(3)], id="ignore_fields"),
    pytest.param({"DISTBRAKE_ENFORCE": "false"}, [{"q": "p"}] * 3, id="shadow"),
    pytest.param({"DISTBRAKE_WARN_AT": "2"}, [{"q": "p"}] * 2, id="warn"),
    pytest.param({}, [{"q": "p"}, {"q": "p"}, {"q": "other"}], id="streak-broken"),
]


@pytest.mark.parametrize(("env", "calls"), AGREEING)
def test_a_dry_run_answers_what_the_real_check_then_does(
    redis_url: str, env: dict[str, str], calls: list[dict[str, Any]]
) -> None:
    for args in calls[:-1]:
        assert run("--url", redis_url, "check", "search", json.dumps(args), "--session", "s",
                   **env).returncode == 0
    last = json.dumps(calls[-1])
    dry = run("--url", redis_url, "--json", "check", "search", last, "--session", "s", "--dry-run", **env)
    real = run("--url", redis_url, "--json", "check", "search", last, "--session", "s", **env)
    predicted, done = as_json(dry), as_json(real)
    assert dry.returncode == real.returncode, (dry.stdout, real.stdout)
    for field in ("allowed", "count", "limit", "hash_prefix", "would_deny"):
        assert predicted[field] == done[field], field


def test_a_shadow_session_is_would_deny_and_not_denying(redis_url: str) -> None:
    for _ in range(3):
        assert run("--url", redis_url, "check", "t", "{}", "--session", "s",
                   DISTBRAKE_ENFORCE="false").returncode == 0
    state = as_json(run("--url", redis_url, "--json", "inspect", "s"))
    assert (state["state"], state["denying"], state["would_deny"]) == ("would_deny", False, True)
    assert state["next_denied"] is False  # nobody denies the next call either
    listed = as_json(run("--url", redis_url, "--json", "list"))["sessions"]
    assert [(row["denying"], row["would_deny"]) for row in listed] == [(False, True)]


# -- demo --calls ----------------------------------------------------------------------------------


def test_demo_makes_exactly_calls_per_agent() -> None:
    five = as_json(run("demo", "--workers", "3", "--calls", "5", "--json"))
    assert five["calls"] == 15
    assert five["calls_per_agent"] == {"alpha": 5, "bravo": 5, "charlie": 5}
    assert sum(w["calls"] for w in five["workers"]) == 15
    assert five["denied"] == 2 and five["shared_streak"]["holds"] is True  # calls 4 and 5 of bravo

    fewest = as_json(run("--max-repeats", "2", "demo", "--calls", "3", "--json"))
    assert fewest["calls"] == 9 and fewest["denied"] == 1

    default = as_json(run("demo", "--json"))
    assert default["calls_per_agent"] == {"alpha": 8, "bravo": 8, "charlie": 8}

    human = run("demo", "--calls", "6", "--workers", "2")
    assert human.returncode == 0, human.stderr
    assert "(bravo is stuck), 6 calls each;" in human.stdout
    assert "calls made: 18," in human.stdout

    too_few = run("demo", "--calls", "3")
    assert too_few.returncode == 2
    assert "needs at least 4 calls" in one_line_error(too_few)
