"""What every brake shares and that does no I/O: preparing a call, judging a count.

A check is three steps. `prepare` resolves the session and call id, applies
the per-tool policy and hashes the arguments (which never leave this step:
only the digest goes on). A backend turns the digest into a count (the
in-process slot map, or one Lua step in Redis). `judge` turns the count into a
`Verdict`, or raises `LoopBrakeError`. The in-process, sync Redis and asyncio
Redis brakes differ only in the middle step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, NamedTuple

from .errors import LoopBrakeError
from .identity import call_hash, hash_prefix
from .session import resolve_call_id, resolve_session
from .settings import BrakeSettings

__all__ = ["BrakeBase", "PreparedCall", "SessionState", "Verdict"]

logger = logging.getLogger("distbrake")


class Verdict(NamedTuple):
    """The answer to an allowed check (a denied one raises `LoopBrakeError`)."""

    count: int  # type: ignore[assignment]  # the field shadows tuple.count on purpose
    max_repeats: int
    hash_prefix: str
    session_id: str
    tool_name: str
    allowed: bool = True
    replayed: bool = False  # the call id was seen: counted once, same verdict
    exempt: bool = False  # the tool is exempt: nothing was counted
    decided_by: str = "memory"  # memory | redis | local (fallback) | open (fail-open)

    @property
    def denied(self) -> bool:
        return not self.allowed


@dataclass(frozen=True, slots=True)
class SessionState:
    """A session's slot as `inspect` and `sessions` show it (never the arguments)."""

    session_id: str
    tool_name: str
    hash_prefix: str
    count: int
    ttl_seconds: float | None
    updated_at: float  # Unix time of the last check, from the backend's clock


class PreparedCall(NamedTuple):
    """A call reduced to what the backends may see: no arguments, only their digest."""

    tool_name: str
    digest: str
    session_id: str
    call_id: str | None
    max_repeats: int

    @property
    def hash_prefix(self) -> str:
        return hash_prefix(self.digest)


class BrakeBase:
    """Configuration plus the non-I/O halves of `check`, shared by every brake."""

    settings: BrakeSettings

    def __init__(self, settings: BrakeSettings) -> None:
        self.settings = settings

    @property
    def max_repeats(self) -> int:
        return self.settings.max_repeats

    def prepare(
        self,
        tool: str,
        args: Any,
        session_id: object = None,
        call_id: object = None,
        context: object = None,
    ) -> PreparedCall | Verdict:
        """Resolve session, call id and limit, and hash; an exempt tool gives its Verdict."""
        session = session_id if type(session_id) is str else resolve_session(session_id, context)
        settings = self.settings
        if tool in settings.exempt_tools:
            return Verdict(0, 0, "", session, tool, exempt=True)
        limit = settings.tool_max_repeats.get(tool, settings.max_repeats)
        digest = call_hash(tool, args)  # also refuses a tool name that is not a str
        if call_id is None and context is None:
            return PreparedCall(tool, digest, session, None, limit)
        return PreparedCall(tool, digest, session, resolve_call_id(call_id, context), limit)

    def judge(
        self, call: PreparedCall, count: int, replayed: bool, decided_by: str
    ) -> Verdict:
        """The verdict for `count`; raises `LoopBrakeError` when it reaches the limit."""
        if count >= call.max_repeats:
            logger.warning(
                'loop brake denied tool "%s" in session %r (call %s, count %d, limit %d)',
                call.tool_name[:64], call.session_id[:128], call.hash_prefix, count, call.max_repeats,
            )
            raise LoopBrakeError(
                call.tool_name, count, call.max_repeats, call.hash_prefix, call.session_id
            )
        return Verdict(
            count, call.max_repeats, call.hash_prefix, call.session_id, call.tool_name,
            replayed=replayed, decided_by=decided_by,
        )
