"""Strands Agents: a hook provider that puts a brake in front of every tool call.

    from strands import Agent
    from distbrake import DistributedBrake
    from distbrake.integrations.strands import LoopBrakeHook

    brake = DistributedBrake.from_url("redis://localhost:6379/0")
    agent = Agent(model=model, tools=[search], hooks=[LoopBrakeHook(brake)])

Each tool call is checked in `BeforeToolCallEvent`, before the tool runs:

* session, by `scope`: `"run"` (the default) is the conversation together
  with the invocation (one `agent(...)` / `invoke_async` / `stream_async`
  call, named by a run id the hook puts in the invocation state at
  `BeforeInvocationEvent`, key `distbrake_run_id`); `"conversation"` is the
  conversation alone, across invocations. The conversation is
  `invocation_state["session_id"]` (`agent("...", invocation_state={
  "session_id": ...})`), else the agent's id (`Agent(agent_id=...)`,
  `"default"` unless you name it). `session_id=callable(event)` (given the
  `BeforeToolCallEvent`) overrides both;
* call id: the model's `tool_use["toolUseId"]`, qualified by the run and the
  event-loop cycle (`invocation_state["event_loop_cycle_id"]`), so a provider
  that numbers calls per turn is still counted every turn;
* tool and arguments: `tool_use["name"]` and `tool_use["input"]`.

On denial the tool does not run, and:

* `on_deny="message"` (default): `event.cancel_tool` is the brake's text;
  Strands sends the model a tool result with `status: "error"` and that text,
  and the run goes on;
* `on_deny="raise"`: the hook raises `LoopBrakeError`, which ends the
  invocation as Strands ends a failed event-loop cycle: the agent call raises
  `strands.types.exceptions.EventLoopException`, whose `__cause__` is the
  `LoopBrakeError`.

A halt (`LoopBrakeHalt`) is raised whatever `on_deny` says: the invocation
ends with that `EventLoopException`. A tool error (an exception, a result with
`status: "error"`) is a failed call for a tool with `max_failures`.

Warnings and progress-aware tools (`AfterToolCallEvent`): when an allowed
call's verdict carries a warning (the brake's `warn_at`; never in shadow
mode), the tool result gets one more `{"text": warning}` block after its own
content, which is kept whole (status and id untouched). For a progress-aware
tool (`tools={"poll": {"progress": True}}`) the result's status and content
(never its id), or the exception the tool raised, is observed after it runs,
so a poller whose result changes is never denied.

The callbacks are async: an `AsyncDistributedBrake` is awaited, a
`DistributedBrake` runs in a worker thread, a `LoopBrake` inline. A sync
`agent(...)` runs the agent on an event loop of its own each time: prefer
`DistributedBrake` there (an `AsyncDistributedBrake` belongs to one loop).
"""

from __future__ import annotations

import uuid
from typing import Any

from ..wrap import Brake
from .kernel import AdapterOptions, OnDeny, Pending, Scope, SessionIdFunction, requires, scoped_session, settle

with requires(__name__, "Strands Agents (strands-agents >= 1.62)", "strands"):
    from strands.hooks import (
        AfterToolCallEvent,
        BeforeInvocationEvent,
        BeforeToolCallEvent,
        HookProvider,
        HookRegistry,
    )

__all__ = ["RUN_ID_KEY", "LoopBrakeHook", "OnDeny"]

RUN_ID_KEY = "distbrake_run_id"  # in the invocation state: the run the hook named


def _run_id(state: dict[str, Any]) -> str:
    run = state.get(RUN_ID_KEY)
    if not isinstance(run, str):  # an invocation that began before the hook was registered
        run = state[RUN_ID_KEY] = uuid.uuid4().hex
    return run


class LoopBrakeHook(AdapterOptions, HookProvider):
    """Deny the Nth identical tool call in a row before the tool runs (see the module text).

    `brake` is any distbrake brake; `on_deny` is `"message"` (the refusal is an
    error tool result the model reads) or `"raise"` (`LoopBrakeError` ends
    the call, as the cause of Strands' `EventLoopException`); `scope` is `"run"` or `"conversation"`; `session_id`, a
    callable given the `BeforeToolCallEvent`, overrides the scope.
    """

    on_deny: OnDeny

    def configure(self, brake: Brake, on_deny: str, scope: Scope, session_id: SessionIdFunction | None) -> None:
        AdapterOptions.configure(self, brake, on_deny, scope, session_id)
        # Allowed calls' verdicts, by call id, until their AfterToolCallEvent takes them.
        self._allowed = Pending()

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeInvocationEvent, self._begin)
        registry.add_callback(BeforeToolCallEvent, self._before_tool)
        registry.add_callback(AfterToolCallEvent, self._after_tool)

    def _begin(self, event: BeforeInvocationEvent) -> None:
        event.invocation_state[RUN_ID_KEY] = uuid.uuid4().hex  # a fresh run for every invocation

    def _call_id(self, tool_use: Any, state: dict[str, Any]) -> str | None:
        tool_use_id = tool_use.get("toolUseId")
        if not tool_use_id:
            return None
        return f"{_run_id(state)}/{state.get('event_loop_cycle_id', '')}/{tool_use_id}"

    def _session(self, event: BeforeToolCallEvent) -> object:
        return self.pick_session(event, self._scoped)

    def _scoped(self, event: BeforeToolCallEvent) -> str | None:
        state = event.invocation_state
        conversation = state.get("session_id") or getattr(event.agent, "agent_id", None)
        return scoped_session(self.scope, conversation, _run_id(state))

    async def _before_tool(self, event: BeforeToolCallEvent) -> None:
        if event.cancel_tool:
            return  # another hook refused the call already: it will not run
        tool_use = event.tool_use
        call_id = self._call_id(tool_use, event.invocation_state)
        verdict, error = await self.screen(
            tool_use["name"], tool_use.get("input"), session_id=self._session(event), call_id=call_id,
        )
        if error is not None:
            if self.ends_run(error):
                raise error
            event.cancel_tool = str(error)
            return
        self._allowed.keep(call_id, verdict)

    async def _after_tool(self, event: AfterToolCallEvent) -> None:
        call_id = self._call_id(event.tool_use, event.invocation_state)
        if call_id is None:
            return
        verdict = self._allowed.take(call_id)
        if verdict is None or event.cancel_message is not None:
            return
        result = event.result
        observed = event.exception if event.exception is not None else {
            "status": result.get("status"), "content": result.get("content"),
        }
        warning = await settle(self.brake, verdict, observed, result.get("status") == "error")
        if warning is not None:
            event.result = {**result, "content": [*result.get("content", []), {"text": warning}]}
