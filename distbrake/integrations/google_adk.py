"""Google ADK (google-adk >= 2.13): a plugin that puts a brake in front of every tool call.

::

    from google.adk.apps import App
    from google.adk.runners import Runner
    from distbrake import DistributedBrake
    from distbrake.integrations.google_adk import LoopBrakePlugin

    brake = DistributedBrake.from_url("redis://localhost:6379/0")
    app = App(name="support", root_agent=agent, plugins=[LoopBrakePlugin(brake)])
    runner = Runner(app=app, session_service=sessions)

`before_tool_callback` checks each call after ADK has resolved the tool and
before it runs (`Runner(plugins=...)` also works but is deprecated in ADK 2.13):

* session (`scope="run"`, the default): the ADK session id
  (`tool_context.session.id`) together with the invocation id
  (`tool_context.invocation_id`: one `run_async` call, that is one user turn),
  so the same question asked in three turns is never a loop;
  `scope="conversation"`: the ADK session id alone, across turns;
  `session_id=`: a callable given the `ToolContext`, for anything else;
* call id: the model's function call id (`tool_context.function_call_id`;
  ADK makes one, `adk-<uuid>`, when the model sends none) within the
  invocation, so a call checked twice is counted once;
* tool and arguments: `tool.name` and the arguments ADK hands the tool.

On denial the tool does not run, and:

* `on_deny="message"` (default): the callback returns `{"error": <the
  brake's text>}`, which ADK uses as the tool's response: the model reads it
  and the run goes on;
* `on_deny="raise"`: `LoopBrakeError` is raised in the plugin; ADK turns any
  exception in a plugin callback into `RuntimeError("Error in plugin ...")`
  (chained from the `LoopBrakeError`, so `error.__cause__` holds it), which
  ends the run: `runner.run_async` raises it. A brake error
  (`BrakeUnavailableError` under the `closed` failure policy) ends the run
  the same way, before the tool runs.

A halt (`LoopBrakeHalt`) is raised in the plugin whatever `on_deny` says:
`runner.run_async` raises ADK's `RuntimeError`, `__cause__` the halt.

Warnings and progress-aware tools (`after_tool_callback`, which ADK runs
after the tool; `on_tool_error_callback` when it raised): an allowed call
whose verdict carries a warning (the brake's `warn_at`; none in shadow
mode) reaches the model as the tool's result, whole, plus one key:
`{**result, "loop_brake_warning": <warning>}` for a dict result, else
`{"result": <result>, "loop_brake_warning": <warning>}` (ADK sends a non-dict
result as `{"result": ...}` anyway). For a progress-aware tool
(`tools={"poll": {"progress": True}}`) the result, or the exception the tool
raised, is observed. A plugin listed before this one that answers the
callback first (ADK stops at the first non-None answer) hides the result
from it: list `LoopBrakePlugin` first.

Every brake kind works (the callbacks are async): `AsyncDistributedBrake`
is awaited, `DistributedBrake` runs in a worker thread, `LoopBrake` inline.
The plugin keeps no per-run state, so one instance serves concurrent runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..wrap import Brake
from .kernel import AdapterOptions, Handoff, OnDeny, Scope, SessionIdFunction, requires, scoped_session, settle

with requires(__name__, "Google ADK 2.13 or newer", "google-adk"):
    from google.adk.plugins import BasePlugin
    from google.adk.tools.base_tool import BaseTool
    from google.adk.tools.tool_context import ToolContext

__all__ = ["WARNING_KEY", "LoopBrakePlugin", "OnDeny"]

WARNING_KEY = "loop_brake_warning"

# The verdict of the call `before_tool_callback` allowed; `after_tool_callback`
# (or `on_tool_error_callback`) of that very call (its tool context) takes it.
_allowed: Handoff[ToolContext] = Handoff("distbrake_google_adk_allowed")


def with_warning(result: Any, warning: str) -> dict[str, Any]:
    """The tool's result, whole, with the brake's warning as one more key."""
    if isinstance(result, Mapping) and WARNING_KEY not in result:
        return {**result, WARNING_KEY: warning}
    return {"result": result, WARNING_KEY: warning}


class LoopBrakePlugin(AdapterOptions, BasePlugin):
    """Deny the Nth identical tool call in a row before the tool runs (see the module text).

    `brake` is any distbrake brake; `on_deny` is `"message"` (the refusal is the
    tool's response) or `"raise"` (ADK ends the run with `RuntimeError`);
    `scope` is `"run"` or `"conversation"`; `session_id`, a callable given the
    `ToolContext`, overrides both.
    """

    on_deny: OnDeny

    def __init__(
        self, brake: Brake, *, on_deny: OnDeny = "message", scope: Scope = "run",
        session_id: SessionIdFunction | None = None, name: str = "loop_brake",
    ) -> None:
        self.configure(brake, on_deny, scope, session_id)
        BasePlugin.__init__(self, name=name)

    def session_of(self, tool_context: ToolContext) -> object:
        """The session of a call: `session_id(tool_context)`, else by the scope (see the module text)."""
        return self.pick_session(tool_context, lambda c: scoped_session(self.scope, c.session.id, c.invocation_id))

    async def before_tool_callback(
        self, *, tool: BaseTool, tool_args: dict[str, Any], tool_context: ToolContext
    ) -> dict[str, Any] | None:
        """Check the call; the refusal (a dict) is the tool's response, None lets the tool run."""
        _allowed.clear()
        call_id = tool_context.function_call_id
        verdict, error = await self.screen(
            tool.name, tool_args, session_id=self.session_of(tool_context),
            call_id=f"{tool_context.invocation_id}/{call_id}" if call_id else None,
        )
        if error is not None:
            if self.ends_run(error):
                raise error
            return {"error": str(error)}
        _allowed.put(self.brake, tool_context, verdict)
        return None

    async def after_tool_callback(
        self,
        *,
        tool: BaseTool,
        tool_args: dict[str, Any],
        tool_context: ToolContext,
        result: dict[str, Any],
    ) -> dict[str, Any] | None:
        """Observe a progress-aware tool's result; add the warning, if any (None keeps the result)."""
        verdict = _allowed.take(self.brake, tool_context)
        if verdict is None:
            return None
        warning = await settle(self.brake, verdict, result)
        return None if warning is None else with_warning(result, warning)

    async def on_tool_error_callback(
        self,
        *,
        tool: BaseTool,
        tool_args: dict[str, Any],
        tool_context: ToolContext,
        error: Exception,
    ) -> dict[str, Any] | None:
        """Observe the exception a progress-aware tool raised; the error goes on as ADK handles it."""
        verdict = _allowed.take(self.brake, tool_context)
        if verdict is not None and isinstance(error, Exception):
            await settle(self.brake, verdict, error)
        return None
