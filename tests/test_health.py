"""`brake.health()` and the degraded/recovered log lines: once per outage; a wrong password or ACL is configuration."""

from __future__ import annotations

import logging
import secrets
import warnings
from typing import Any

import pytest
import redis.exceptions

from distbrake import AsyncDistributedBrake, DistributedBrake, LoopBrake
from distbrake.redis_errors import classify
from tests.backends import Checker
from tests.faults import RECOVERY_DEADLINE, until_redis
from tests.servers import RedisServer, free_port

PASSWORD = "pw-" + secrets.token_hex(8)
WRONG = "wrong-" + secrets.token_hex(8)


def build(flavour: str, url: str, **options: Any) -> Checker:
    kind = DistributedBrake if flavour == "sync" else AsyncDistributedBrake
    return Checker(kind.from_url(url, timeout_seconds=1.0, **options))


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_an_in_process_brake_is_always_healthy() -> None:
    health = LoopBrake().health()
    assert (health.state, health.last_error, health.policy, health.ok) == ("ok", None, "local", True)


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_health_flips_on_a_kill_and_back_calling_each_callback_once(
    flavour: str, server: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="distbrake")
    calls: list[str] = []
    brake = build(flavour, server.url, on_backend_error="open", retry_after_seconds=0.05,
                  on_degraded=lambda e: calls.append(type(e).__name__), on_recovered=lambda: calls.append("ok"))
    await brake.check("t", 1, session_id="s")
    before = brake.brake.health()
    for outage in (1, 2):
        server.kill()
        for n in range(5):
            assert (await brake.check("t", n, session_id="s")).decided_by == "fail-open"
        down = brake.brake.health()
        assert (down.state, down.last_error, down.policy) == ("degraded", "ConnectionError", "open")
        assert down.since >= before.since
        server.start()
        await until_redis(brake, f"s{outage}", RECOVERY_DEADLINE)
        up = brake.brake.health()
        assert up.state == "ok" and up.since >= down.since
        assert calls == ["ConnectionError", "ok"] * outage
    lines = errors(caplog)
    assert lines == [
        "distbrake: checks are not braked (every call is allowed): Redis unreachable (ConnectionError); "
        f"policy open (backend {server.url})"] * 2
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.INFO] == [
        f"distbrake: Redis at {server.url} answers again; streaks are shared again"] * 2
    await brake.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_wrong_password_is_named_a_configuration_error(
    flavour: str, caplog: pytest.LogCaptureFixture,
) -> None:
    with RedisServer(password=PASSWORD, name="auth") as server:
        brake = build(flavour, server.url_with(password=WRONG))
        verdict = await brake.check("t", 1)
        assert verdict.decided_by == "fallback"
        health = brake.brake.health()
        assert health.state == "degraded"
        assert health.last_error == "AuthenticationError (configuration: wrong password)"
        [line] = errors(caplog)
        assert line.startswith("distbrake: streaks are no longer shared across workers: Redis refused the brake "
                               "(AuthenticationError (configuration: wrong password)): a configuration error, "
                               "not an outage")
        assert WRONG not in caplog.text and PASSWORD not in caplog.text
        await brake.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_missing_password_is_not_called_a_wrong_one(flavour: str, caplog: pytest.LogCaptureFixture) -> None:
    """A URL without a password to a server that requires one: the log says a password is needed (issue 23, 13c)."""
    with RedisServer(password=PASSWORD, name="auth") as server:
        brake = build(flavour, server.url)
        assert (await brake.check("t", 1)).decided_by == "fallback"
        missing = "AuthenticationError (configuration: password required, none given)"
        assert brake.brake.health().last_error == missing
        [line] = errors(caplog)
        assert f"Redis refused the brake ({missing}): a configuration error, not an outage" in line
        assert "wrong password" not in caplog.text and PASSWORD not in caplog.text
        await brake.close()


ACL_REFUSALS = [
    # A user who may not run the script at all: NoPermissionError.
    pytest.param("noscript on >brake-pw ~distbrake:* resetchannels -@all +hget +hset +ping +script|load",
                 "NoPermissionError", id="the-script"),
    # A user who may run the script but not a command in it: Redis answers a ResponseError ("The user
    # executing the script can't run this command"), which is an ACL refusal, not an outage.
    pytest.param("noscript on >brake-pw ~distbrake:* resetchannels -@all +evalsha +eval +script|load +hget +hmget "
                 "+pexpire +pttl +ping", "ResponseError", id="a-command-inside-the-script"),
]


@pytest.mark.parametrize(("user", "error_type"), ACL_REFUSALS)
@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_an_acl_refusal_is_named_a_configuration_error(
    flavour: str, user: str, error_type: str, caplog: pytest.LogCaptureFixture,
) -> None:
    with RedisServer(acl_users=[user], name="acl") as server:
        brake = build(flavour, server.url_with(username="noscript", password="brake-pw"))
        assert (await brake.check("t", 1)).decided_by == "fallback"
        health = brake.brake.health()
        assert health.last_error == f"{error_type} (configuration: ACL refusal)"
        [line] = errors(caplog)
        assert f"({error_type} (configuration: ACL refusal)): a configuration error, not an outage" in line
        assert "unreachable" not in line
        await brake.close()


@pytest.mark.parametrize(("error", "meaning", "name"), [
    (redis.exceptions.AuthenticationError("invalid username-password pair"), "configuration",
     "AuthenticationError (configuration: wrong password)"),
    (redis.exceptions.AuthenticationError("WRONGPASS invalid username-password pair or user is disabled."),
     "configuration", "AuthenticationError (configuration: wrong password)"),
    (redis.exceptions.AuthenticationError("Authentication required."), "configuration",
     "AuthenticationError (configuration: password required, none given)"),
    (redis.exceptions.AuthenticationError("HELLO must be called with the client already authenticated"),
     "configuration", "AuthenticationError (configuration: password required, none given)"),
    (redis.exceptions.NoPermissionError("this user has no permissions to run the 'hset' command"),
     "configuration", "NoPermissionError (configuration: ACL refusal)"),
    (redis.exceptions.ResponseError("The user executing the script can't run this command or subcommand"),
     "configuration", "ResponseError (configuration: ACL refusal)"),
    (redis.exceptions.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
     "record", "ResponseError"),
    (redis.exceptions.NoScriptError("No matching script"), "script", "NoScriptError"),
    (redis.exceptions.ConnectionError("refused"), "outage", "ConnectionError"),
    (redis.exceptions.TimeoutError("timeout"), "outage", "TimeoutError"),
    (redis.exceptions.ReadOnlyError("READONLY"), "outage", "ReadOnlyError"),
])
def test_one_classifier_names_what_a_redis_error_means(error: BaseException, meaning: str, name: str) -> None:
    classified = classify(error)
    assert (classified.meaning, classified.name, classified.error_type) == (meaning, name, type(error).__name__)


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_the_first_check_decided_by_the_policy_warns_once_per_brake(
    flavour: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without any logging configured (the library's NullHandler only), a wrong URL still shows: a RuntimeWarning,
    once per brake (issue 23, 13b); where logging shows the ERROR, no warning repeats it."""
    url = f"redis://127.0.0.1:{free_port()}"
    configured = build(flavour, url)  # pytest's log capture is a handler: the ERROR is shown, nothing to warn
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (await configured.check("t", 1, session_id="s")).decided_by == "fallback"
    await configured.close()
    monkeypatch.setattr(logging.getLogger("distbrake"), "propagate", False)  # as an application without logging
    for _ in range(2):  # each brake warns once
        brake = build(flavour, url)
        with pytest.warns(RuntimeWarning) as warned:
            verdicts = [await brake.check("t", n, session_id="s") for n in range(3)]
        assert [verdict.decided_by for verdict in verdicts] == ["fallback"] * 3
        [warning] = [w for w in warned if issubclass(w.category, RuntimeWarning)]
        text = str(warning.message)
        assert text.startswith("distbrake: a check fell to the failure policy: on_backend_error='local'")
        assert url in text and "ConnectionError" in text
        await brake.close()
