"""The opt-in rules (issue 10, part one): warn before deny, shadow mode, declared identity, per-tool rules.

Written once and run on every brake (`tests.backends.ALL_BRAKES`), plus a
hypothesis test that drives random call sequences through a small pure
reference model and through every brake kind and requires identical
verdicts, counts, warnings and would-deny flags.
"""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distbrake import (
    BrakeSettings,
    ConfigurationError,
    InvalidMaxRepeatsError,
    LoopBrake,
    LoopBrakeError,
    Verdict,
    call_hash,
)
from tests.backends import ALL_BRAKES, Brakes, Checker

WARNING_2_OF_3 = (
    'loop brake: tool "search" called 2 times in a row with identical arguments (call {prefix}\u2026, '
    "limit 3); the next identical call will be denied. Change the arguments, call a different tool, or stop."
)


@pytest.fixture(params=ALL_BRAKES)
def make(request: pytest.FixtureRequest, brakes: Brakes) -> Callable[..., Checker]:
    build = brakes.of(request.param)
    return lambda **options: Checker(build(**options))


async def outcome(brake: Checker, tool: str, args: Any, **kw: Any) -> tuple[int, str | None, bool]:
    """(count, negative when denied; the warning; would_deny)."""
    try:
        verdict: Verdict = await brake.check(tool, args, **kw)
    except LoopBrakeError as error:
        assert error.kind == "repeat"
        return -error.count, None, False
    return verdict.count, verdict.warning, verdict.would_deny


async def test_warn_then_deny(make: Callable[..., Checker]) -> None:
    brake = make(warn_at=2)
    args = {"q": "weather"}
    prefix = call_hash("search", args)[:12]
    assert await outcome(brake, "search", args, session_id="s") == (1, None, False)
    assert await outcome(brake, "search", args, session_id="s") == (2, WARNING_2_OF_3.format(prefix=prefix), False)
    assert await outcome(brake, "search", args, session_id="s") == (-3, None, False)


async def test_the_warning_says_when_denial_begins(make: Callable[..., Checker]) -> None:
    brake = make(max_repeats=5, warn_at=2)
    got = [await outcome(brake, "search", {}, session_id="s") for _ in range(4)]
    assert [count for count, _, _ in got] == [1, 2, 3, 4]
    assert got[0][1] is None
    assert got[1][1] is not None and "identical calls will be denied from the 5th in a row" in got[1][1]
    assert got[3][1] is not None and "the next identical call will be denied" in got[3][1]


async def test_shadow_mode_never_denies_and_reports_would_deny(
    make: Callable[..., Checker], caplog: pytest.LogCaptureFixture
) -> None:
    brake = make(enforce=False, warn_at=2)
    with caplog.at_level(logging.WARNING, logger="distbrake"):
        got = [await outcome(brake, "search", {"secret": "hunter2"}, session_id="s") for _ in range(4)]
    # counted exactly as when enforcing; no warning is shown to the model in shadow mode
    assert got == [(1, None, False), (2, None, False), (3, None, True), (4, None, True)]
    assert sum("would deny" in r.getMessage() for r in caplog.records) == 2
    assert all("hunter2" not in r.getMessage() for r in caplog.records)


async def test_per_tool_rules(make: Callable[..., Checker]) -> None:
    brake = make(warn_at=2, tools={
        "poll": {"max_repeats": 5},  # inherits warn_at 2 (below its limit)
        "tiny": {"max_repeats": 2},  # its limit is 2: the global warn_at 2 is not below it, not inherited
        "shadowed": {"enforce": False},
        "heartbeat": {"exempt": True},
    })
    assert [(await outcome(brake, "poll", {}, session_id="a"))[:2][0] for _ in range(5)] == [1, 2, 3, 4, -5]
    assert [await outcome(brake, "tiny", {}, session_id="b") for _ in range(2)] == [(1, None, False), (-2, None, False)]
    assert [(await outcome(brake, "shadowed", {}, session_id="c"))[2] for _ in range(3)] == [False, False, True]
    verdict = await brake.check("heartbeat", {}, session_id="d")
    assert verdict.exempt and verdict.decided_by == "exempt"


async def test_ignore_fields_catches_a_nonce_loop(make: Callable[..., Checker]) -> None:
    brake = make(tools={"fetch": {"ignore_fields": ["request_id", "meta.nonce"]}})
    calls = [{"url": "u", "request_id": i, "meta": {"nonce": f"n{i}", "page": 1}} for i in range(3)]
    assert [(await outcome(brake, "fetch", args, session_id="s"))[0] for args in calls] == [1, 2, -3]
    # a field that is not named still counts: page 2 is another call
    assert (await outcome(brake, "fetch", {"url": "u", "meta": {"page": 2}}, session_id="s"))[0] == 1
    # other tools hash exactly as before (the Node vectors are unchanged)
    other = await brake.check("search", {"request_id": 1}, session_id="t")
    assert other.hash_prefix == call_hash("search", {"request_id": 1})[:12]


def test_ignore_fields_leaves_the_callers_arguments_alone() -> None:
    brake = LoopBrake(tools={"fetch": {"ignore_fields": ["meta.nonce", "absent.path", "url.not_an_object"]}})
    args = {"url": "u", "meta": {"nonce": 1}}
    brake.check("fetch", args)
    assert args == {"url": "u", "meta": {"nonce": 1}}
    assert brake.check("fetch", {"url": "u", "meta": {"nonce": 2}}).count == 2
    with pytest.raises(LoopBrakeError):  # the nonce absent is the same call too
        brake.check("fetch", {"url": "u", "meta": {}})


def test_error_kind_survives_pickling() -> None:
    error = LoopBrakeError("search", 3, 3, "9f2c1a7b3e04", "s")
    assert error.kind == "repeat"
    assert pickle.loads(pickle.dumps(error)).kind == "repeat"


@pytest.mark.parametrize(("options", "words"), [
    ({"warn_at": 3}, ["warn_at", "argument warn_at", "below max_repeats"]),
    ({"warn_at": 0}, ["warn_at", "argument warn_at", ">= 1"]),
    ({"tools": {"search": {"warn_at": 5, "max_repeats": 5}}}, ["tools['search'].warn_at", "argument tools"]),
    ({"tools": {"search": {"max_repeats": 0}}}, ["max_repeats", "argument tools"]),
    ({"tools": {"search": {"exempt": True, "max_repeats": 4}}}, ["tools['search']", "exempt"]),
    ({"tools": {"search": {"ignore_fields": ["a..b"]}}}, ["ignore_fields", "argument tools"]),
    ({"tools": {"search": {"typo": 1}}}, ["typo", "argument tools"]),
    ({"tools": {"search": {"max_repeats": 4}}, "tool_max_repeats": {"search": 5}}, ["disagrees"]),
])
def test_bad_rules_fail_at_build_naming_tool_field_and_source(options: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ConfigurationError) as caught:
        LoopBrake(**options)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


def test_rules_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTBRAKE_WARN_AT", "2")
    monkeypatch.setenv("DISTBRAKE_ENFORCE", "false")
    monkeypatch.setenv("DISTBRAKE_TOOLS", json.dumps({"get_job_status": {"max_repeats": 30, "enforce": True}}))
    settings_ = BrakeSettings()
    assert (settings_.warn_at, settings_.enforce) == (2, False)
    rules = settings_.rules_for("get_job_status")
    assert rules is not None and (rules.max_repeats, rules.enforce, rules.warn_at) == (30, True, 2)
    monkeypatch.setenv("DISTBRAKE_TOOLS", json.dumps({"search": {"warn_at": 9}}))
    with pytest.raises(ConfigurationError, match="environment variable DISTBRAKE_TOOLS"):
        LoopBrake()
    monkeypatch.setenv("DISTBRAKE_TOOLS", json.dumps({"search": {"max_repeats": -1}}))
    with pytest.raises(InvalidMaxRepeatsError, match="DISTBRAKE_TOOLS"):
        LoopBrake()


# -- the reference model -------------------------------------------------------------------


class Model:
    """The rules in a few lines: one record per session (hash, count, last two call ids), and with cycles
    on a ring of the session's counted calls."""

    def __init__(self, settings_: BrakeSettings) -> None:
        self.settings = settings_
        self.records: dict[str, tuple[str, int, str | None, str | None]] = {}
        self.results: dict[str, object] = {}  # progress tools: the streak's last observed result
        self.rings: dict[str, list[str]] = {}  # cycles: the counted calls' hashes, oldest first
        self.cycles: dict[str, tuple[int, int]] = {}  # the period the last and the previous call completed

    def observe(self, session: str, result: object) -> None:
        """The tool ran right after its check: a changed result restarts the streak at 1."""
        digest, count, last, _previous = self.records[session]
        if session in self.results and self.results[session] != result and count > 1:
            self.records[session] = (digest, 1, last, None)
        self.results[session] = result

    def check(self, tool: str, args: Any, session: str, call_id: str | None) -> tuple[int, str | None, bool, str]:
        rules = self.settings.rules_for(tool)
        if rules is None:
            return 0, None, False, ""
        if rules.ignore_fields and isinstance(args, dict):
            args = {k: v for k, v in args.items() if (k,) not in rules.ignore_fields}
        digest = call_hash(tool, args)
        last = self.records.get(session)
        if last is not None and last[0] == digest:
            if call_id is not None and call_id in (last[2], last[3] if last[1] > 1 else None):
                count = last[1] if call_id == last[2] else last[1] - 1
                period = self.cycles.get(session, (0, 0))[0 if call_id == last[2] else 1]
                return self.judge(tool, digest, count, rules, period)
            count = last[1] + 1
            self.records[session] = (digest, count, call_id, last[2])
        else:
            count = 1
            self.records[session] = (digest, 1, call_id, None)
            self.results.pop(session, None)
        return self.judge(tool, digest, count, rules, self.ring_step(session, digest))

    def ring_step(self, session: str, digest: str) -> int:
        """The period of the cycle this counted call completes (0: none or cycles off)."""
        longest, repeats = self.settings.max_cycle_period, self.settings.cycle_repeats
        if not longest:
            return 0
        ring = self.rings.setdefault(session, [])
        ring.append(digest)
        period = next(
            (
                p for p in range(2, longest + 1)
                if len(ring) >= p * repeats
                and all(ring[-i] == ring[-i - p] for i in range(1, p * (repeats - 1) + 1))
                and len(set(ring[-p:])) > 1
            ),
            0,
        )
        self.cycles[session] = (period, self.cycles.get(session, (0, 0))[0])
        return period

    def judge(self, tool: str, digest: str, count: int, rules: Any, period: int) -> tuple[int, str | None, bool, str]:
        if count >= rules.max_repeats or period:
            kind = "repeat" if count >= rules.max_repeats else f"cycle{period}"
            return (-count, None, False, kind) if rules.enforce else (count, None, True, "")
        if rules.warn_at is not None and count >= rules.warn_at and rules.enforce:
            from distbrake.rules import warning_text

            return count, warning_text(tool, count, rules.max_repeats, digest[:12]), False, ""
        return count, None, False, ""


TOOLS = {
    "a": {},
    "b": {"max_repeats": 4, "warn_at": 2},
    "c": {"enforce": False},
    "d": {"ignore_fields": ["nonce"]},
    "e": {"exempt": True},
    "f": {"progress": True},
}
CALL = st.tuples(
    st.sampled_from(sorted(TOOLS)),
    st.fixed_dictionaries({"q": st.integers(0, 1)}, optional={"nonce": st.integers(0, 3)}),
    st.sampled_from(["s1", "s2"]),
    st.one_of(st.none(), st.sampled_from(["c1", "c2", "c3"])),
    st.integers(0, 1),  # what the tool returns (observed for the progress tool "f")
)
# Cycles come up often: short patterns of a few calls, each repeated a few times (A,B,A,B,A,B,C,...).
CYCLING_CALL = st.tuples(
    st.sampled_from(["a", "b", "c", "f"]),
    st.fixed_dictionaries({"q": st.integers(0, 1)}),
    st.sampled_from(["s1", "s1", "s1", "s2"]),
    st.one_of(st.none(), st.none(), st.sampled_from(["c1", "c2"])),
    st.integers(0, 1),
)
CYCLING = st.lists(
    st.tuples(st.lists(CYCLING_CALL, min_size=1, max_size=4), st.integers(1, 4)), max_size=4
).map(lambda segments: [call for pattern, times in segments for call in pattern * times][:30])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    calls=st.one_of(st.lists(CALL, max_size=14), CYCLING),
    warn_at=st.sampled_from([None, 2]),
    cycles=st.sampled_from([(0, 3), (2, 2), (2, 3), (3, 2), (4, 2)]),
)
async def test_every_brake_agrees_with_the_reference_model(
    make: Callable[..., Checker],
    calls: list[tuple[str, dict[str, int], str, str | None, int]],
    warn_at: int | None,
    cycles: tuple[int, int],
) -> None:
    options: dict[str, Any] = {
        "tools": TOOLS, "warn_at": warn_at, "max_repeats": 3, "timeout_seconds": 30.0,
        "max_cycle_period": cycles[0], "cycle_repeats": cycles[1],
    }
    brake = make(**options)
    for session in ("s1", "s2"):
        await brake.clear(session)
    model = Model(BrakeSettings(**options))
    for tool, args, session, call_id, result in calls:
        expected = model.check(tool, args, session, call_id)
        try:
            verdict: Verdict | None = await brake.check(tool, args, session_id=session, call_id=call_id)
        except LoopBrakeError as error:
            verdict, got = None, (-error.count, None, False, f"{error.kind}{error.period or ''}")
        else:
            got = (verdict.count, verdict.warning, verdict.would_deny, "")
        assert got == expected, (tool, args, session, call_id)
        if tool == "f" and verdict is not None:  # the tool ran: its result is observed
            model.observe(session, result)
            await brake._maybe(brake.brake.observe(verdict, {"status": result}))


# -- the record keeps what its last check was judged by (issue 10.7) ------------------------------


async def test_the_record_keeps_the_limit_and_enforcement_it_was_judged_by(make: Callable[..., Checker]) -> None:
    # a generous timeout: this test reads the records back, so no check may fall to the policy on a busy machine
    brake = make(warn_at=2, tools={"poll": {"max_repeats": 5, "enforce": False}}, timeout_seconds=10.0)
    decided = set()
    for _ in range(2):
        decided.add((await brake.check("search", {}, session_id="s")).decided_by)
    for _ in range(6):
        decided.add((await brake.check("poll", {}, session_id="p")).decided_by)
    assert decided <= {"in-process", "redis"}, decided
    searched, polled = await brake.inspect("s"), await brake.inspect("p")
    assert searched is not None and polled is not None
    assert (searched.max_repeats, searched.warn_at, searched.enforcing, searched.state) == (3, 2, True, "warned")
    assert (polled.max_repeats, polled.enforcing, polled.state) == (5, False, "would_deny")


def test_records_of_an_older_layout_are_read_safely(redis_url: str) -> None:
    import subprocess
    import sys

    import redis

    from distbrake import DistributedBrake, session_key

    with DistributedBrake.from_url(redis_url) as brake:
        brake.check("search", {}, session_id="new")
        client = redis.Redis.from_url(redis_url)
        current = client.hgetall(session_key("new"))
        client.hset(session_key("old"), mapping={b"h": current[b"h"], b"s": b"\x06searchold"})  # no j
        client.hset(session_key("odd"), mapping={b"h": current[b"h"], b"s": b"\x06searchodd", b"j": b"??"})
        client.close()
        states = {state.session_id: state for state in brake.sessions()}
    assert states["new"].max_repeats == 3 and states["new"].state == "ok"
    assert (states["old"].max_repeats, states["old"].state) == (None, "unknown")
    assert (states["odd"].max_repeats, states["odd"].state) == (None, "unknown")
    listed = subprocess.run([sys.executable, "-m", "distbrake", "--url", redis_url, "list", "--json"],
                            capture_output=True, text=True, check=False, timeout=60)
    assert listed.returncode == 0, listed.stderr
    rows = {row["session_id"]: row for row in json.loads(listed.stdout)["sessions"]}
    assert rows["old"]["limit_source"] == "max_repeats" and rows["old"]["state"] == "unknown"
    assert rows["new"]["limit_source"] == "record"
