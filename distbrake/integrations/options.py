"""What every framework adapter shares: its build-time checks and the session scope.

A session scope says how long a streak lives:

* `scope="run"` (the default of every adapter): within one agent invocation.
  The session id is the conversation (thread) id together with the
  framework's run or invocation id, so the same legitimate question asked in
  three user turns is three streaks of one call each, never a loop;
* `scope="conversation"`: the thread (conversation) id alone, across turns.

An explicit `session_id=` callable (given the framework's own context object,
documented per adapter) overrides both; when it returns None or "" the
scope's rule applies (`chosen_session`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

from ..errors import ConfigurationError
from ..session import bound_session

__all__ = [
    "SCOPES", "Scope", "SessionIdFunction", "check_adapter_options", "chosen_session", "scoped_session",
]

Scope = Literal["run", "conversation"]
SCOPES: tuple[Scope, ...] = ("run", "conversation")
SessionIdFunction = Callable[[Any], object]


def check_adapter_options(
    brake: object,
    on_deny: str,
    choices: Iterable[str],
    scope: str = "run",
    session_id: object = None,
) -> None:
    """Raise `ConfigurationError` for an unknown `on_deny` or `scope`, `TypeError` for a bad brake or callable."""
    allowed = tuple(choices)
    if on_deny not in allowed:
        raise ConfigurationError(
            f"on_deny must be one of {', '.join(map(repr, allowed))}, not {on_deny!r}"
        )
    if scope not in SCOPES:
        raise ConfigurationError(
            f"scope must be one of {', '.join(map(repr, SCOPES))}, not {scope!r}"
        )
    if session_id is not None and not callable(session_id):
        raise TypeError(f"session_id must be a callable or None, not {type(session_id).__name__}")
    if not callable(getattr(brake, "check", None)):
        raise TypeError(f"brake must have a check method, not {type(brake).__name__}")


def scoped_session(scope: str, conversation: object, run: object) -> str | None:
    """The session id for `scope`: the conversation alone, or the run within it (None: the brake's default).

    With `scope="run"` and a run id, the id is `<conversation>/run/<run>`
    (just `run/<run>` without a conversation); without a run id it falls back
    to the conversation. When the framework names no conversation, the
    session bound with `bind_session` (if any) stands for it, so a bound
    session is kept under both scopes.
    """
    thread = None if conversation is None or conversation == "" else str(conversation)
    if scope == "run" and run is not None and run != "":
        if thread is None:
            thread = bound_session()
        return f"run/{run}" if thread is None else f"{thread}/run/{run}"
    return thread


def chosen_session(
    session_id: Callable[[Any], object] | None,
    context: Any,
    default: Callable[[Any], object],
) -> object:
    """`session_id(context)` when it names a session (not None, not ""), else `default(context)`."""
    if session_id is not None:
        chosen = session_id(context)
        if chosen is not None and chosen != "":
            return chosen
    return default(context)
