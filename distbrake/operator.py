"""The operator's stop: block and unblock sessions, and stop every session of the fleet (the kill switch).

Every brake has the same four methods (sync, or coroutines on the asyncio
brake), built on small primitives of its backend (`OperatorMixin`,
`AsyncOperatorMixin`):

* `block(*session_ids, match=None, reason=None, ttl_seconds=None, who=None)`
  halts the named sessions (those not seen yet too) and, with `match`, every
  existing session whose id matches the glob: each later check of them, any
  tool, on any worker, raises `LoopBrakeHalt` (halt_rule "block") until the
  halt expires (`ttl_seconds`, default: the brake's `ttl_seconds`) or is
  lifted. Returns how many sessions were blocked.
* `unblock(*session_ids, match=None)` lifts the halts of the named (or
  matching) halted sessions, a rule's halt or an operator's block: the record
  is deleted, the session starts afresh. Returns how many halts were lifted;
  a session that is not halted is left as it is. `clear` lifts a halt too.
* `clear_matching(match)` forgets the record of every existing session whose
  id matches the glob (`clear(session_id)` forgets one); returns how many.
* `block_all(reason=None, ttl_seconds=None, who=None)` sets the fleet's kill
  switch, the key `<prefix>:halt-all` (default: no expiry): every check of
  every session under the prefix, exempt tools too, raises `LoopBrakeHalt`
  (halt_rule "kill") on every worker within a second (see `killswitch.py`),
  until `unblock_all()` (True when it was set) or its TTL.

`who` (at most WHO_CHARS) and `reason` (at most REASON_CHARS) are the
operator's, kept in the record: NUL characters are dropped, longer text is
cut. Never arguments.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from .errors import ConfigurationError
from .model import REASON_CHARS, WHO_CHARS, Halt, operator_text
from .session import resolve_session

if TYPE_CHECKING:
    from .settings import BrakeSettings

__all__ = [
    "KILL_KEY", "REASON_CHARS", "WHO_CHARS", "AsyncOperatorMixin", "KillState", "OperatorMixin", "bounded",
    "halt_ttl", "kill_key", "operator_halt", "targets", "ttl_ms",
]

KILL_KEY = "halt-all"  # the kill switch's key is `<prefix>:halt-all` (never a session's: those have 18 characters)


class KillState(NamedTuple):
    """The kill switch, set: its halt (kind "kill"), and the seconds left before it lapses (None: no expiry)."""

    halt: Halt
    ttl_seconds: float | None


def kill_key(key_prefix: str) -> str:
    """The Redis key of the fleet's kill switch under `key_prefix`."""
    return f"{key_prefix}:{KILL_KEY}"


def bounded(value: object, limit: int, what: str) -> str:
    """An operator's text as the record keeps it: no NUL, at most `limit` characters ("" for None)."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    return operator_text(value, limit)


def operator_halt(kind: Literal["block", "kill"], reason: object = None, who: object = None) -> Halt:
    """The halt an operator sets now: a session's block, or the kill switch."""
    return Halt(kind, time.time(), who=bounded(who, WHO_CHARS, "who"), reason=bounded(reason, REASON_CHARS, "reason"))


def halt_ttl(ttl_seconds: object, default: float | None) -> float | None:
    """How long a block lasts, in seconds: `ttl_seconds`, else `default` (None: no expiry)."""
    if ttl_seconds is None:
        return default
    if isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, (int, float)) or not (
            math.isfinite(ttl_seconds) and 0 < ttl_seconds <= 10 * 365 * 86400):
        raise ConfigurationError(f"invalid ttl_seconds: {ttl_seconds!r} (expected seconds > 0, at most ten years)")
    return float(ttl_seconds)


def ttl_ms(seconds: float) -> int:
    """A TTL in whole milliseconds (at least one)."""
    return max(1, round(seconds * 1000))


def targets(session_ids: Iterable[object], match: str | None) -> list[str]:
    """The named sessions (each once, in order); `ValueError` when neither a session nor `match` is given."""
    ids = list(session_ids)
    if any(session is None for session in ids):
        raise TypeError("a session id must be a str, not None")
    named = list(dict.fromkeys(resolve_session(session) for session in ids))
    if not named and match is None:
        raise ValueError("name at least one session, or give match=GLOB")
    if match is not None and not isinstance(match, str):
        raise TypeError(f"match must be a str, not {type(match).__name__}")
    return named


def block_plan(
    session_ids: Iterable[object], match: str | None, reason: object, ttl_seconds: object, who: object,
    settings: BrakeSettings,
) -> tuple[list[str], Halt, float | None]:
    """What a `block` does, checked: the named sessions, the halt, and how long it lasts (default: the TTL)."""
    return targets(session_ids, match), operator_halt("block", reason, who), halt_ttl(ttl_seconds, settings.ttl_seconds)


def found_targets(
    target: Callable[[str], Hashable], named: list[str], matching: Iterable[Hashable]
) -> dict[Hashable, str | None]:
    """Each session's target once: the named sessions' (with their ids), then the matching ones' (None)."""
    found: dict[Hashable, str | None] = {target(session): session for session in named}
    for each in list(matching):
        found.setdefault(each, None)
    return found


# -- the methods every brake shares ---------------------------------------------------------------------------


class OperatorMixin:
    """`block`, `unblock`, `block_all`, `unblock_all` of a sync brake, on its backend's primitives.

    A session is reached by its *target* (`_target`: the session id, or its
    Redis key): a glob finds the targets of existing sessions (`_matching`),
    whose ids a record may keep cut short.
    """

    settings: BrakeSettings

    def block(
        self, *session_ids: str, match: str | None = None, reason: str | None = None,
        ttl_seconds: float | None = None, who: str | None = None,
    ) -> int:
        """Halt the named sessions, and every existing one matching the glob `match`; returns how many."""
        named, halt, ttl = block_plan(session_ids, match, reason, ttl_seconds, who, self.settings)
        found = found_targets(self._target, named, () if match is None else self._matching(match, False))
        return sum(self._block_one(target, session, halt, ttl) for target, session in found.items())

    def unblock(self, *session_ids: str, match: str | None = None) -> int:
        """Lift the halts of the named (or matching) halted sessions: their records are deleted; how many."""
        named = targets(session_ids, match)
        found = found_targets(self._target, named, () if match is None else self._matching(match, True))
        return sum(self._unblock_one(target) for target in found)

    def clear_matching(self, match: str) -> int:
        """Forget the record of every existing session whose id matches the glob `match` (a halt too); how many."""
        return sum(self._clear_one(target) for target in found_targets(self._target, [], self._matching(match, False)))

    def block_all(self, reason: str | None = None, ttl_seconds: float | None = None, who: str | None = None) -> None:
        """Set the kill switch: every check of every session is refused until `unblock_all` (or the TTL)."""
        self._set_kill(operator_halt("kill", reason, who), halt_ttl(ttl_seconds, None))

    def unblock_all(self) -> bool:
        """Lift the kill switch; True when it was set."""
        return self._clear_kill()

    # the backend's primitives
    def _target(self, session_id: str) -> Hashable:
        return session_id

    def _matching(self, match: str, halted: bool) -> Iterator[Hashable]:
        """The targets of existing sessions matching `match` (only the halted ones, with `halted`)."""
        raise NotImplementedError

    def _block_one(self, target: Any, session_id: str | None, halt: Halt, ttl: float | None) -> bool:
        """Halt one session (`session_id`: its id when it was named, else None); True when done."""
        raise NotImplementedError

    def _unblock_one(self, target: Any) -> bool:
        raise NotImplementedError

    def _clear_one(self, target: Any) -> bool:
        """Delete one session's record; True when there was one."""
        raise NotImplementedError

    def _set_kill(self, halt: Halt, ttl: float | None) -> None:
        raise NotImplementedError

    def _clear_kill(self) -> bool:
        raise NotImplementedError


class AsyncOperatorMixin:
    """The same methods as coroutines, for the asyncio brake (the same helpers: only the I/O differs)."""

    settings: BrakeSettings

    async def block(
        self, *session_ids: str, match: str | None = None, reason: str | None = None,
        ttl_seconds: float | None = None, who: str | None = None,
    ) -> int:
        """Halt the named sessions, and every existing one matching the glob `match`; returns how many."""
        named, halt, ttl = block_plan(session_ids, match, reason, ttl_seconds, who, self.settings)
        found = found_targets(self._target, named, await self._all_matching(match, False))
        return sum([await self._block_one(target, session, halt, ttl) for target, session in found.items()])

    async def unblock(self, *session_ids: str, match: str | None = None) -> int:
        """Lift the halts of the named (or matching) halted sessions: their records are deleted; how many."""
        named = targets(session_ids, match)
        found = found_targets(self._target, named, await self._all_matching(match, True))
        return sum([await self._unblock_one(target) for target in found])

    async def clear_matching(self, match: str) -> int:
        """Forget the record of every existing session whose id matches the glob `match` (a halt too); how many."""
        found = found_targets(self._target, [], await self._all_matching(match, False))
        return sum([await self._clear_one(target) for target in found])

    async def block_all(
        self, reason: str | None = None, ttl_seconds: float | None = None, who: str | None = None,
    ) -> None:
        """Set the kill switch: every check of every session is refused until `unblock_all` (or the TTL)."""
        await self._set_kill(operator_halt("kill", reason, who), halt_ttl(ttl_seconds, None))

    async def unblock_all(self) -> bool:
        """Lift the kill switch; True when it was set."""
        return await self._clear_kill()

    async def _all_matching(self, match: str | None, halted: bool) -> list[Hashable]:
        return [] if match is None else [target async for target in self._matching(match, halted)]

    def _target(self, session_id: str) -> Hashable:
        raise NotImplementedError

    def _matching(self, match: str, halted: bool) -> AsyncIterator[Hashable]:
        raise NotImplementedError

    async def _block_one(self, target: Any, session_id: str | None, halt: Halt, ttl: float | None) -> bool:
        raise NotImplementedError

    async def _unblock_one(self, target: Any) -> bool:
        raise NotImplementedError

    async def _clear_one(self, target: Any) -> bool:
        raise NotImplementedError

    async def _set_kill(self, halt: Halt, ttl: float | None) -> None:
        raise NotImplementedError

    async def _clear_kill(self) -> bool:
        raise NotImplementedError
