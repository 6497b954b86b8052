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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = [
    "Cycle",
    "CycleRule",
    "Judgement",
    "Rules",
    "Streak",
    "advance",
    "cycle_period",
    "judge",
    "observe",
    "step",
]


class Rules(NamedTuple):
    """What the checks of one tool are judged by (`BrakeSettings.rules_for`)."""

    max_repeats: int
    warn_at: int | None = None
    enforce: bool = True
    ignore_fields: tuple[tuple[str, ...], ...] = ()
    progress: bool = False


class CycleRule(NamedTuple):
    """The cycle rule of a brake (`max_cycle_period`, `cycle_repeats`); a brake without it has None."""

    max_period: int
    repeats: int

    @property
    def ring_size(self) -> int:
        """How many counted calls a session's ring keeps."""
        return self.max_period * self.repeats


class Cycle(NamedTuple):
    """A cycle the call completes (opt-in rule): its period, repetitions, and its calls' hash prefixes and tools."""

    period: int
    repeats: int
    hash_prefixes: tuple[str, ...]  # of the cycle's calls, in order, ending with this call's
    tools: tuple[str, ...]  # the tool of each of those calls


Outcome = Literal["allowed", "warned", "denied", "would_deny"]
Rule = Literal["repeat", "cycle"]


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
DENIED = {"repeat": Judgement("denied", "repeat"), "cycle": Judgement("denied", "cycle")}
WOULD_DENY = {"repeat": Judgement("would_deny", "repeat"), "cycle": Judgement("would_deny", "cycle")}


def judge(count: int, rules: Rules, cycle: bool = False) -> Judgement:
    """The judgement of a call counted `count` (that completes a cycle when `cycle`), by `rules`.

    The streak rule comes first: a call at its limit is denied as a repeat
    even when it also completes a cycle.
    """
    if count >= rules.max_repeats or cycle:
        rule: Rule = "repeat" if count >= rules.max_repeats else "cycle"
        return DENIED[rule] if rules.enforce else WOULD_DENY[rule]
    if rules.warn_at is not None and count >= rules.warn_at and rules.enforce:
        return WARNED
    return ALLOWED


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
    if replayed:  # the same answer as the first time: the last call's, or the previous one's
        last = count == streak.count
        period, end = (streak.cycles[0], len(ring)) if last else (streak.cycles[1], len(ring) - 1)
    else:
        ring.append((prefix, tool_name))
        del ring[:-rule.ring_size]
        streak.ring = ring
        period = cycle_period([entry[0] for entry in ring], rule.max_period, rule.repeats)
        streak.cycles, end = (period, streak.cycles[0]), len(ring)
    if not period or end < period:
        return None
    members = ring[end - period:end]
    return Cycle(period, rule.repeats, tuple(entry[0] for entry in members), tuple(entry[1] for entry in members))


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
