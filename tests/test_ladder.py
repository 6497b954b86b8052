"""The ladder (halt_at, cycle_halt_repeats, once, max_failures, max_calls) on the in-process brakes.

The rule model (`distbrake/model.py`) states each rule; these tests pin its sequences on `LoopBrake` and on
the hooks' `FileBrake` (two brake objects on one file are two processes of one machine). The same rules on
Redis (the Lua twin) are checked against an independent oracle in tests/test_rule_options.py.
"""

from __future__ import annotations

import pickle
import time
from typing import Any

import pytest

from distbrake import ConfigurationError, LoopBrake, LoopBrakeError, LoopBrakeHalt
from distbrake.filebrake import FileBrake
from distbrake.model import ONCE_ENTRIES, Streak


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def outcome(brake: Any, tool: str, args: Any, session: str = "s", call_id: str | None = None) -> str:
    """"ok", or the kind of the refusal ("halt" for LoopBrakeHalt)."""
    try:
        verdict = brake.check(tool, args, session_id=session, call_id=call_id)
    except LoopBrakeError as error:
        return error.kind
    return "would_deny" if verdict.would_deny else "ok"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"halt_at": 3}, "invalid halt_at from argument halt_at: 3 must be above max_repeats (3)"),
        ({"halt_at": 0}, "invalid halt_at from argument halt_at: it must be an integer >= 1"),
        ({"halt_at": 5, "tools": {"s": {"max_repeats": 6}}}, "halt_at 5 must be above the tool's max_repeats (6)"),
        ({"tools": {"s": {"halt_at": 2}}}, "tools['s'].halt_at 2 must be above the tool's max_repeats (3)"),
        ({"cycle_halt_repeats": 4}, "needs the cycle rule on"),
        ({"max_cycle_period": 2, "cycle_halt_repeats": 3}, "3 must be above cycle_repeats (3) and at most 10"),
        ({"tools": {"s": {"exempt": True, "once": True}}}, "is exempt and also given halt_at, once"),
        ({"tools": {"s": {"max_calls": -1}}}, "max_calls"),
        ({"max_failures": "x"}, "invalid max_failures from argument max_failures"),
        # the script reads a count in 4 bytes: 4294967295 at most (test_record_layout packs that one)
        ({"halt_at": 2**32}, "invalid halt_at from argument halt_at: it must be 1..4294967295, not 4294967296"),
        ({"tools": {"s": {"max_calls": 2**32}}}, "tools['s'].max_calls from argument tools: it must be 1..4294967295"),
    ],
)
def test_ladder_settings_are_validated_when_the_brake_is_built(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        LoopBrake(3, **options)
    assert message in str(raised.value)


def test_a_bad_halt_at_from_the_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTBRAKE_HALT_AT", "2")
    with pytest.raises(ConfigurationError, match="environment variable DISTBRAKE_HALT_AT"):
        LoopBrake(3)
    monkeypatch.setenv("DISTBRAKE_HALT_AT", "6")
    assert LoopBrake(3).settings.rules_for("t").halt_at == 6  # type: ignore[union-attr]


def test_a_streak_reaching_halt_at_halts_the_session_for_every_tool() -> None:
    brake = LoopBrake(3, halt_at=5)
    seen = [outcome(brake, "search", {"q": "weather"}) for _ in range(6)]
    assert seen == ["ok", "ok", "repeat", "repeat", "halt", "halt"]
    with pytest.raises(LoopBrakeHalt) as raised:
        brake.check("another_tool", {"x": 1}, session_id="s")
    halt = raised.value
    assert (halt.kind, halt.halt_rule, halt.halted_by, halt.count, halt.limit) == ("halt", "repeat", "rule", 5, 5)
    assert halt.tool_name == "search" and halt.session_id == "s" and len(halt.hash_prefix) == 12
    assert halt.since is not None and abs(halt.since - time.time()) < 60
    assert "weather" not in str(halt) and "the run was stopped" in str(halt)
    again = pickle.loads(pickle.dumps(halt))
    assert type(again) is LoopBrakeHalt and str(again) == str(halt) and again.halt_rule == "repeat"
    assert outcome(brake, "search", {"q": "weather"}, session="other") == "ok"  # other sessions run on


def test_a_halt_lasts_its_ttl_from_the_halt_and_refused_checks_do_not_extend_it() -> None:
    clock = Clock()
    brake = LoopBrake(3, halt_at=4, ttl_seconds=100, clock=clock)
    assert [outcome(brake, "t", 1) for _ in range(4)] == ["ok", "ok", "repeat", "halt"]
    for _ in range(9):  # a model hammering the halted session for 99 s
        clock.now += 11
        assert outcome(brake, "t", 1) == "halt"
    clock.now += 2  # 101 s after the halt: the record expired, the session starts afresh
    assert outcome(brake, "t", 1) == "ok"


def test_shadow_mode_halts_nothing() -> None:
    brake = LoopBrake(3, halt_at=4, enforce=False)
    assert [outcome(brake, "t", 1) for _ in range(6)] == ["ok", "ok", "would_deny", "would_deny", "would_deny",
                                                          "would_deny"]
    assert outcome(brake, "u", 1) == "ok"


def test_a_cycle_repeated_cycle_halt_repeats_times_halts_the_session() -> None:
    brake = LoopBrake(5, max_cycle_period=2, cycle_repeats=2, cycle_halt_repeats=3)
    seen = [outcome(brake, tool, 1) for tool in "ABABABA"]
    assert seen == ["ok", "ok", "ok", "cycle", "cycle", "halt", "halt"]
    with pytest.raises(LoopBrakeHalt) as raised:
        brake.check("C", 1, session_id="s")
    assert (raised.value.halt_rule, raised.value.limit) == ("cycle", 3)


def test_a_once_only_tool_runs_an_identical_call_once_per_session_consecutive_or_not() -> None:
    brake = LoopBrake(3, tools={"send_email": {"once": True}})
    mail = {"to": "a@example.com", "body": "hi"}
    assert outcome(brake, "send_email", mail, call_id="c1") == "ok"
    assert outcome(brake, "send_email", mail, call_id="c1") == "ok"  # a replay of that very call: counted once
    assert outcome(brake, "search", {"q": 1}) == "ok"
    assert outcome(brake, "search", {"q": 2}) == "ok"
    with pytest.raises(LoopBrakeError) as raised:
        brake.check("send_email", mail, session_id="s", call_id="c2")
    assert raised.value.kind == "once" and raised.value.done_at is not None
    assert "already ran" in str(raised.value) and "a@example.com" not in str(raised.value)
    assert outcome(brake, "send_email", {**mail, "to": "b@example.com"}) == "ok"  # other arguments run
    assert outcome(brake, "send_email", mail, session="another") == "ok"  # other sessions run


def test_the_once_list_is_bounded_and_forgets_the_oldest() -> None:
    brake = LoopBrake(3, tools={"send": {"once": True}})
    for n in range(ONCE_ENTRIES + 1):
        assert outcome(brake, "send", n) == "ok"
    assert outcome(brake, "send", 0) == "ok"  # forgotten past the bound: stated in the README
    assert outcome(brake, "send", ONCE_ENTRIES) == "once"


def test_a_tool_that_failed_max_failures_times_in_a_row_is_refused_until_one_succeeds() -> None:
    brake = LoopBrake(3, tools={"flaky": {"max_failures": 2}})
    first = brake.check("flaky", {"n": 1}, session_id="s")
    brake.observe(first, RuntimeError("boom"))
    brake.observe(first, RuntimeError("boom"))  # the same call observed twice (two seams): one failure
    in_flight = brake.check("flaky", {"n": 2}, session_id="s")
    brake.observe(in_flight, {"isError": True}, failed=True)  # an MCP error result
    with pytest.raises(LoopBrakeError) as raised:
        brake.check("flaky", {"n": 3}, session_id="s")
    assert (raised.value.kind, raised.value.count, raised.value.limit) == ("failures", 2, 2)
    assert outcome(brake, "other", 1) == "ok"  # only that tool
    brake.observe(in_flight, "ok now")  # a call in flight succeeded: the failures in a row start again
    assert outcome(brake, "flaky", {"n": 4}) == "ok"


def test_a_global_max_failures_applies_to_every_tool() -> None:
    brake = LoopBrake(3, max_failures=1)
    brake.observe(brake.check("a", 1, session_id="s"), ValueError())
    assert [outcome(brake, "a", 2), outcome(brake, "b", 1)] == ["failures", "ok"]


def test_max_calls_caps_a_tools_calls_in_a_session_identical_or_not() -> None:
    brake = LoopBrake(3, tools={"web_search": {"max_calls": 3}})
    seen = [outcome(brake, "web_search", {"q": n}, call_id=f"c{n}") for n in range(3)]
    assert seen == ["ok", "ok", "ok"]
    assert outcome(brake, "web_search", {"q": 2}, call_id="c2") == "ok"  # a replay: still the 3rd call
    with pytest.raises(LoopBrakeError) as raised:
        brake.check("web_search", {"q": 9}, session_id="s")
    assert (raised.value.kind, raised.value.count, raised.value.limit) == ("cap", 4, 3)
    assert outcome(brake, "web_search", {"q": 10}) == "cap"
    assert outcome(brake, "other", 1) == "ok"


def test_rules_off_keep_no_ladder_state() -> None:
    brake = LoopBrake(3)
    for n in range(5):
        outcome(brake, "t", n % 2)
    record = brake._records["s"]
    assert (record.halt, record.once, record.failures, record.calls) == (None, None, None, None)
    assert set(Streak.__slots__) >= {"halt", "once", "failures", "calls"}


def test_the_hooks_streak_file_shares_the_ladder_between_processes(tmp_path: Any) -> None:
    path = tmp_path / "streaks.sqlite3"
    one = FileBrake(path, max_repeats=3, halt_at=4, tools={"send": {"once": True}})
    two = FileBrake(path, max_repeats=3, halt_at=4, tools={"send": {"once": True}})
    try:
        assert outcome(one, "send", 1, session="m") == "ok"
        assert outcome(two, "send", 1, session="m") == "once"
        assert [outcome(brake, "t", 1) for brake in (one, two, one, two)] == ["ok", "ok", "repeat", "halt"]
        assert outcome(one, "other", 1) == "halt"
        assert one.inspect("s").count == 4  # type: ignore[union-attr]
    finally:
        one.close()
        two.close()


def test_the_kill_switchs_refusal_says_how_it_is_lifted() -> None:
    brake = LoopBrake(3)
    brake.block_all(reason="incident 42", who="oncall")
    with pytest.raises(LoopBrakeHalt) as raised:
        brake.check("t", 1, session_id="s")
    assert raised.value.halt_rule == "kill" and raised.value.halted_by == "operator"
    assert "distbrake unblock --all" in str(raised.value) and "incident 42" in str(raised.value)
    brake.unblock_all()
    brake.block("s", reason="looping")
    with pytest.raises(LoopBrakeHalt) as blocked:
        brake.check("t", 1, session_id="s")
    assert blocked.value.halt_rule == "block" and "(distbrake unblock)" in str(blocked.value)


def test_unblocking_a_block_that_expired_lifts_nothing() -> None:
    clock = Clock()
    brake = LoopBrake(3, clock=clock)
    assert brake.block("s", ttl_seconds=10) == 1
    clock.now += 11  # the block's own TTL ended: as on Redis, there is nothing left to lift
    assert brake.unblock("s") == 0
    assert outcome(brake, "t", 1) == "ok"
