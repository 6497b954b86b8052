"""The streak rule and `LoopBrake`, the in-process brake.

The rule, per check of a session's one slot (last call hash, count):

* same hash as the slot: count + 1; a different hash or an empty slot: the
  slot takes the new hash and count = 1;
* a call with the slot's hash whose call id is the last or the previous one
  of this streak is a replay (a retry, or one host call passing two seams):
  counted once, it gets the count (and so the verdict) it got the first time;
* the call is denied when count >= max_repeats; denied calls keep counting.

`lua/brake.lua` applies the same rule inside Redis.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from .base import BrakeBase, PreparedCall, SessionState, Verdict
from .settings import BrakeSettings, load_settings
from .wrap import GuardMixin

__all__ = ["LoopBrake", "advance"]


@dataclass(slots=True)
class _Slot:
    digest: str
    count: int
    call_id: str | None  # of the last counted call
    previous_id: str | None  # of the call before it, in this streak
    tool_name: str
    expires_at: float  # on the brake's clock (monotonic); last update = expires_at - ttl


def advance(
    last_digest: str | None, last_count: int, last_id: str | None, previous_id: str | None,
    digest: str, call_id: str | None,
) -> tuple[int, bool]:
    """The streak rule: the new count, and whether the call is a replay (not counted)."""
    if last_digest != digest:
        return 1, False
    if call_id is not None:
        if call_id == last_id:
            return last_count, True
        if last_count > 1 and call_id == previous_id:
            return last_count - 1, True
    return last_count + 1, False


class LoopBrake(GuardMixin, BrakeBase):
    """The in-process brake: one slot per session in this process, locked, TTL-bounded."""

    def __init__(
        self,
        max_repeats: int | float | str | None = None,
        *,
        settings: BrakeSettings | None = None,
        ttl_seconds: float | None = None,
        tool_max_repeats: dict[str, int] | None = None,
        exempt_tools: frozenset[str] | set[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(
            load_settings(
                settings, max_repeats=max_repeats, ttl_seconds=ttl_seconds,
                tool_max_repeats=tool_max_repeats, exempt_tools=exempt_tools,
            )
        )
        self._clock = clock
        self._lock = threading.Lock()
        self._slots: OrderedDict[str, _Slot] = OrderedDict()
        self._ttl = self.settings.ttl_seconds

    def __repr__(self) -> str:
        return f"LoopBrake(max_repeats={self.max_repeats}, sessions={len(self._slots)})"

    def record(self, call: PreparedCall) -> tuple[int, bool]:
        """Apply the rule to `call`'s session slot; returns (count, replayed)."""
        now = self._clock()
        slots = self._slots
        session = call.session_id
        with self._lock:
            if slots and next(iter(slots.values())).expires_at <= now:
                self._expire(now)
            slot = slots.get(session)
            if slot is None:
                count, replayed = 1, False
                slots[session] = _Slot(
                    call.digest, 1, call.call_id, None, call.tool_name, now + self._ttl
                )
            else:
                count, replayed = advance(
                    slot.digest, slot.count, slot.call_id, slot.previous_id,
                    call.digest, call.call_id,
                )
                if not replayed:
                    slot.previous_id = slot.call_id if count > 1 else None
                    slot.digest, slot.count, slot.call_id = call.digest, count, call.call_id
                    slot.tool_name = call.tool_name
                slot.expires_at = now + self._ttl
                slots.move_to_end(session)
        return count, replayed

    def _expire(self, now: float) -> None:
        slots = self._slots
        while slots:
            first = next(iter(slots.values()))
            if first.expires_at > now:
                break
            slots.popitem(last=False)

    def check(
        self,
        tool: str,
        args: Any,
        *,
        session_id: object = None,
        call_id: object = None,
        context: object = None,
    ) -> Verdict:
        """Count this call; raise `LoopBrakeError` if it is the Nth identical in a row."""
        call = self.prepare(tool, args, session_id, call_id, context)
        if isinstance(call, Verdict):
            return call
        count, replayed = self.record(call)
        return self.judge(call, count, replayed, "memory")

    # -- operations (the same names as the distributed brakes) --------------------

    def _state(self, session_id: str, slot: _Slot, now: float) -> SessionState:
        left = max(0.0, slot.expires_at - now)
        updated = time.time() - (self._ttl - left)
        return SessionState(session_id, slot.tool_name, slot.digest[:12], slot.count, left, updated)

    def inspect(self, session_id: str) -> SessionState | None:
        now = self._clock()
        with self._lock:
            self._expire(now)
            slot = self._slots.get(session_id)
            return None if slot is None else self._state(session_id, slot, now)

    def clear(self, session_id: str) -> bool:
        with self._lock:
            return self._slots.pop(session_id, None) is not None

    def sessions(self, match: str | None = None) -> Iterator[SessionState]:
        now = self._clock()
        with self._lock:
            self._expire(now)
            states = [
                self._state(session, slot, now)
                for session, slot in self._slots.items()
                if match is None or fnmatchcase(session, match)
            ]
        return iter(states)

    def reset(self) -> None:
        """Forget every session's streak."""
        with self._lock:
            self._slots.clear()
