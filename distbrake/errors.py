"""The exception tree of distbrake, rooted in one base class.

    DistbrakeError
    ├── LoopBrakeError              a call was denied before it ran
    │   └── LoopBrakeHalt           ... and its session is halted: the run must stop
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
    "LoopBrakeHalt",
    "ScriptReplyError",
    "UnsupportedArgumentsError",
]

PLUGIN = "distbrake"


class DistbrakeError(Exception):
    """Base class of every error distbrake raises."""


class LoopBrakeError(DistbrakeError):
    """Raised, never returned, when a call is denied before it ran.

    `kind` names the rule: `"repeat"`, the Nth identical call in a row;
    `"cycle"` (opt-in), the call completes `cycle_repeats` repetitions of a
    sequence of `period` calls (`cycle_hash_prefixes` and `cycle_tools` name
    them, in order); the ladder's (opt-in) `"once"` (an identical call of a
    once-only tool already ran in the session, at `done_at`), `"failures"`
    (the tool failed `count` times in a row) and `"cap"` (the call is the
    tool's `count`th in the session); and `"halt"` (`LoopBrakeHalt`).
    `count` is what the refusing rule counted and `limit` its limit
    (`max_repeats` is the tool's streak limit). Only 12-character hash
    prefixes of calls are kept: never the arguments.
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
        limit: int | None = None,
        done_at: float | None = None,
    ) -> None:
        self.kind = kind  # which rule denied: "repeat", "cycle", "once", "failures", "cap" or "halt"
        self.period = period  # kind "cycle": how many calls the repeated sequence has
        self.cycle_repeats = cycle_repeats  # kind "cycle": how many times it was repeated
        self.cycle_hash_prefixes = tuple(prefix[:12] for prefix in cycle_hash_prefixes)
        self.cycle_tools = tuple(cycle_tools)
        self.tool_name = tool_name
        self.count = count
        self.max_repeats = max_repeats
        self.limit = max_repeats if limit is None else limit  # the refusing rule's limit
        self.done_at = done_at  # kind "once": Unix time the identical call ran
        self.hash_prefix = hash_prefix[:12]
        self.session_id = session_id
        # Who decided the denial (as `Verdict.decided_by`): "in-process", "redis" or "fallback"; None: not said
        self.decided_by = decided_by
        super().__init__(self._message())

    def _message(self) -> str:
        tool = _shown(self.tool_name)
        advice = "Change the arguments, call a different tool, or stop."
        if self.kind == "cycle":
            tools = list(dict.fromkeys(self.cycle_tools or (self.tool_name,)))
            named = ", ".join(f'"{_shown(name)}"' for name in tools)
            calls = ", ".join(f"{prefix}\u2026" for prefix in self.cycle_hash_prefixes)
            return (
                f"loop brake: {'tool' if len(tools) == 1 else 'tools'} {named} called in a cycle of "
                f"{self.period} calls repeated {self.cycle_repeats} times in a row (calls {calls}); "
                f"the call was denied before it ran. {advice}"
            )
        if self.kind == "once":
            return (
                f'loop brake: tool "{tool}" already ran with these arguments in this session (call '
                f"{self.hash_prefix}\u2026, at {_utc(self.done_at)}) and may run once only; the call was denied "
                "before it ran. Do not repeat it: go on with the result you had, or stop."
            )
        if self.kind == "failures":
            return (
                f'loop brake: tool "{tool}" failed {self.count} times in a row in this session (limit '
                f"{self.limit}); the call was denied before it ran. Stop calling it: use a different tool, "
                "or stop."
            )
        if self.kind == "cap":
            return (
                f'loop brake: tool "{tool}" reached its limit of {self.limit} calls in this session; the call '
                "was denied before it ran. Go on without it, or stop."
            )
        return (
            f'loop brake: tool "{tool}" called {self.count} times in a row '
            f"with identical arguments (call {self.hash_prefix}\u2026, limit "
            f"{self.max_repeats}); the call was denied before it ran. {advice}"
        )

    def _args(self) -> tuple[Any, ...]:
        return (
            self.tool_name, self.count, self.max_repeats, self.hash_prefix, self.session_id, self.kind,
            self.period, self.cycle_repeats, self.cycle_hash_prefixes, self.cycle_tools, self.decided_by,
            self.limit, self.done_at,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self._args())

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(tool_name={self.tool_name!r}, count={self.count}, "
            f"max_repeats={self.max_repeats}, hash_prefix={self.hash_prefix!r}, "
            f"session_id={self.session_id!r}, kind={self.kind!r}"
            + (f", period={self.period!r}, cycle_repeats={self.cycle_repeats!r}" if self.kind == "cycle" else "")
            + (f", limit={self.limit!r}" if self.kind in ("failures", "cap", "halt") else "")
            + ")"
        )


class LoopBrakeHalt(LoopBrakeError):
    """The session is halted: the run must stop (raised for the halting call and every later check of the
    session, any tool, on any worker, until the halt expires or an operator lifts it).

    `halt_rule` says why: `"repeat"` (a streak reached `halt_at`: `count`,
    `limit`), `"cycle"` (a cycle repeated `limit` times), `"block"` (an
    operator blocked the session) or `"kill"` (an operator stopped every
    session: `distbrake block --all`); `halted_by` is `"rule"` or
    `"operator"`, `since` the Unix time it began, `who` and `reason` the
    operator's (bounded, never arguments).
    """

    def __init__(
        self, *call: Any, halt_rule: str = "repeat", since: float | None = None, who: str = "", reason: str = "",
        **more: Any,
    ) -> None:
        """`call`: tool_name, count, max_repeats, hash_prefix, session_id (as `LoopBrakeError`'s); `more`: its
        other arguments, by keyword (`kind` is always "halt")."""
        self.halt_rule = halt_rule
        self.halted_by = "operator" if halt_rule in ("block", "kill") else "rule"
        self.since = since
        self.who = who
        self.reason = reason
        super().__init__(*call, **{**more, "kind": "halt"})

    def __reduce__(self) -> tuple[Any, ...]:
        return (_halt, (type(self), self._args(), self.halt_rule, self.since, self.who, self.reason))

    def _message(self) -> str:
        session = _shown(self.session_id, 128, escape=True)
        if self.halt_rule == "repeat":
            why = (
                f'tool "{_shown(self.tool_name)}" was called {self.count} times in a row with identical '
                f"arguments (call {self.hash_prefix}\u2026, halt_at {self.limit}) after its calls were denied"
            )
        elif self.halt_rule == "cycle":
            why = f"its calls kept repeating one cycle ({self.limit} times) after they were denied"
        else:
            by = f" by {_shown(self.who, escape=True)}" if self.who else ""
            what = "every session was stopped" if self.halt_rule == "kill" else "an operator blocked it"
            why = f"{what}{by}{': ' + _shown(self.reason, 200, escape=True) if self.reason else ''}"
        lift = "distbrake unblock --all" if self.halt_rule == "kill" else "distbrake unblock"
        return (
            f'loop brake: session "{session}" is halted ({why}, since {_utc(self.since)}); the run was stopped. '
            "No further tool call of this session will run until the halt expires or an operator lifts it "
            f"({lift}). Stop now and report to the user."
        )



def _halt(
    kind: type[LoopBrakeHalt], args: tuple[Any, ...], halt_rule: str, since: float | None, who: str, reason: str
) -> LoopBrakeHalt:
    """A `LoopBrakeHalt` (or subclass `kind`) from its pickled state (`__reduce__`)."""
    names = ("kind", "period", "cycle_repeats", "cycle_hash_prefixes", "cycle_tools", "decided_by", "limit", "done_at")
    more = dict(zip(names, args[5:], strict=True))
    del more["kind"]
    return kind(*args[:5], halt_rule=halt_rule, since=since, who=who, reason=reason, **more)


def _utc(when: float | None) -> str:
    """A Unix time as the error texts show it (UTC, to the second)."""
    if when is None:
        return "an unknown time"
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))


def _shown(text: str, limit: int = 64, escape: bool = False) -> str:
    """Outside text as an error shows it: at most `limit` characters (`escape`: control characters escaped)."""
    if escape and not text.isprintable():
        text = text.encode("unicode_escape").decode("ascii")
    return text if len(text) <= limit else text[:limit] + "\u2026"


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
