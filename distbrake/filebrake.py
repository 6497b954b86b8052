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
from collections.abc import Iterator
from fnmatch import fnmatchcase
from typing import Unpack

from .core import PreparedCall, SessionState, SyncCheck, Verdict
from .rules import result_digest
from .settings import BrakeOptions, BrakeSettings, load_settings
from .streakfile import Row, StreakFile

__all__ = ["FileBrake"]


class FileBrake(SyncCheck):
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

    def __repr__(self) -> str:
        return f"FileBrake({str(self.store.path)!r}, max_repeats={self.max_repeats})"

    def decide(self, call: PreparedCall) -> Verdict:
        """Count `call` in the file and judge it."""
        counted = self.store.step(call.session_id, call.digest, call.call_id, call.tool_name, call.rules, self.cycles)
        return self.judge(call, counted, "in-process")

    def observe(self, verdict: Verdict, result: object, failed: bool | None = None) -> None:
        """After the tool ran: its result, for a progress-aware tool's streak and a tool's failures in a row
        (as `LoopBrake.observe`)."""
        call = verdict.observe_token
        if isinstance(call, PreparedCall):
            if call.rules.progress:
                self.store.observe(call.session_id, call.digest, call.call_id, result_digest(result))
            if call.rules.max_failures is not None:
                failed = isinstance(result, BaseException) if failed is None else failed
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


def _state(row: Row) -> SessionState:
    import time

    rules = row.rules
    return SessionState(
        row.session, row.tool, row.digest[:12], row.count, max(0.0, row.expires - time.time()), row.updated,
        max_repeats=None if rules is None else rules.max_repeats, warn_at=None if rules is None else rules.warn_at,
        enforcing=None if rules is None else rules.enforce,
    )
