"""`LoopBrake`, the in-process brake: one streak record per session, in this process.

It applies the rules of `model.py` (`step`, `observe`) under a lock, forgets idle sessions after
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

from .core import PreparedCall, SessionState, SyncCheck, Verdict
from .killswitch import KillSwitch, Stop
from .model import Counted, Halt, Rules, Streak, check, fail, observe
from .operator import KillState, OperatorMixin
from .rules import call_failed, result_digest
from .settings import BrakeOptions, BrakeSettings, load_settings
from .telemetry.build import build_telemetry
from .telemetry.health import Healthy
from .telemetry.options import take_telemetry_options
from .wrap import GuardMixin

__all__ = ["LoopBrake"]


UNJUDGED = Rules(0)


@dataclass(slots=True)
class _Record(Streak):
    """A session's streak, when it expires, and what its last check was judged by."""

    expires_at: float = 0.0  # on the brake's clock (monotonic); last update = expires_at - ttl
    judged_by: Rules = UNJUDGED
    updated: float = 0.0  # a record an operator's block made (never checked): Unix time of the block


class LoopBrake(OperatorMixin, Healthy, GuardMixin, SyncCheck):
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
        telemetry = take_telemetry_options(options)  # type: ignore[arg-type]
        super().__init__(load_settings(settings, **options))
        built = build_telemetry(
            telemetry, decided_by="in-process", policy=self.settings.on_backend_error, backend="in-process",
            asynchronous=False,
        )
        self.watch, self.health_watch = built.watch, built.health
        self._clock = clock
        self._lock = threading.Lock()
        self._records: OrderedDict[str, _Record] = OrderedDict()
        self._ttl = self.settings.ttl_seconds
        self._window = self.settings.timeout_seconds  # the replay window, as in lua/brake.lua
        self._cycles = self.settings.cycle_rule
        self.switch = KillSwitch("in-process")  # this process's own: block_all sets it

    def __repr__(self) -> str:
        return f"LoopBrake(max_repeats={self.max_repeats}, sessions={len(self._records)})"

    def record(self, call: PreparedCall) -> Counted:
        """Apply the rules to `call`'s session record (the model's `check`)."""
        now = self._clock()
        records = self._records
        session = call.session_id
        with self._lock:
            if records and next(iter(records.values())).expires_at <= now:
                self._expire(now)
            record = records.get(session)
            if record is not None and record.expires_at <= now:  # `_live_record`, inline on the check's path
                del records[session]
                record = None
            if record is None:
                record = records[session] = _Record()
                fresh = False
            else:
                fresh = now - (record.expires_at - self._ttl) <= self._window
                records.move_to_end(session)
            counted = check(
                record, call.digest, call.call_id, call.tool_name, fresh, call.rules, self._cycles, time.time
            )
            if counted.halt is None:  # a halted session's checks do not extend its record's TTL
                record.expires_at = now + self._ttl
                record.judged_by = call.rules
        return counted

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
            if record is not None:
                observe(record, call.digest, call.call_id, digest)

    def observe_failure(self, call: PreparedCall, failed: bool) -> None:
        """Record whether `call` (a tool with max_failures) failed: its tool's failures in a row."""
        with self._lock:
            record = self._records.get(call.session_id)
            if record is not None:
                fail(record, call.tool_name, call.call_id, failed)

    def observe(self, verdict: Verdict, result: object, failed: bool | None = None) -> None:
        """After the tool ran: its result (or raised exception), for a progress-aware tool's streak and a
        tool's failures in a row (max_failures). `failed`: the call failed (default: `result` is an exception;
        an MCP result with isError, or a framework's tool error, is a failure too: pass True)."""
        call = verdict.observe_token
        if isinstance(call, PreparedCall):
            if call.rules.progress:
                self.observe_digest(call, result_digest(result))
            if call.rules.max_failures is not None:
                self.observe_failure(call, call_failed(result, failed))

    def decide(self, call: PreparedCall) -> Verdict:
        """Count `call` in this process and judge it."""
        return self.judge(call, self.record(call), "in-process")

    # -- operations (the same names as the distributed brakes) --------------------

    def _state(self, session_id: str, record: _Record, now: float) -> SessionState:
        left = max(0.0, record.expires_at - now)
        updated = time.time() - (self._ttl - left) if record.judged_by is not UNJUDGED else record.updated
        rules = record.judged_by
        return SessionState(
            session_id, record.tool_name, record.digest[:12], record.count, left, updated,
            max_repeats=rules.max_repeats if rules is not UNJUDGED else None, warn_at=rules.warn_at,
            enforcing=rules.enforce if rules is not UNJUDGED else None, halt=record.halt,
        )

    def _live(self, now: float) -> Iterator[tuple[str, _Record]]:
        """The records not expired (under the lock): a block's TTL may end before the records after it."""
        self._expire(now)
        return ((session, record) for session, record in self._records.items() if record.expires_at > now)

    def _live_record(self, session_id: str, now: float) -> _Record | None:
        """The session's record unless expired (under the lock; an expired one is dropped): a block's own TTL
        may end before the records after it in the order `_expire` trims."""
        record = self._records.get(session_id)
        if record is not None and record.expires_at <= now:
            del self._records[session_id]
            return None
        return record

    def inspect(self, session_id: str) -> SessionState | None:
        now = self._clock()
        with self._lock:
            self._expire(now)
            record = self._live_record(session_id, now)
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
                for session, record in self._live(now)
                if match is None or fnmatchcase(session, match)
            ]
        return iter(states)

    def reset(self) -> None:
        """Forget every session's streak."""
        with self._lock:
            self._records.clear()

    # -- the operator's stop (operator.py) -----------------------------------------------------------

    def _matching(self, match: str, halted: bool) -> Iterator[str]:
        with self._lock:
            found = [session for session, record in self._live(self._clock())
                     if fnmatchcase(session, match) and (record.halt is not None or not halted)]
        return iter(found)

    def _block_one(self, target: str, session_id: str | None, halt: Halt, ttl: float | None) -> bool:
        now = self._clock()
        with self._lock:
            record = self._live_record(target, now)
            if record is None:
                record = self._records[target] = _Record(updated=halt.since)
            record.halt = halt
            record.expires_at = now + (self._ttl if ttl is None else ttl)
        return True

    def _unblock_one(self, session_id: str) -> bool:
        with self._lock:
            record = self._live_record(session_id, self._clock())
            if record is None or record.halt is None:
                return False
            del self._records[session_id]
            return True

    def _clear_one(self, session_id: str) -> bool:
        return self.clear(session_id)

    def _set_kill(self, halt: Halt, ttl: float | None) -> None:
        self.switch.set(Stop(halt, None if ttl is None else time.monotonic() + ttl))

    def _clear_kill(self) -> bool:
        was = self.switch.stop is not None
        self.switch.set(None)
        return was

    def kill_switch(self) -> KillState | None:
        """The kill switch (`block_all`), or None when it is not set."""
        stop = self.switch.stop
        return None if stop is None else KillState(stop.halt, stop.seconds_left)
