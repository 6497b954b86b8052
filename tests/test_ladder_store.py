"""The ladder in the session's record (issue 24, the Redis side): what the reference-model test's random
sequences rarely reach, on every brake kind, and what only a store shows (a second brake, the TTL, the record's
fields and bytes, an operator's block).

The rules themselves are judged against the reference model in `tests/test_rule_options.py`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from distbrake import DistributedBrake, LoopBrakeError, LoopBrakeHalt
from distbrake.model import Halt
from distbrake.redis import wire
from distbrake.redis.contract import FIELD_HALT, FIELD_ONCE, FIELD_STREAK, HALTED, ONCE_ENTRIES, ONCE_ENTRY
from tests.backends import ALL_BRAKES, Brakes, Checker, face, store, where
from tests.test_rule_options import LadderModel, ladder_answer

STORED_BRAKES = where(ALL_BRAKES, lambda kind: kind != "loop")
LADDER = {
    "max_repeats": 3, "halt_at": 5, "timeout_seconds": 10.0,
    "tools": {"mail": {"once": True}, "web": {"max_calls": 3}, "flaky": {"max_failures": 2},
              "ping": {"exempt": True}, "quiet": {"enforce": False, "once": True, "max_calls": 2},
              "poll": {"progress": True}},
}


@pytest.fixture(params=ALL_BRAKES)
def make(request: pytest.FixtureRequest, brakes: Brakes) -> Callable[..., Checker]:
    build = brakes.of(request.param)
    return lambda **options: Checker(build(**{**LADDER, **options}))


def raw(brakes: Brakes, kind: str) -> Any:
    """A sync client of `kind`'s store (the one its brakes use): to read and change records directly."""
    return brakes(f"sync-{store(kind)}", timeout_seconds=10.0).client  # a generous timeout: a busy machine


async def answer(brake: Checker, tool: str, args: Any, session: str, call_id: str | None = None) -> tuple[Any, ...]:
    """As `LadderModel.check` answers (outcome, rule, number[, halt kind, tool])."""
    return (await ladder_answer(brake, tool, args, session, call_id))[0]


async def test_replays_and_reused_call_ids_are_judged_on_the_facts_of_their_call(make: Callable[..., Checker]) -> None:
    """A replay of the previous call id at the cap gets the number it had; a once-only call's own replay runs,
    its call id reused after another call is a new call; a failure observed twice counts once."""
    brake = make()
    model = LadderModel(brake.brake.settings)
    calls = [
        ("web", {"q": 1}, "x1"), ("web", {"q": 2}, "x2"), ("web", {"q": 0}, "c1"), ("web", {"q": 0}, "c2"),
        ("web", {"q": 0}, "c1"),  # a replay of the previous call: number 3 (allowed), not 4 (its streak moved on)
        ("mail", {"to": 1}, "m1"), ("mail", {"to": 1}, "m1"),  # its own replay runs (counted once)
        ("web", {"q": 9}, "x3"), ("mail", {"to": 1}, "m1"),  # the same id after another call: a new call, refused
        ("quiet", {"q": 0}, None), ("quiet", {"q": 1}, None), ("quiet", {"q": 2}, None),  # shadow: would_deny, ran
        ("quiet", {"q": 2}, None),  # ran before: would_deny again (once), and it ran
    ]
    for tool, args, call_id in calls:
        assert await answer(brake, tool, args, "s", call_id) == model.check(tool, args, "s", call_id), (tool, call_id)
    for call_id, failed in (("f1", True), ("f1", True), ("f2", False), ("f3", True), ("f4", True)):
        verdict = await brake.check("flaky", {"n": call_id}, session_id="s", call_id=call_id)
        await brake._maybe(brake.brake.observe(verdict, RuntimeError("x") if failed else "ok"))
        await brake._maybe(brake.brake.observe(verdict, RuntimeError("x") if failed else "ok"))  # observed twice
    with pytest.raises(LoopBrakeError) as refused:
        await brake.check("flaky", {"n": 5}, session_id="s")
    assert (refused.value.kind, refused.value.count, refused.value.limit) == ("failures", 2, 2)


@pytest.mark.parametrize("kind", STORED_BRAKES)
async def test_a_halted_session_is_refused_by_another_brake_for_any_tool_without_counting(
    kind: str, brakes: Brakes,
) -> None:
    first, second = (Checker(brakes(kind, **LADDER)) for _ in range(2))
    answers = [await answer(first, "search", {"q": 1}, "s") for _ in range(5)]
    assert [a[:2] for a in answers] == [("allowed", "")] * 2 + [("denied", "repeat")] * 2 + [("denied", "halt")]
    client = raw(brakes, kind)
    key = first.brake.key("s")
    before = client.hgetall(key)
    assert before[FIELD_STREAK].endswith(b"5/3" + HALTED)
    client.pexpire(key, 50_000)  # well below the brake's ttl: a refresh would show
    for tool in ("search", "web", "mail", "other"):
        with pytest.raises(LoopBrakeHalt) as halted:
            await second.check(tool, {"q": 2}, session_id="s")
        assert (halted.value.halt_rule, halted.value.count, halted.value.limit, halted.value.tool_name) == (
            "repeat", 5, 5, "search")
    assert (await second.check("ping", {}, session_id="s")).exempt  # an exempt tool is not the session's
    assert client.hgetall(key) == before  # nothing counted or written
    assert 0 < client.pttl(key) <= 50_000  # the TTL not refreshed
    state = await second.inspect("s")
    assert state is not None and state.halted and state.count == 5 and state.halt is not None
    assert (state.halt.kind, state.halt.hash_prefix, state.halt.limit) == ("repeat", state.hash_prefix, 5)


@pytest.mark.parametrize("kind", STORED_BRAKES)
async def test_a_once_only_call_denied_at_its_limit_is_not_kept_as_done(kind: str, brakes: Brakes) -> None:
    """A once-only call refused by the streak rule did not run: another worker whose limit for the tool is higher
    runs it later (the script keeps a once-only call only when no rule refuses it; a first call's count, 1, reaches
    the limit only when that is 1)."""
    strict = Checker(brakes(kind, **{**LADDER, "tools": {"mail": {"once": True, "max_repeats": 1}}}))
    lenient = Checker(brakes(kind, **LADDER))  # mail once-only, max_repeats 3
    assert (await answer(strict, "mail", {"to": 1}, "s"))[:2] == ("denied", "repeat")
    assert (await answer(lenient, "mail", {"to": 2}, "s"))[:2] == ("allowed", "")
    assert (await answer(lenient, "mail", {"to": 1}, "s"))[:2] == ("allowed", "")  # it never ran: it runs now
    assert (await answer(lenient, "mail", {"to": 2}, "s"))[:2] == ("denied", "once")


@pytest.mark.parametrize("clock", [0.5, -1.5, float(2**32) + 0.5])
async def test_a_once_only_call_is_refused_whatever_the_workers_clock_reads(
    make: Callable[..., Checker], clock: float, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A once-only call's time is the worker's clock in 4 bytes, where 0 means that none ran: a clock at the epoch
    (or wrapped in 2106) must not turn the rule off, nor a clock before it break the check (its time kept as 1)."""
    brake = make()
    monkeypatch.setattr(time, "time", lambda: clock)
    assert (await answer(brake, "mail", {"to": 1}, "s"))[:2] == ("allowed", "")
    assert (await answer(brake, "mail", {"to": 2}, "s"))[:2] == ("allowed", "")
    assert (await answer(brake, "mail", {"to": 1}, "s"))[:2] == ("denied", "once")
    assert wire.now_argument()[0] == ((int(clock) & 0xFFFFFFFF) or 1).to_bytes(4, "big")


@pytest.mark.parametrize("kind", where(STORED_BRAKES, lambda kind: face(kind) == "async"))
async def test_a_burst_on_a_halted_session_is_refused_whole(kind: str, brakes: Brakes) -> None:
    """Concurrent identical checks go as one run (see the batcher): a halted session refuses every one."""
    brake = Checker(brakes(kind, **LADDER))
    for _ in range(5):
        await answer(brake, "search", {"q": 1}, "s")
    got = await asyncio.gather(*(brake.check("search", {"q": 1}, session_id="s") for _ in range(6)),
                               return_exceptions=True)
    assert all(isinstance(error, LoopBrakeHalt) and error.count == 5 for error in got), got


@pytest.mark.parametrize("kind", STORED_BRAKES)
async def test_an_operator_blocks_and_unblocks_one_session(kind: str, brakes: Brakes) -> None:
    brake = Checker(brakes(kind, **LADDER))
    client = raw(brakes, kind)
    halt = Halt("block", 1_800_000_000.5, who="ops@example\0", reason="runaway \0spend")
    fresh, busy = brake.brake.key("fresh"), brake.brake.key("busy")
    await brake.check("search", {"q": 1}, session_id="busy")
    await brake.check("search", {"q": 1}, session_id="busy")
    await brake._maybe(brake.brake.block_key(fresh, halt, 60_000, "fresh"))  # no record yet
    await brake._maybe(brake.brake.block_key(busy, halt, 3_600_000))
    for session in ("fresh", "busy"):
        with pytest.raises(LoopBrakeHalt) as blocked:
            await brake.check("anything", {}, session_id=session)
        error = blocked.value
        assert (error.halt_rule, error.halted_by, error.who, error.reason, error.since) == (
            "block", "operator", "ops@example", "runaway spend", 1_800_000_000.5)
    assert client.hget(fresh, FIELD_STREAK) == b"\0" * 16 + b"\0" * 10 + (60_000).to_bytes(5, "big") + b"0!"
    assert 0 < client.pttl(fresh) <= 60_000 < client.pttl(busy) <= 3_600_000  # the block's ttl, not the record's
    states = {state.session_id: state for state in await brake.sessions()}
    assert states["fresh"].halted and states["fresh"].count == 0
    assert states["busy"].halted and states["busy"].count == 2 and states["busy"].halt == halt._replace(
        who="ops@example", reason="runaway spend")
    assert await brake._maybe(brake.brake.unblock_key(busy)) is True
    assert await brake._maybe(brake.brake.unblock_key(busy)) is False  # no record: nothing to lift
    assert (await brake.check("search", {"q": 1}, session_id="busy")).count == 1  # a fresh start
    assert await brake._maybe(brake.brake.unblock_key(busy)) is False  # not halted: left alone
    assert (await brake.check("search", {"q": 1}, session_id="busy")).count == 2


@pytest.mark.parametrize("kind", STORED_BRAKES)
async def test_observations_are_ignored_without_a_record_or_when_halted(kind: str, brakes: Brakes) -> None:
    brake = Checker(brakes(kind, **LADDER))
    client = raw(brakes, kind)
    verdict = await brake.check("flaky", {"n": 1}, session_id="s")
    await brake.clear("s")
    await brake._maybe(brake.brake.observe(verdict, RuntimeError("x")))
    assert client.exists(brake.brake.key("s")) == 0
    verdict = await brake.check("flaky", {"n": 1}, session_id="s")
    await brake._maybe(brake.brake.block_key(brake.brake.key("s"), Halt("block", 1.0), 60_000))
    await brake._maybe(brake.brake.observe(verdict, RuntimeError("x")))
    polled = await brake.check("poll", {}, session_id="p")  # a progress-aware tool's result, halted
    await brake._maybe(brake.brake.block_key(brake.brake.key("p"), Halt("block", 1.0), 60_000))
    await brake._maybe(brake.brake.observe(polled, {"status": "done"}))
    assert not any(field.startswith(b"f") for field in client.hgetall(brake.brake.key("s")))
    assert b"r" not in client.hgetall(brake.brake.key("p"))


@pytest.mark.parametrize("kind", ["sync-redis", "sync-memory"])
async def test_the_records_bytes_with_each_rule(kind: str, brakes: Brakes) -> None:
    """Rules off, the record is h (what the streak was judged by after its count) and s; each rule adds only its
    own field, only when used."""
    brake = Checker(brakes(kind, **LADDER))
    client = raw(brakes, kind)

    def fields(session: str) -> dict[bytes, int]:
        return {field: len(value) for field, value in client.hgetall(brake.brake.key(session)).items()}

    plain = Checker(brakes(kind, max_repeats=3))
    await plain.check("search", {"q": 1}, session_id="off")
    await brake.check("search", {"q": 1}, session_id="on!")  # halt_at on, not reached
    assert fields("off") == fields("on!") == {b"h": 34, b"s": 10}  # h: 31 bytes, "1/3"
    for n in range(ONCE_ENTRIES + 2):
        await brake.check("mail", {"to": n}, session_id="once")
    assert fields("once")[FIELD_ONCE] == ONCE_ENTRIES * ONCE_ENTRY  # the oldest are dropped
    for q in range(3):  # shadow mode: each call ran, the third would be denied (cap) and is remembered too
        await brake.check("quiet", {"q": q}, session_id="shadow")
    assert fields("shadow")[FIELD_ONCE] == 3 * ONCE_ENTRY
    await brake.check("web", {"q": 1}, session_id="cap")
    assert fields("cap")[b"nweb"] == 1
    verdict = await brake.check("flaky", {"n": 1}, session_id="failing")
    await brake._maybe(brake.brake.observe(verdict, RuntimeError("x")))
    assert fields("failing")[b"fflaky"] == 6
    await brake._maybe(brake.brake.observe(verdict, "ok"))  # a success: the field is emptied
    assert fields("failing")[b"fflaky"] == 0
    for _ in range(5):
        await answer(brake, "search", {"q": 1}, "halted")
    assert fields("halted")[FIELD_STREAK] == 35 and 30 < fields("halted")[FIELD_HALT] < 60


async def test_a_cycle_repeated_cycle_halt_repeats_times_halts_the_session(make: Callable[..., Checker]) -> None:
    brake = make(max_cycle_period=2, cycle_repeats=2, cycle_halt_repeats=3, halt_at=None)
    got = [await answer(brake, tool, {}, "s") for tool in ("a", "b") * 3]
    assert [g[1] for g in got] == ["", "", "", "cycle2", "cycle2", "halt"]
    assert got[-1][3:] == ("cycle", "b")
    assert (await answer(brake, "c", {}, "s"))[1:] == ("halt", 1, "cycle", "b")  # the halting call's count


@pytest.mark.parametrize("kind", ["sync-memory", "sync-redis"])
def test_a_shadow_halt_writes_no_marker(kind: str, brakes: Brakes) -> None:
    brake = brakes(kind, **{**LADDER, "enforce": False})
    assert isinstance(brake, DistributedBrake)
    verdicts = [brake.check("search", {"q": 1}, session_id="s") for _ in range(7)]
    assert [v.would_deny for v in verdicts] == [False, False, True, True, True, True, True]
    assert not brake.client.hget(brake.key("s"), FIELD_STREAK).endswith(HALTED)


def test_the_fallback_observes_failures_in_its_own_streaks() -> None:
    """Redis down (policy `local`): the fallback's LoopBrake counts the failures the brake observes."""
    import socket

    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # closed when the block ends: nothing listens there
    with DistributedBrake.from_url(f"redis://127.0.0.1:{port}", **LADDER) as brake:  # type: ignore[arg-type]
        for n in range(2):
            verdict = brake.check("flaky", {"n": n}, session_id="s")
            assert verdict.decided_by == "fallback"
            brake.observe(verdict, None, failed=True)
        with pytest.raises(LoopBrakeError) as refused:
            brake.check("flaky", {"n": 9}, session_id="s")
    assert (refused.value.kind, refused.value.count, refused.value.decided_by) == ("failures", 2, "fallback")
