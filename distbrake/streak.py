"""The streak rule: a session's last call and count in, the new count out (no state, no I/O).

Per check of a session's streak record (last call hash, count):

* same hash as the record: count + 1; a different hash or no record: the
  record takes the new hash and count = 1;
* a call with the record's hash whose call id is the last or the previous one
  of this streak, at most the replay window (the brake's timeout) after the
  last check, is a replay (a retry, or one host call passing two seams):
  counted once, it gets the count (and so the verdict) it got the first time;
  the same call id later than that is a new call (hosts that number their
  calls afresh each turn reuse ids);
* the call is denied when count >= max_repeats; denied calls keep counting.

Cycles (opt-in, `max_cycle_period` >= 2): a session keeps a ring of its last
`max_cycle_period * cycle_repeats` counted calls' hash prefixes; a call is
denied when it completes `cycle_repeats` repetitions of one sequence of 2 to
`max_cycle_period` calls that are not all identical (A,B,A,B,A,B), the
shortest such period first. Denied calls enter the ring too, so a call that
continues the cycle is denied again; replays do not (counted once).

`inprocess.LoopBrake` applies it in this process; `lua/brake.lua` applies
the same rule inside Redis.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["advance", "cycle_period"]


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
