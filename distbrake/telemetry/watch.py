"""`Watch`: what a check reports when anything observes the brake (recorders, callbacks, the fleet view).

Chosen once when the brake is built (`build_watch`); a brake with nothing to
report has no `Watch` and its check pays one attribute test. Sync and async
brakes share every step: their `check` takes `start()`, then reports the
verdict (`done`) or what the check raised (`raised`), with no wrapper of its
own around the check (no call and no coroutine more per check).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import BrakeUnavailableError, LoopBrakeError, LoopBrakeHalt
from ..session import resolve_call_id
from .callbacks import Callback, run_callback
from .fleet import AsyncFleetWriter, FleetWriter
from .recorder import TOOL_CHARS, Outcome, Recorder

if TYPE_CHECKING:
    from ..core import Verdict

__all__ = ["Fanout", "Watch", "decided_by_of", "mark_decided_by"]

_clock = time.perf_counter


def mark_decided_by(error: LoopBrakeError, decided_by: str) -> None:
    """Note on a denial who decided it, when that is not the brake's own backend (the fallback)."""
    error.decided_by = decided_by


def decided_by_of(error: LoopBrakeError, default: str) -> str:
    return error.decided_by or default


class Fanout(Recorder):
    """Several recorders as one."""

    def __init__(self, recorders: list[Recorder]) -> None:
        self._recorders = recorders

    def check(self, tool: str, outcome: Outcome, decided_by: str, seconds: float | None) -> None:
        for recorder in self._recorders:
            recorder.check(tool, outcome, decided_by, seconds)

    def backend_error(self, error_type: str) -> None:
        for recorder in self._recorders:
            recorder.backend_error(error_type)

    def fallback(self, policy: str) -> None:
        for recorder in self._recorders:
            recorder.fallback(policy)

    def script_load(self) -> None:
        for recorder in self._recorders:
            recorder.script_load()

    def guardrail(self, result_type: str, reason: str, tool: str, call_id: str | None) -> None:
        for recorder in self._recorders:
            recorder.guardrail(result_type, reason, tool, call_id)


def _call_id(call_id: object, context: object) -> str | None:
    try:
        return resolve_call_id(call_id, context)
    except Exception:  # a bad call id failed the check already; the event just goes without one
        return None


@dataclass(slots=True, kw_only=True)
class Watch:
    """Reports each check of one brake: outcome and duration, denials and warnings, the fleet view."""

    recorder: Recorder
    decided_by: str  # who decides this brake's checks, unless a denial says otherwise (the fallback)
    policy: str
    on_deny: Callback | None = None
    on_warn: Callback | None = None
    fleet: FleetWriter | AsyncFleetWriter | None = None

    @staticmethod
    def start() -> float:
        """The clock reading a check's duration is measured from (`done`, `raised`)."""
        return _clock()

    def raised(self, error: BaseException, start: float, call_id: object, context: object) -> None:
        """A check that raised: a denial is reported (`denied`, or `halted`), the closed policy's refusal counted."""
        if isinstance(error, LoopBrakeError):
            self.denied(error, start, call_id, context)
        elif isinstance(error, BrakeUnavailableError):
            self.recorder.fallback("closed")

    def flush(self) -> None:
        """Wait (bounded) for the fleet view's writes of a sync brake; the brake's `close()` calls it."""
        if self.fleet is not None and not isinstance(self.fleet, AsyncFleetWriter):
            self.fleet.flush()

    async def aflush(self) -> None:
        """The same for an async brake (`aclose()`)."""
        if isinstance(self.fleet, AsyncFleetWriter):
            await self.fleet.flush()

    def done(self, verdict: Verdict, start: float, call_id: object, context: object) -> None:
        seconds = _clock() - start
        tool = verdict.tool_name[:TOOL_CHARS]
        decided_by = verdict.decided_by
        if decided_by in ("redis", "in-process"):  # the common case first
            if verdict.warning is None and not (verdict.replayed or verdict.would_deny):
                self.recorder.check(tool, "allowed", decided_by, seconds)
                return
        elif decided_by == "exempt":
            self.recorder.check(tool, "exempt", "exempt", None)
            return
        else:  # fallback, fail-open
            self.recorder.fallback(self.policy)
        if verdict.replayed:  # the same call again: counted once, reported once
            self.recorder.check(tool, "replayed", decided_by, seconds)
        elif verdict.would_deny:
            self.recorder.check(tool, "would_deny", decided_by, seconds)
            self.recorder.guardrail(
                "would_deny", f'loop brake: tool "{tool}" would be denied (shadow mode, count '
                f"{verdict.count}, limit {verdict.max_repeats})", tool, _call_id(call_id, context))
        elif verdict.warning is not None:
            self.recorder.check(tool, "warned", decided_by, seconds)
            self.recorder.guardrail("warned", verdict.warning, tool, _call_id(call_id, context))
            if self.fleet is not None:
                self.fleet.note("w", tool)
            if self.on_warn is not None:
                run_callback("on_warn", self.on_warn, verdict)
        else:
            self.recorder.check(tool, "allowed", decided_by, seconds)

    def denied(self, error: LoopBrakeError, start: float, call_id: object, context: object) -> None:
        seconds = _clock() - start
        tool = error.tool_name[:TOOL_CHARS]
        decided_by = decided_by_of(error, self.decided_by)
        if decided_by == "fallback":
            self.recorder.fallback(self.policy)
        halted = isinstance(error, LoopBrakeHalt)  # the session is halted: the run must stop
        outcome: Outcome = "halted" if halted else "denied"
        self.recorder.check(tool, outcome, decided_by, seconds)
        self.recorder.guardrail(outcome, str(error), tool, _call_id(call_id, context))
        if self.fleet is not None:
            self.fleet.note("h" if halted else "d", tool)
        if self.on_deny is not None:
            run_callback("on_deny", self.on_deny, error)
