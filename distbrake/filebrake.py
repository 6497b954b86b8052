"""`FileBrake`: a brake whose streaks live in a `StreakFile`, shared by every process of one user on one machine.

It is what `distbrake hook` counts with when no `DISTBRAKE_URL` is set and the
configuration asks for more than the hook's light path reads (per-tool rules,
cycles, warnings): the same `check`, the same verdicts and errors as every
brake (`core.BrakeCore`), the rule model's `step` and `observe` applied in one
SQLite transaction per check (see streakfile.py for why a file). Its verdicts
say `decided_by="in-process"`: decided on this machine, not by Redis.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from fnmatch import fnmatchcase
from typing import Unpack

from .core import PreparedCall, SessionState, SyncCheck, Verdict
from .killswitch import FileSwitch, Stop
from .model import Halt
from .operator import KillState, OperatorMixin
from .rules import call_failed, result_digest
from .settings import BrakeOptions, BrakeSettings, load_settings
from .streakfile import Row, StreakFile

__all__ = ["FileBrake"]


class FileBrake(OperatorMixin, SyncCheck):
    """A brake on a SQLite streak file (default: the user's cache directory); see the module's doc."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        settings: BrakeSettings | None = None,
        **options: Unpack[BrakeOptions],
    ) -> None:
        super().__init__(load_settings(settings, **options))
        s = self.settings
        self.store = StreakFile(path, timeout=s.timeout_seconds, ttl=s.ttl_seconds, prefix=s.key_prefix)
        self.cycles = s.cycle_rule
        self.switch = FileSwitch("in-process", self._read_kill)  # exempt tools too (a step reads it itself)

    def __repr__(self) -> str:
        return f"FileBrake({str(self.store.path)!r}, max_repeats={self.max_repeats})"

    def decide(self, call: PreparedCall) -> Verdict:
        """Count `call` in the file and judge it."""
        counted = self.store.step(call.session_id, call.digest, call.call_id, call.tool_name, call.rules, self.cycles)
        if counted.halt is not None and counted.halt.kind == "kill":  # the step read the switch: known now
            self.switch.set(self._read_kill())
        return self.judge(call, counted, "in-process")

    def observe(self, verdict: Verdict, result: object, failed: bool | None = None) -> None:
        """After the tool ran: its result, for a progress-aware tool's streak and a tool's failures in a row
        (as `LoopBrake.observe`)."""
        call = verdict.observe_token
        if isinstance(call, PreparedCall):
            if call.rules.progress:
                self.store.observe(call.session_id, call.digest, call.call_id, result_digest(result))
            if call.rules.max_failures is not None:
                failed = call_failed(result, failed)
                self.store.fail(call.session_id, call.tool_name, call.call_id, failed)

    def inspect(self, session_id: str) -> SessionState | None:
        rows = self.store.rows(session_id)
        return _state(rows[0]) if rows else None

    def sessions(self, match: str | None = None) -> Iterator[SessionState]:
        return iter([_state(row) for row in self.store.rows() if match is None or fnmatchcase(row.session, match)])

    def clear(self, session_id: str) -> bool:
        return self.store.clear(session_id)

    def close(self) -> None:
        self.store.close()

    # -- the operator's stop (operator.py) -------------------------------------------------------------------

    def _matching(self, match: str, halted: bool) -> Iterator[str]:
        return iter([row.session for row in self.store.rows()
                     if fnmatchcase(row.session, match) and (row.halt is not None or not halted)])

    def _block_one(self, target: str, session_id: str | None, halt: Halt, ttl: float | None) -> bool:
        self.store.block(target, halt, self.settings.ttl_seconds if ttl is None else ttl)
        return True

    def _unblock_one(self, target: str) -> bool:
        return self.store.unblock(target)

    def _clear_one(self, target: str) -> bool:
        return self.store.clear(target)

    def _set_kill(self, halt: Halt, ttl: float | None) -> None:
        self.store.set_kill(halt, ttl)
        self.switch.set(self._read_kill())

    def _clear_kill(self) -> bool:
        self.switch.set(None)
        return self.store.clear_kill()

    def _read_kill(self) -> Stop | None:
        found = self.store.kill()
        if found is None:
            return None
        halt, expires = found
        return Stop(halt, None if expires is None else time.monotonic() + (expires - time.time()))

    def kill_switch(self) -> KillState | None:
        """The kill switch (`block_all`) of this file and prefix, or None when it is not set."""
        found = self.store.kill()
        return None if found is None else KillState(found[0], None if found[1] is None else found[1] - time.time())


def _state(row: Row) -> SessionState:
    rules = row.rules
    return SessionState(
        row.session, row.tool, row.digest[:12], row.count, max(0.0, row.expires - time.time()), row.updated,
        max_repeats=None if rules is None else rules.max_repeats, warn_at=None if rules is None else rules.warn_at,
        enforcing=None if rules is None else rules.enforce, halt=row.halt,
    )
