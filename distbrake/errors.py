"""The exception tree of distbrake, rooted in one base class.

    DistbrakeError
    ├── LoopBrakeError              a call was denied before it ran
    ├── BrakeUnavailableError       the backend failed and the policy is "closed"
    ├── ConfigurationError (ValueError)
    │   ├── InvalidMaxRepeatsError  max_repeats (or a per-tool limit) is unusable
    │   └── InvalidURLError         a backend URL that cannot be used
    ├── MissingSessionError (ValueError)
    │                               a check names no session and require_session is on
    ├── UnsupportedArgumentsError (TypeError)
    │                               arguments JSON cannot express
    ├── EventLoopError (RuntimeError)
    │                               an async brake used from a second event loop that it cannot move to
    └── ScriptReplyError            the Redis script answered in an unknown way

No exception built here ever holds a tool's arguments or a password: the
arguments are the part of a call most likely to carry paths, queries or
credentials, and errors get logged and shown to models.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BrakeUnavailableError",
    "ConfigurationError",
    "DistbrakeError",
    "EventLoopError",
    "InvalidMaxRepeatsError",
    "InvalidURLError",
    "LoopBrakeError",
    "ScriptReplyError",
    "UnsupportedArgumentsError",
]

PLUGIN = "distbrake"


class DistbrakeError(Exception):
    """Base class of every error distbrake raises."""


class LoopBrakeError(DistbrakeError):
    """Raised, never returned, when a call is denied before it ran.

    `kind` names the rule: `"repeat"`, the Nth identical call in a row, or
    `"cycle"` (opt-in), the call completes `cycle_repeats` repetitions of a
    sequence of `period` calls (`cycle_hash_prefixes` and `cycle_tools` name
    them, in order). Only 12-character hash prefixes of calls are kept:
    never the arguments.
    """

    code = "LOOP_BRAKE"
    plugin = PLUGIN

    def __init__(
        self,
        tool_name: str,
        count: int,
        max_repeats: int,
        hash_prefix: str,
        session_id: str,
        kind: str = "repeat",
        period: int | None = None,
        cycle_repeats: int | None = None,
        cycle_hash_prefixes: tuple[str, ...] = (),
        cycle_tools: tuple[str, ...] = (),
        decided_by: str | None = None,
    ) -> None:
        self.kind = kind  # which rule denied: "repeat" (the Nth identical call in a row) or "cycle"
        self.period = period  # kind "cycle": how many calls the repeated sequence has
        self.cycle_repeats = cycle_repeats  # kind "cycle": how many times it was repeated
        self.cycle_hash_prefixes = tuple(prefix[:12] for prefix in cycle_hash_prefixes)
        self.cycle_tools = tuple(cycle_tools)
        self.tool_name = tool_name
        self.count = count
        self.max_repeats = max_repeats
        self.hash_prefix = hash_prefix[:12]
        self.session_id = session_id
        # Who decided the denial (as `Verdict.decided_by`): "in-process", "redis" or "fallback"; None: not said
        self.decided_by = decided_by
        super().__init__(self._message())

    def _message(self) -> str:
        tool = _shown(self.tool_name)
        if self.kind == "cycle":
            tools = list(dict.fromkeys(self.cycle_tools or (self.tool_name,)))
            named = ", ".join(f'"{_shown(name)}"' for name in tools)
            calls = ", ".join(f"{prefix}\u2026" for prefix in self.cycle_hash_prefixes)
            return (
                f"loop brake: {'tool' if len(tools) == 1 else 'tools'} {named} called in a cycle of "
                f"{self.period} calls repeated {self.cycle_repeats} times in a row (calls {calls}); "
                "the call was denied before it ran. Change the arguments, call a different tool, or stop."
            )
        return (
            f'loop brake: tool "{tool}" called {self.count} times in a row '
            f"with identical arguments (call {self.hash_prefix}\u2026, limit "
            f"{self.max_repeats}); the call was denied before it ran. Change the "
            "arguments, call a different tool, or stop."
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (
                self.tool_name, self.count, self.max_repeats, self.hash_prefix, self.session_id, self.kind,
                self.period, self.cycle_repeats, self.cycle_hash_prefixes, self.cycle_tools, self.decided_by,
            ),
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(tool_name={self.tool_name!r}, count={self.count}, "
            f"max_repeats={self.max_repeats}, hash_prefix={self.hash_prefix!r}, "
            f"session_id={self.session_id!r}, kind={self.kind!r}"
            + (f", period={self.period!r}, cycle_repeats={self.cycle_repeats!r}" if self.kind == "cycle" else "")
            + ")"
        )


def _shown(tool: str) -> str:
    return tool if len(tool) <= 64 else tool[:64] + "\u2026"


class BrakeUnavailableError(DistbrakeError):
    """The brake's backend did not answer and the failure policy is "closed".

    The message names the backend by its redacted URL and the failure class,
    never a password or a call's arguments.
    """


class ConfigurationError(DistbrakeError, ValueError):
    """A configuration value that cannot be used; the message names its source."""


class InvalidMaxRepeatsError(ConfigurationError):
    """`max_repeats` (or a per-tool limit) is not an integer >= 1."""


class InvalidURLError(ConfigurationError):
    """A backend URL with an unknown scheme or unusable parts (never echoed with its password)."""


class MissingSessionError(DistbrakeError, ValueError):
    """A check named no session (no session_id, bound session or context id) and `require_session` is on."""


class UnsupportedArgumentsError(DistbrakeError, TypeError):
    """Arguments contain a value JSON cannot express; names the type, never the value."""


class EventLoopError(DistbrakeError, RuntimeError):
    """An `AsyncDistributedBrake` was used from an event loop while its connections belong to another.

    The brake moves by itself to a new loop once the old one is closed (each
    `asyncio.run` in turn); this is raised only when it cannot: the old loop
    is still open (idle, or running in another thread), or a Redis Cluster
    client the caller built still holds a closed loop's connections. The
    message says what to do.
    """


class ScriptReplyError(DistbrakeError):
    """The brake's Lua script answered with something this version does not understand."""
