"""`LoopBrake`, the in-process brake: one streak record per session, in this process.

It applies the rule of `streak.py` under a lock, forgets idle sessions after
the TTL, and offers the same operations as the Redis brakes (inspect, clear,
sessions). The `local` failure policy uses one as its fallback.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Unpack

from .core import Cycle, PreparedCall, SessionState, SyncCheck, Verdict
from .rules import result_digest
from .settings import BrakeOptions, BrakeSettings, load_settings
from .streak import advance, cycle_period
from .telemetry.build import build_observers
from .telemetry.health import Healthy
from .telemetry.options import take_observe_options
from .wrap import GuardMixin

__all__ = ["LoopBrake"]


@dataclass(slots=True)
class _Record:
    digest: str
    count: int
    call_id: str | None  # of the last counted call
    previous_id: str | None  # of the call before it, in this streak
    tool_name: str
    expires_at: float  # on the brake's clock (monotonic); last update = expires_at - ttl
    result: bytes | None = None  # progress-aware tools: the digest of this streak's last observed result
    judged_by: tuple[int, int | None, bool] = (0, None, True)  # the last check's limit, warn_at, enforce
    # Cycles on: the session's last counted calls (hash prefix, tool), oldest first, and the period
    # of the cycle the last and the previous call completed (0: none), for their replays.
    ring: list[tuple[str, str]] | None = None
    cycles: tuple[int, int] = (0, 0)


class LoopBrake(Healthy, GuardMixin, SyncCheck):
    """The in-process brake: one record per session in this process, locked, TTL-bounded."""

    def __init__(
        self,
        max_repeats: int | float | str | None = None,
        /,
        *,
        settings: BrakeSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        **options: Unpack[BrakeOptions],
    ) -> None:
        if max_repeats is not None:
            options["max_repeats"] = max_repeats
        observe = take_observe_options(options)  # type: ignore[arg-type]
        super().__init__(load_settings(settings, **options))
        observers = build_observers(
            observe, decided_by="in-process", policy=self.settings.on_backend_error, backend="in-process",
            asynchronous=False,
        )
        self.watch, self.health_watch = observers.watch, observers.health
        self._clock = clock
        self._lock = threading.Lock()
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._ttl = self.settings.ttl_seconds
        self._window = self.settings.timeout_seconds  # the replay window, as in lua/brake.lua
        self._cycle_rule = (self.settings.max_cycle_period, self.settings.cycle_repeats)
        self._cycle_size = self.settings.max_cycle_period * self.settings.cycle_repeats  # 0: cycles off

    def __repr__(self) -> str:
        return f"LoopBrake(max_repeats={self.max_repeats}, sessions={len(self._records)})"

    def record(self, call: PreparedCall) -> tuple[int, bool, Cycle | None]:
        """Apply the rules to `call`'s session record; returns (count, replayed, the cycle it completes)."""
        now = self._clock()
        records = self._records
        session = call.session_id
        with self._lock:
            if records and next(iter(records.values())).expires_at <= now:
                self._expire(now)
            record = records.get(session)
            if record is None:
                count, replayed = 1, False
                record = records[session] = _Record(
                    call.digest, 1, call.call_id, None, call.tool_name, now + self._ttl,
                    judged_by=(call.max_repeats, call.warn_at, call.enforce),
                )
            else:
                fresh = now - (record.expires_at - self._ttl) <= self._window
                count, replayed = advance(
                    record.digest, record.count, record.call_id, record.previous_id,
                    call.digest, call.call_id, fresh,
                )
                if not replayed:
                    record.previous_id = record.call_id if count > 1 else None
                    if count == 1:
                        record.result = None  # a new streak: no result of its own yet
                    record.digest, record.count, record.call_id = call.digest, count, call.call_id
                    record.tool_name = call.tool_name
                record.expires_at = now + self._ttl
                record.judged_by = (call.max_repeats, call.warn_at, call.enforce)
                records.move_to_end(session)
            cycle = self._cycle(record, call, count, replayed) if self._cycle_size else None
        return count, replayed, cycle

    def _cycle(self, record: _Record, call: PreparedCall, count: int, replayed: bool) -> Cycle | None:
        """The ring step of the cycle rule (under the lock): the cycle this call completes, if any."""
        ring = record.ring if record.ring is not None else []
        if replayed:  # the same answer as the first time: the last call's, or the previous one's
            last = count == record.count
            period, end = (record.cycles[0], len(ring)) if last else (record.cycles[1], len(ring) - 1)
        else:
            ring.append((call.digest[:12], call.tool_name))
            del ring[:-self._cycle_size]
            record.ring = ring
            period = cycle_period([entry[0] for entry in ring], *self._cycle_rule)
            record.cycles, end = (period, record.cycles[0]), len(ring)
        if not period or end < period:
            return None
        members = ring[end - period:end]
        return Cycle(
            period, self._cycle_rule[1], tuple(entry[0] for entry in members), tuple(entry[1] for entry in members)
        )

    def _expire(self, now: float) -> None:
        records = self._records
        while records:
            first = next(iter(records.values()))
            if first.expires_at > now:
                break
            records.popitem(last=False)

    def observe_digest(self, call: PreparedCall, digest: bytes) -> None:
        """Record the result of `call` (a progress-aware tool): a changed result restarts the streak at 1.

        Ignored when the session's streak has moved on (another call came since).
        """
        with self._lock:
            record = self._records.get(call.session_id)
            if record is None or record.digest != call.digest or record.call_id != call.call_id:
                return
            if record.result is not None and record.result != digest:
                record.count, record.previous_id = 1, None
            record.result = digest

    def observe(self, verdict: Verdict, result: object) -> None:
        """After the tool ran: its result (or raised exception), for a progress-aware tool's streak."""
        call = verdict.observe_token
        if isinstance(call, PreparedCall):
            self.observe_digest(call, result_digest(result))

    def decide(self, call: PreparedCall) -> Verdict:
        """Count `call` in this process and judge it."""
        count, replayed, cycle = self.record(call)
        return self.judge(call, count, replayed, "in-process", cycle)

    # -- operations (the same names as the distributed brakes) --------------------

    def _state(self, session_id: str, record: _Record, now: float) -> SessionState:
        left = max(0.0, record.expires_at - now)
        updated = time.time() - (self._ttl - left)
        limit, warn_at, enforce = record.judged_by
        return SessionState(
            session_id, record.tool_name, record.digest[:12], record.count, left, updated,
            max_repeats=limit, warn_at=warn_at, enforcing=enforce,
        )

    def inspect(self, session_id: str) -> SessionState | None:
        now = self._clock()
        with self._lock:
            self._expire(now)
            record = self._records.get(session_id)
            return None if record is None else self._state(session_id, record, now)

    def clear(self, session_id: str) -> bool:
        with self._lock:
            return self._records.pop(session_id, None) is not None

    def sessions(self, match: str | None = None) -> Iterator[SessionState]:
        now = self._clock()
        with self._lock:
            self._expire(now)
            states = [
                self._state(session, record, now)
                for session, record in self._records.items()
                if match is None or fnmatchcase(session, match)
            ]
        return iter(states)

    def reset(self) -> None:
        """Forget every session's streak."""
        with self._lock:
            self._records.clear()
