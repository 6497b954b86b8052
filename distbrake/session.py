"""Which session a call belongs to, and which call id it carries.

The session is, first match wins: the `session_id` passed to `check`; the one
bound for the current block with `bind_session` (a `ContextVar`, so
concurrent asyncio tasks and threads keep their own); the calling agent's id
found in the `context` the host hands the tool; else `"default"`.

A context is understood when it is a mapping or an object with one of these
keys or attributes (first found wins):

    session id: session_id, sessionId, agent_id, agentId
    call id:    call_id, callId, tool_call_id, toolCallId
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from uuid import UUID

__all__ = ["DEFAULT_SESSION", "bind_session", "bound_session", "find_session", "resolve_call_id", "resolve_session"]

DEFAULT_SESSION = "default"
SESSION_KEYS = ("session_id", "sessionId", "agent_id", "agentId")
CALL_ID_KEYS = ("call_id", "callId", "tool_call_id", "toolCallId")

_bound: ContextVar[str | None] = ContextVar("distbrake_session", default=None)


def _lookup(context: object, names: tuple[str, ...]) -> object:
    if context is None:
        return None
    for name in names:
        value = context.get(name) if isinstance(context, Mapping) else getattr(context, name, None)
        if value is not None and value != "":
            return value
    return None


def _as_id(value: object, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, UUID)) and not isinstance(value, bool):
        return str(value)
    raise TypeError(f"{what} must be a str, not {type(value).__name__}")


def find_session(session_id: object = None, context: object = None) -> str | None:
    """The session of a call (see the module text for the order), None when nothing names one."""
    if session_id is not None:
        return _as_id(session_id, "session_id")
    bound = _bound.get()
    if bound is not None:
        return bound
    found = _lookup(context, SESSION_KEYS)
    return None if found is None else _as_id(found, "the context's session id")


def resolve_session(session_id: object = None, context: object = None) -> str:
    """The session of a call (see the module text for the order): `"default"` when nothing names one."""
    found = find_session(session_id, context)
    return DEFAULT_SESSION if found is None else found


def resolve_call_id(call_id: object = None, context: object = None) -> str | None:
    """The host's id for this call, if it has one."""
    if call_id is not None:
        return _as_id(call_id, "call_id")
    found = _lookup(context, CALL_ID_KEYS)
    return None if found is None else _as_id(found, "the context's call id")


def bound_session() -> str | None:
    """The session bound for the current block, if any."""
    return _bound.get()


@contextmanager
def bind_session(session_id: str) -> Iterator[str]:
    """Make `session_id` the session of every check in this block (task- and thread-local)."""
    token = _bound.set(_as_id(session_id, "session_id"))
    try:
        yield session_id
    finally:
        _bound.reset(token)
