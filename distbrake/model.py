"""The rule model: the one Python statement of every rule a check is judged by (pure: no I/O, clock or lock).

Its twin is `lua/brake.lua`, the one Redis statement of the same rules: a
change to a rule is a change here and there (and to the wire contract in
`redis/wire.py` when the record changes). The in-process brake (`inprocess.py`)
applies `step` and `observe` to its records under a lock; every brake's verdict
and error come from `judge` (`core.BrakeCore.judge`); `check --dry-run`,
`inspect` and `list` judge a stored record with `judge` too.

The streak. Per check of a session's record (last call hash, count):

* same hash as the record: count + 1; a different hash or no record: the
  record takes the new hash and count = 1;
* a call with the record's hash whose call id is the last or the previous one
  of this streak, at most the replay window (the brake's timeout) after the
  last check, is a replay (a retry, or one host call passing two seams):
  counted once, it gets the count (and so the verdict) it got the first time;
  the same call id later than that is a new call (hosts that number their
  calls afresh each turn reuse ids);
* the call is denied when count >= max_repeats; denied calls keep counting.

The judgement of a count (`judge`), first match wins:

* count >= max_repeats: denied by the streak rule (`repeat`);
* the call completes a cycle: denied by the cycle rule (`cycle`);
* warn_at is set and count >= warn_at: allowed with a warning;
* else allowed.
A denial in shadow mode (enforce=False) is `would_deny`: the call runs; no
warning is given in shadow mode.

The ladder (opt-in, per tool or global; `Rules.ladder`), judged in this order
before the streak rule's warning, first match wins (`judge`):

* `halt_at`: a streak reaching it halts the session (rule `halt`): this
  call and every later check of the session, any tool, on any worker, are
  refused until the record expires or an operator lifts it; a cycle repeated
  `cycle_halt_repeats` times halts too. A halted session's checks count
  nothing, write nothing, and do not extend the record's TTL (`Halt`);
* then `repeat` and `cycle` as above;
* `once`: a call of a once-only tool whose call hash the session already ran
  (by another call id) is refused (`once`); the session keeps the hash
  prefixes of its once-only calls that ran, at most ONCE_ENTRIES, the oldest
  forgotten past it;
* `max_failures`: the tool failed that many times in a row in the session
  (`failures`; a success resets it, `fail`);
* `max_calls`: the call's number among the tool's calls in the session is
  above it (`cap`; every counted call of the tool counts, refused or not).
In shadow mode none of them is enforced (would_deny) and nothing is halted.
A replay is judged again on the same facts (`Facts`): the count it got, its
call id as the once-only call that ran, its number among the tool's calls.

Progress-aware tools (`progress`): identical calls form a streak only while
their results are identical too. After the body returns, the result's digest
is observed (`observe`); a result that differs from the previous identical
call's restarts the streak at 1. A new streak has no result of its own yet.

Cycles (opt-in, `CycleRule`): a session keeps a ring of its last
`max_period * repeats` counted calls' hash prefixes; a call is denied when it
completes `repeats` repetitions of one sequence of 2 to `max_period` calls
that are not all identical (A,B,A,B,A,B), the shortest such period first.
Denied calls enter the ring too, so a call that continues the cycle is denied
again; replays do not (counted once) and get the answer their call got.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = [
    "NO_FACTS",
    "ONCE_ENTRIES",
    "REASON_CHARS",
    "WHO_CHARS",
    "Counted",
    "Cycle",
    "CycleRule",
    "Facts",
    "Halt",
    "Judgement",
    "Rules",
    "Streak",
    "advance",
    "check",
    "cycle_period",
    "fail",
    "judge",
    "new_counted",
    "observe",
    "once_second",
    "operator_text",
    "step",
]

ONCE_ENTRIES = 64  # once-only calls a session remembers (hash prefixes); the oldest is forgotten past it
WHO_CHARS = 64  # an operator's name kept in a halt (`Halt.who`), at most
REASON_CHARS = 200  # an operator's reason kept in a halt (`Halt.reason`), at most


def operator_text(text: str, limit: int) -> str:
    """An operator's who or reason as a halt keeps it: no NUL (the record's separator), at most `limit` characters."""
    return text.replace("\0", "")[:limit]


class Rules(NamedTuple):
    """What the checks of one tool are judged by (`BrakeSettings.rules_for`)."""

    max_repeats: int
    warn_at: int | None = None
    enforce: bool = True
    ignore_fields: tuple[tuple[str, ...], ...] = ()
    progress: bool = False
    halt_at: int | None = None  # a streak reaching it halts the session
    once: bool = False  # an identical call that already ran in the session is refused
    max_failures: int | None = None  # refused after this many failed calls of the tool in a row
    max_calls: int | None = None  # the tool's calls in a session beyond this are refused

    @property
    def ladder(self) -> bool:
        """A rule of the ladder is on (halt_at, once, max_failures, max_calls)."""
        return self.halt_at is not None or self.once or self.max_failures is not None or self.max_calls is not None


class CycleRule(NamedTuple):
    """The cycle rule of a brake (`max_cycle_period`, `cycle_repeats`); a brake without it has None."""

    max_period: int
    repeats: int
    halt_repeats: int | None = None  # a cycle repeated this many times halts the session

    @property
    def ring_size(self) -> int:
        """How many counted calls a session's ring keeps."""
        return self.max_period * max(self.repeats, self.halt_repeats or 0)


class Cycle(NamedTuple):
    """A cycle the call completes (opt-in rule): its period, repetitions, and its calls' hash prefixes and tools."""

    period: int
    repeats: int
    hash_prefixes: tuple[str, ...]  # of the cycle's calls, in order, ending with this call's
    tools: tuple[str, ...]  # the tool of each of those calls
    halts: bool = False  # the cycle is repeated the halt_repeats times that halt the session


class Facts(NamedTuple):
    """What a session's record says of a counted call beyond its count: what the ladder's rules judge."""

    once_since: int = 0  # once-only tools: Unix seconds when another call with this hash ran; 0: none did
    failures: int = 0  # the tool's failed calls in a row in the session
    calls: int = 0  # this call's number among the tool's calls in the session (counted when max_calls is set)


NO_FACTS = Facts()

HaltKind = Literal["repeat", "cycle", "block", "kill"]


class Halt(NamedTuple):
    """Why a session is halted: by its streak (`repeat`, halt_at), its cycle, or an operator (`block`)."""

    kind: HaltKind
    since: float  # Unix time the halt began
    tool_name: str = ""  # the call that halted it (a rule's halt)
    count: int = 0  # type: ignore[assignment]  # the field shadows tuple.count on purpose
    limit: int = 0  # halt_at, or cycle_halt_repeats
    hash_prefix: str = ""
    who: str = ""  # an operator's block: who, and why
    reason: str = ""


new_counted = tuple.__new__  # a Counted of the common case, built without NamedTuple's keyword handling


class Counted(NamedTuple):
    """One check's step in a record: its count, whether a replay, the cycle it completes, the ladder's facts;
    or, when the session is halted, the halt (nothing was counted)."""

    count: int  # type: ignore[assignment]  # the field shadows tuple.count on purpose
    replayed: bool = False
    cycle: Cycle | None = None
    facts: Facts = NO_FACTS
    halt: Halt | None = None


Outcome = Literal["allowed", "warned", "denied", "would_deny"]
Rule = Literal["halt", "repeat", "cycle", "once", "failures", "cap"]


class Judgement(NamedTuple):
    """What the rules say of a counted call: its outcome, and which rule denied it (None: none did)."""

    outcome: Outcome
    rule: Rule | None = None

    @property
    def denies(self) -> bool:
        """The rules would deny the call (enforced or not)."""
        return self.rule is not None


ALLOWED = Judgement("allowed")
WARNED = Judgement("warned")
RULES: tuple[Rule, ...] = ("halt", "repeat", "cycle", "once", "failures", "cap")
DENIED = {rule: Judgement("denied", rule) for rule in RULES}
WOULD_DENY = {rule: Judgement("would_deny", rule) for rule in RULES}


def judge(
    count: int, rules: Rules, cycle: bool = False, facts: Facts = NO_FACTS, cycle_halts: bool = False
) -> Judgement:
    """The judgement of a call counted `count` (that completes a cycle when `cycle`, one that halts when
    `cycle_halts`), with the ladder's `facts`, by `rules` (the order is the module's doc's).

    The streak rule comes before the cycle rule: a call at its limit is denied
    as a repeat even when it also completes a cycle.
    """
    rule: Rule | None = None
    # the ladder's rules refuse only with facts (once, failures, caps), a halt_at or a halting cycle
    if facts is not NO_FACTS or cycle_halts or rules.halt_at is not None:
        rule = _ladder_rule(count, rules, cycle, facts, cycle_halts)
    elif count >= rules.max_repeats or cycle:
        rule = "repeat" if count >= rules.max_repeats else "cycle"
    if rule is not None:
        return DENIED[rule] if rules.enforce else WOULD_DENY[rule]
    if rules.warn_at is not None and count >= rules.warn_at and rules.enforce:
        return WARNED
    return ALLOWED


def _ladder_rule(count: int, rules: Rules, cycle: bool, facts: Facts, cycle_halts: bool) -> Rule | None:
    if cycle_halts or (rules.halt_at is not None and count >= rules.halt_at):
        return "halt"
    if count >= rules.max_repeats:
        return "repeat"
    if cycle:
        return "cycle"
    if rules.once and facts.once_since:
        return "once"
    if rules.max_failures is not None and facts.failures >= rules.max_failures:
        return "failures"
    if rules.max_calls is not None and facts.calls > rules.max_calls:
        return "cap"
    return None


def advance(
    last_digest: str | None, last_count: int, last_id: str | None, previous_id: str | None,
    digest: str, call_id: str | None, fresh: bool = True,
) -> tuple[int, bool]:
    """The streak rule: the new count, and whether the call is a replay (not counted).

    `fresh`: the last check was within the replay window (only then can a call id repeat).
    """
    if last_digest != digest:
        return 1, False
    if call_id is not None and fresh:
        if call_id == last_id:
            return last_count, True
        if last_count > 1 and call_id == previous_id:
            return last_count - 1, True
    return last_count + 1, False


def cycle_period(ring: Sequence[object], max_period: int, repeats: int) -> int:
    """The shortest period p in 2..max_period whose `repeats` repetitions end `ring`, else 0.

    A window of p * repeats entries is p-periodic when it equals itself
    shifted by p; its first p entries must not all be one call (that is a
    repeat, the streak rule's case).
    """
    for period in range(2, max_period + 1):
        size = period * repeats
        if len(ring) < size:
            break
        window = ring[len(ring) - size:]
        if window[period:] == window[:-period] and any(entry != window[0] for entry in window[1:period]):
            return period
    return 0


@dataclass(slots=True)
class Streak:
    """A session's record as the rules read and write it (`step`, `observe`); empty: no record yet."""

    digest: str = ""  # the call hash of the streak's call
    count: int = 0
    call_id: str | None = None  # of the last counted call
    previous_id: str | None = None  # of the call before it, in this streak
    tool_name: str = ""
    result: bytes | None = None  # progress-aware tools: the digest of this streak's last observed result
    # Cycles on: the session's last counted calls (hash prefix, tool), oldest first, and the period
    # of the cycle the last and the previous call completed (0: none), for their replays.
    ring: list[tuple[str, str]] | None = None
    cycles: tuple[int, int] = (0, 0)
    halt: Halt | None = None  # the session is halted (rule or operator): every check is refused
    # The ladder's state, only for tools whose rules use it: once-only calls that ran (hash prefix, call id,
    # Unix seconds), oldest first; each tool's failed calls in a row (and the call id of the last one);
    # each tool's calls in the session.
    once: list[tuple[str, str | None, int]] | None = None
    failures: dict[str, tuple[int, str | None]] | None = None
    calls: dict[str, int] | None = None


def step(
    streak: Streak, digest: str, call_id: str | None, tool_name: str, fresh: bool, cycles: CycleRule | None = None,
) -> tuple[int, bool, Cycle | None]:
    """Count one call in `streak` (changed in place): (count, replayed, the cycle it completes).

    `fresh`: the streak's last check was within the replay window.
    """
    count, replayed = advance(
        streak.digest, streak.count, streak.call_id, streak.previous_id, digest, call_id, fresh
    )
    if not replayed:
        streak.previous_id = streak.call_id if count > 1 else None
        if count == 1:
            streak.result = None  # a new streak: no result of its own yet
        streak.digest, streak.count, streak.call_id, streak.tool_name = digest, count, call_id, tool_name
    if cycles is None:
        return count, replayed, None
    return count, replayed, _ring_step(streak, digest[:12], tool_name, count, replayed, cycles)


def _ring_step(
    streak: Streak, prefix: str, tool_name: str, count: int, replayed: bool, rule: CycleRule
) -> Cycle | None:
    """The ring step of the cycle rule: the cycle this call completes, if any."""
    ring = streak.ring if streak.ring is not None else []
    halts = False
    if replayed:  # the same answer as the first time: the last call's, or the previous one's
        last = count == streak.count
        period, end = (streak.cycles[0], len(ring)) if last else (streak.cycles[1], len(ring) - 1)
    else:
        ring.append((prefix, tool_name))
        del ring[:-rule.ring_size]
        streak.ring = ring
        prefixes = [entry[0] for entry in ring]
        period = cycle_period(prefixes, rule.max_period, rule.repeats)
        streak.cycles, end = (period, streak.cycles[0]), len(ring)
        # a cycle repeated halt_repeats times halts the session (a replay never halts: the session would be)
        halts = bool(period and rule.halt_repeats and cycle_period(prefixes, rule.max_period, rule.halt_repeats))
    if not period or end < period:
        return None
    members = ring[end - period:end]
    return Cycle(
        period, rule.repeats, tuple(entry[0] for entry in members), tuple(entry[1] for entry in members),
        not replayed and halts,
    )


def check(
    streak: Streak, digest: str, call_id: str | None, tool_name: str, fresh: bool, rules: Rules,
    cycles: CycleRule | None = None, now: Callable[[], float] = lambda: 0.0,
) -> Counted:
    """One check in `streak` (changed in place): the streak step, then the ladder's facts and its effects
    (the once-only call that ran, the halt), all judged by `judge` as the verdict will be.

    A halted session counts nothing: its `Counted` has the halt. `now()`: Unix time (a halt's or a once-only
    call's time), asked only when one is written.
    """
    if streak.halt is not None:
        return Counted(0, halt=streak.halt)
    count, replayed, cycle = step(streak, digest, call_id, tool_name, fresh, cycles)
    cycle_halts = cycle is not None and cycle.halts
    if not cycle_halts and not rules.ladder:
        return new_counted(Counted, (count, replayed, cycle, NO_FACTS, None))
    facts = _facts(streak, digest, call_id, tool_name, count, replayed, rules)
    judgement = judge(count, rules, cycle is not None, facts, cycle_halts)
    if not replayed and judgement.outcome == "denied" and judgement.rule == "halt":
        by_count = rules.halt_at is not None and count >= rules.halt_at
        if by_count or cycles is None:
            streak.halt = Halt("repeat", now(), tool_name, count, rules.halt_at or 0, digest[:12])
        else:
            streak.halt = Halt("cycle", now(), tool_name, count, cycles.halt_repeats or 0, digest[:12])
    elif rules.once and not replayed and judgement.outcome != "denied" and not facts.once_since:
        once = streak.once if streak.once is not None else []
        once.append((digest[:ONCE_PREFIX], call_id, once_second(now())))
        del once[:-ONCE_ENTRIES]
        streak.once = once
    return Counted(count, replayed, cycle, facts)


ONCE_PREFIX = 16  # hex characters of the call hash a once-only call is remembered by (8 bytes)


def once_second(now: float) -> int:
    """A once-only call's time as it is kept: Unix seconds in 4 bytes, never 0, which means that none ran (a clock
    at the epoch, or wrapped in 2106, would turn the rule off)."""
    return (int(now) & 0xFFFFFFFF) or 1


def _facts(
    streak: Streak, digest: str, call_id: str | None, tool_name: str, count: int, replayed: bool, rules: Rules
) -> Facts:
    """The ladder's facts of a call just stepped (and its effect on the tool's call count)."""
    once_since = 0
    if rules.once and streak.once:
        prefix = digest[:ONCE_PREFIX]
        ran = next((entry for entry in streak.once if entry[0] == prefix), None)
        if ran is not None and not (replayed and ran[1] == call_id):
            once_since = ran[2]
    failures = 0
    if rules.max_failures is not None and streak.failures:
        failures = streak.failures.get(tool_name, (0, None))[0]
    number = 0
    if rules.max_calls is not None:
        calls = streak.calls if streak.calls is not None else {}
        if replayed:  # its number then: the tool's calls less those counted since (the last call, or none)
            number = calls.get(tool_name, 0) - (streak.count - count)
        else:
            number = calls[tool_name] = calls.get(tool_name, 0) + 1
            streak.calls = calls
    return Facts(once_since, failures, number)


def fail(streak: Streak, tool_name: str, call_id: str | None, failed: bool) -> None:
    """Record whether a call of `tool_name` failed (max_failures): a failure adds one to the tool's failures
    in a row (the same call id observed twice counts once), a success resets them. Ignored when halted."""
    if streak.halt is not None:
        return
    failures = streak.failures if streak.failures is not None else {}
    if failed:
        number, last = failures.get(tool_name, (0, None))
        if call_id is None or last != call_id:
            failures[tool_name] = (number + 1, call_id)
            streak.failures = failures
    elif failures.pop(tool_name, None) is not None and not failures:
        streak.failures = None


def observe(streak: Streak, digest: str, call_id: str | None, result: bytes) -> int:
    """Record the result digest of a progress-aware call: 2 the streak restarted, 1 recorded, 0 ignored.

    Ignored when the streak has moved on (another call came since). A result
    that differs from the previous identical call's restarts the streak: its
    count becomes 1, so the next identical call is checked as 2.
    """
    if streak.digest != digest or streak.call_id != call_id:
        return 0
    restarted = streak.result is not None and streak.result != result
    if restarted:
        streak.count, streak.previous_id = 1, None
    streak.result = result
    return 2 if restarted else 1
