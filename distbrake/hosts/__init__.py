"""The coding agents' hook protocols: one small module per host (`distbrake hook <host>`, `distbrake serve`).

Each host module reads that host's hook event (the JSON it writes on a hook's
stdin, or POSTs to an HTTP hook) into a `HookEvent`, and writes a `Decision`
back in that host's own shape (`Answer`: stdout, stderr, exit code). Every
field name comes from the host's documentation or source, cited in its module
and pinned by `tests/test_hook.py` with the hosts' documented example payloads (`tests/hook_events.py`).

This package imports nothing beyond the standard library: the hook runs before
every tool call, so its start-up is part of every call's latency.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, cast

__all__ = [
    "HOSTS", "Answer", "Decision", "HookEvent", "HookInputError", "Phase", "host", "optional_text", "shown",
    "text_field",
]

# The hosts, by the name `distbrake hook <name>` and `POST /v1/hooks/<name>` use.
HOSTS = ("claude-code", "codex", "gemini", "cursor")
Phase = Literal["pre", "post"]
Verb = Literal["allow", "warn", "deny", "halt"]  # what a hook answers: one word each


class HookInputError(ValueError):
    """A hook event that cannot be read (not an object, a missing or mistyped field); never quotes the input."""


class HookEvent(NamedTuple):
    """A host's tool event, reduced to what a check needs."""

    phase: Phase  # "pre": before the tool runs (checked); "post": after it ran (observed)
    event: str  # the host's event name, as the answer must name it
    tool: str
    args: Any
    session: str  # the host's session (Claude Code, Codex, Gemini session_id; Cursor conversation_id)
    run: str | None = None  # the host's turn or prompt id, for --scope run (None: the host sends none)
    call_id: str | None = None  # the host's tool-use id (None: the host sends none)
    result: Any = None  # post: the tool's result (progress-aware tools, max_failures)
    failed: bool = False  # post: the host says the tool failed (Claude Code's PostToolUseFailure)


class Decision(NamedTuple):
    """What the brake says of a pre-tool event: allow, warn (allowed, with a text), deny, or halt."""

    verb: Verb
    message: str | None = None  # the text the model (and the user) reads; never the arguments


class Answer(NamedTuple):
    """A hook's reply in its host's protocol."""

    stdout: str
    stderr: str = ""
    code: int = 0


if TYPE_CHECKING:  # a Protocol class costs start-up time: the hook never needs it at run time
    from typing import Protocol

    class Host(Protocol):
        """What each host module offers (module-level functions)."""

        NAME: str
        PRE: tuple[str, ...]  # the pre-tool events (the first: the one a denial of unreadable input names)
        POST: tuple[str, ...]

        def parse(self, payload: Mapping[str, Any]) -> HookEvent | None: ...

        def answer(self, event: str, decision: Decision) -> Answer: ...

        def allow(self, event: str) -> Answer: ...


_MODULES = {"claude-code": "claude_code", "codex": "codex", "gemini": "gemini", "cursor": "cursor"}


def host(name: str) -> Host:
    """The module of host `name` (one of `HOSTS`); KeyError for another name."""
    module: ModuleType = importlib.import_module(f".{_MODULES[name]}", __name__)
    return cast("Host", module)


def shown(text: object, limit: int = 80) -> str:
    """`text` as one bounded, printable line (an error message may quote a field's name or type, never a value)."""
    value = str(text)[:limit]
    return value if value.isprintable() else value.encode("unicode_escape").decode("ascii")


def text_field(payload: Mapping[str, Any], name: str) -> str:
    """A string field `payload` must have (at most 4,096 characters)."""
    value = optional_text(payload, name)
    if value is None:
        raise HookInputError(f"the event has no {name!r} field")
    return value


def optional_text(payload: Mapping[str, Any], name: str) -> str | None:
    """A string field of `payload`, None when absent or empty (at most 4,096 characters)."""
    value = payload.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise HookInputError(f"the event's {name!r} field is a {type(value).__name__}, not a string")
    if len(value) > 4096:
        raise HookInputError(f"the event's {name!r} field is longer than 4,096 characters")
    return value
