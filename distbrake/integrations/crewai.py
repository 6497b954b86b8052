"""CrewAI: tool-call hooks that put a brake in front of every tool call of every agent.

    from distbrake import DistributedBrake
    from distbrake.integrations.crewai import install_hooks

    brake = DistributedBrake.from_url("redis://localhost:6379/0")
    hooks = install_hooks(brake)      # global CrewAI hooks; hooks.dispose() removes them
    crew.kickoff()

CrewAI's hooks are process-wide (or scoped to a `crewai.hooks.scoped_hooks()`
block with `install_hooks(brake, scoped=True)`) and synchronous, so the brake
must be a sync one (`LoopBrake`, `DistributedBrake`; an
`AsyncDistributedBrake` raises `TypeError` here). Each tool call is checked
in a before-tool-call hook, before the tool (or CrewAI's tool cache) runs:

* session, by `scope`: `"run"` (the default) is the crew together with the
  kickoff (a run id the handle's `execution_start` hook names for each
  `crew.kickoff()`); `"conversation"` is the crew's id alone, across
  kickoffs. A tool call outside a crew (a bare `Agent.kickoff()`) has no
  crew: its session is the agent's id under both scopes.
  `session_id=callable(context)` (given CrewAI's `ToolCallHookContext`:
  `tool_name`, `tool_input`, `agent`, `task`, `crew`) overrides both;
* call id: none. CrewAI gives hooks no id for a tool call, so a call CrewAI
  runs again (a task retried after a guardrail or an error, a step replayed)
  is counted again, as a new identical call: such replays can reach the
  limit sooner;
* tool and arguments: `context.tool_name` and `context.tool_input`.

On denial the tool does not run: the hook raises `LoopBrakeAborted`, which is
both CrewAI's `HookAborted` (its one way to block a call: **any other
exception a hook raises is swallowed and the tool runs**, so a plain
`LoopBrakeError` would fail open) and a `LoopBrakeError`. CrewAI then puts
the fixed text "Tool execution blocked by hook" in the tool's place; the
after-tool-call hook replaces it with the brake's text. Then:

* `on_deny="message"` (default): the model reads the brake's text as the
  call's result, and the run goes on;
* `on_deny="raise"`: the handle's before-model-call hook raises the same
  `LoopBrakeAborted` before the next model call, so `kickoff()` raises it
  (catch it as `LoopBrakeError`).

A halt (`halt_at`: the session is halted) ends the kickoff that way whatever
`on_deny` says: the model reads the halt text as the call's result, then the
next model call of that agent and task raises `LoopBrakeHaltAborted` (a
`LoopBrakeHalt` and a `LoopBrakeAborted`) out of `kickoff()`. That hook is
the seam that stops the crew: an exception from a tool hook other than
`HookAborted` is swallowed, and a `HookAborted` from a tool hook only blocks
that tool.

A backend error the failure policy turns into an error (`"closed"`) also
blocks the call (as `HookAborted` with the error's text), never fails open.

CrewAI's own loop defences, and the brake:

* the **tool cache** (`Agent(cache=True)`, the default, and `Crew(cache=...)`)
  is read after the before-tool-call hook: a cached repeat is still counted
  (it is still the model asking the same thing again), and a denied call
  never reaches the cache;
* the **"reused the same input" guard** of the ReAct text path (models
  without native function calling) runs after the before-tool-call hook: an
  identical call right after the last one is counted by the brake, then
  answered by the guard ("I tried reusing the same input...") without
  running the tool; so on that path the second call never runs and the
  third is the brake's. The native function-calling path (the default for
  models that support it) has no such guard.

Warnings and progress-aware tools (after-tool-call hook): when an allowed
call's verdict carries a warning (the brake's `warn_at`; never in shadow
mode), the result the model reads is the tool's text, whole, then the warning
as a separate paragraph. For a progress-aware tool (`tools={"poll":
{"progress": True}}`) the tool's raw result (CrewAI's `raw_tool_result`; for a
tool that raised, CrewAI's error text) is observed after it runs, so a poller
whose result changes is never denied. For a tool with `max_failures` the
hook cannot tell a failure: CrewAI hands it a raised error as text, so the
failures of CrewAI tools are not counted (its other rules apply).
"""

from __future__ import annotations

import threading
import uuid
from contextvars import ContextVar
from typing import Any

from ..errors import DistbrakeError, LoopBrakeError, LoopBrakeHalt
from ..wrap import Brake, is_async_brake
from . import kernel
from .kernel import AdapterOptions, OnDeny, Scope, SessionIdFunction, requires, scoped_session

with requires(__name__, "CrewAI (crewai >= 1.15.19)", "crewai"):
    from crewai.hooks import HookAborted, InterceptionPoint
    from crewai.hooks.dispatch import register, register_scoped, unregister

__all__ = ["BrakeHooks", "LoopBrakeAborted", "LoopBrakeHaltAborted", "OnDeny", "install_hooks"]

# (crew id, run id) of the kickoff running in this context (set by the execution_start hook).
_run: ContextVar[tuple[str, str] | None] = ContextVar("distbrake_crewai_run", default=None)
# (handle, tool name, verdict or denial) of the call the before hook just decided, for its after hook.
_decided: ContextVar[tuple[object, str, Any] | None] = ContextVar("distbrake_crewai_decided", default=None)


class LoopBrakeAborted(LoopBrakeError, HookAborted):
    """A denial CrewAI honours: its `HookAborted` (the tool is blocked), and a `LoopBrakeError`."""

    @classmethod
    def of(cls, error: LoopBrakeError) -> LoopBrakeAborted:
        """`error` as CrewAI's abort, its text and every attribute kept; a halt stays a `LoopBrakeHalt`
        (`LoopBrakeHaltAborted`), whose `reason` stays the operator's."""
        made: type[LoopBrakeAborted] = LoopBrakeHaltAborted if isinstance(error, LoopBrakeHalt) else LoopBrakeAborted
        denial = made.__new__(made)
        denial.__dict__.update(vars(error))
        denial.args = error.args
        denial.source = None
        if not isinstance(error, LoopBrakeHalt):
            denial.reason = str(error)
        return denial


class LoopBrakeHaltAborted(LoopBrakeHalt, LoopBrakeAborted):
    """A halt as CrewAI's abort: a `LoopBrakeHalt` and a `LoopBrakeAborted` (`kickoff()` raises it)."""


def _actor(context: Any) -> tuple[int, int]:
    """The agent and task a hook context belongs to (by identity: both live through the kickoff)."""
    return id(getattr(context, "agent", None)), id(getattr(context, "task", None))


def _id(value: object) -> str | None:
    found = getattr(value, "id", None)
    return None if found is None else str(found)


class BrakeHooks(AdapterOptions):
    """The hooks `install_hooks` registered; `dispose()` removes exactly those (idempotent)."""

    on_deny: OnDeny

    def __init__(
        self, brake: Brake, on_deny: OnDeny, scope: Scope, session_id: SessionIdFunction | None, scoped: bool
    ) -> None:
        self.configure(brake, on_deny, scope, session_id)
        self.scoped = scoped
        self.active = True
        # Denials to raise before the next model call of the same agent and task (on_deny="raise"):
        # CrewAI runs tool calls in a context of their own, so a context variable would not carry them.
        self._aborts: dict[tuple[int, int], LoopBrakeAborted] = {}
        self._lock = threading.Lock()
        self._registered = [
            (InterceptionPoint.EXECUTION_START, self._begin),
            (InterceptionPoint.PRE_TOOL_CALL, self._before_tool),
            (InterceptionPoint.POST_TOOL_CALL, self._after_tool),
            (InterceptionPoint.PRE_MODEL_CALL, self._before_model),
        ]
        for point, hook in self._registered:
            (register_scoped if scoped else register)(point, hook)

    def __repr__(self) -> str:
        state = "active" if self.active else "disposed"
        return f"{type(self).__name__}({self.brake!r}, on_deny={self.on_deny!r}, scope={self.scope!r}, {state})"

    def __enter__(self) -> BrakeHooks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()

    def dispose(self) -> None:
        """Remove this handle's hooks (scoped ones end with their `scoped_hooks` block; they stop now)."""
        if not self.active:
            return
        self.active = False
        if not self.scoped:
            for point, hook in self._registered:
                unregister(point, hook)

    # -- the hooks --------------------------------------------------------------------------

    def _begin(self, context: Any) -> None:
        crew = _id(getattr(context, "crew", None))
        if self.active and crew is not None:
            _run.set((crew, uuid.uuid4().hex))

    def _session(self, context: Any) -> object:
        return self.pick_session(context, self._scoped)

    def _scoped(self, context: Any) -> object:
        crew = _id(context.crew)
        if crew is None:
            return _id(context.agent)
        run = _run.get()
        return scoped_session(self.scope, crew, run[1] if run is not None and run[0] == crew else None)

    def _before_tool(self, context: Any) -> None:
        _decided.set(None)
        if not self.active:
            return
        try:
            verdict, error = self.screen_sync(
                context.tool_name, dict(context.tool_input), session_id=self._session(context)
            )
        except DistbrakeError as failure:  # the failure policy said "closed": block, never fail open
            raise HookAborted(reason=str(failure), source=self) from failure
        if error is not None:
            denial = LoopBrakeAborted.of(error)
            _decided.set((self, context.tool_name, denial))
            if self.ends_run(error):
                with self._lock:
                    self._aborts[_actor(context)] = denial
            raise denial from error
        _decided.set((self, context.tool_name, verdict))

    def _after_tool(self, context: Any) -> str | None:
        decided = _decided.get()
        if decided is None or decided[0] is not self or decided[1] != context.tool_name:
            return None
        _decided.set(None)
        outcome = decided[2]
        if isinstance(outcome, LoopBrakeAborted):
            return str(outcome)  # in place of CrewAI's "Tool execution blocked by hook"
        warning = kernel.settle_sync(self.brake, outcome, context.raw_tool_result)
        if warning is None:
            return None
        return kernel.text_with_warning("" if context.tool_result is None else str(context.tool_result), warning)

    def _before_model(self, context: Any) -> None:
        with self._lock:
            denial = self._aborts.pop(_actor(context), None)
        if denial is not None:
            raise denial


def install_hooks(
    brake: Brake, *, on_deny: OnDeny = "message", scope: Scope = "run",
    session_id: SessionIdFunction | None = None, scoped: bool = False,
) -> BrakeHooks:
    """Register the brake's CrewAI hooks (see the module text); returns the handle that removes them.

    With `scoped=True` the hooks go into the current `crewai.hooks.scoped_hooks()`
    block (CrewAI raises `RuntimeError` outside one) and end with it.
    """
    AdapterOptions(brake, on_deny=on_deny, scope=scope, session_id=session_id)
    if is_async_brake(brake):
        raise TypeError(
            "CrewAI's hooks are synchronous: use a sync brake (DistributedBrake or LoopBrake), "
            "not an AsyncDistributedBrake"
        )
    return BrakeHooks(brake, on_deny, scope, session_id, scoped)
