"""Pydantic AI: a capability that puts a brake in front of every tool call.

    from pydantic_ai import Agent
    from distbrake import DistributedBrake
    from distbrake.integrations.pydantic_ai import LoopBrakeCapability

    brake = DistributedBrake.from_url("redis://localhost:6379/0")
    agent = Agent(model, tools=[search], capabilities=[LoopBrakeCapability(brake)])

Each tool call is checked in `before_tool_execute`, after its arguments are
validated and before the tool runs (output tools are not checked: Pydantic
AI does not run tool hooks for them):

* session, by `scope`: `scope="run"` (the default) keys a streak on the
  run's conversation id together with its run id (`ctx.run_id`: the `run_id=`
  given to `run`/`run_sync`, else a fresh one per run), so the same question
  in three user turns is three streaks of one call. `scope="conversation"`
  keys it on the conversation id alone (`ctx.conversation_id`: the
  `conversation_id=` given to `run`/`run_sync`, else the one on
  `message_history`, else a fresh one per run), across the runs that continue
  it; pass it explicitly for a conversation that spans workers.
  `session_id=callable(ctx)` (given the `RunContext`) overrides both when it
  returns a str;
* call id: the model's tool call id (`call.tool_call_id`) prefixed with the
  run id and run step. Every capability sees the same id for one call, so a
  call checked twice is counted once. The prefix matters for providers that
  number calls per turn (`call_0`, `search:0` on every turn): with the bare id
  each repeat would be a replay and never be denied. Capabilities sharing one
  brake object check a call only once, so that holds even when a turn's
  parallel calls interleave; two different brake objects on one Redis rely on
  the backend's replay rule, which remembers only the last call id of a
  session;
* tool and arguments: `call.tool_name` and the validated arguments (when
  those hold a value JSON cannot express, such as a `datetime`, the model's
  own JSON arguments, `call.args_as_dict()`, are hashed instead).

On denial the tool does not run, and:

* `on_deny="message"` (default): `pydantic_ai.exceptions.ToolFailed(str(error))`;
  the model sees a failed tool result with the refusal text and the run goes
  on. (Not `ModelRetry`: that would use up the tool's retry budget and end
  the run on a second denial.)
* `on_deny="raise"`: `LoopBrakeError` propagates out of `run`/`run_sync`.

A halt (`LoopBrakeHalt`) propagates out of `run`/`run_sync` whatever
`on_deny` says.

Warnings and progress-aware tools (`wrap_tool_execute`, around the tool's
whole execution lifecycle): when an allowed call's verdict carries a warning
(the brake's `warn_at`), the tool's result is returned as a
`pydantic_ai.messages.ToolReturn` whose `return_value` is the tool's own
result, untouched, and whose `content` is the warning: the model reads the
result in the tool's return part and the warning as a user-prompt part of
the same request (a tool that already returned a `ToolReturn` keeps its
return value and metadata; the warning is added to its `content`). Nothing
is added in shadow mode (`enforce=False`). For a progress-aware tool
(`tools={"poll": {"progress": True}}`) the result (a `ToolReturn`'s
`return_value`) or the exception the tool raised (`ModelRetry` and
`ToolFailed` included; not deferrals or approvals) is observed after it
runs, so a poller whose result changes is never denied.

Every brake kind works (the hook is async): `AsyncDistributedBrake` is
awaited, `DistributedBrake` runs in a worker thread, `LoopBrake` inline. For
sync code (`run_sync`) prefer `DistributedBrake`: an `AsyncDistributedBrake`
is tied to the first event loop it runs on, and `run_sync` runs its own. The
capability keeps no state of its own, so one instance may serve many agents
and concurrent runs.
"""

from __future__ import annotations

import dataclasses
from contextvars import ContextVar
from typing import Any

from ..errors import LoopBrakeError, UnsupportedArgumentsError
from ..wrap import Brake, acheck
from .kernel import (
    AdapterOptions,
    Handoff,
    OnDeny,
    requires,
    scoped_session,
    settle,
    text_with_warning,
)

with requires(__name__, "Pydantic AI 2.x", "pydantic-ai"):
    from pydantic_ai import RunContext
    from pydantic_ai.capabilities import AbstractCapability, WrapToolExecuteHandler
    from pydantic_ai.exceptions import (
        ApprovalRequired,
        CallDeferred,
        SkipToolExecution,
        ToolFailed,
    )
    from pydantic_ai.messages import ToolCallPart, ToolReturn
    from pydantic_ai.tools import ToolDefinition

__all__ = ["LoopBrakeCapability", "OnDeny"]

# (brake, call) of the last call a capability checked in this context, compared
# by identity: the ToolCallPart object names the call (its id string may repeat
# across turns with some providers), and holding both keeps their addresses
# from being reused by later objects.
_checked: ContextVar[tuple[Brake, ToolCallPart] | None] = ContextVar(
    "distbrake_pydantic_ai_checked", default=None
)

# The verdict of the call `before_tool_execute` allowed; the innermost
# `wrap_tool_execute` of that brake takes it.
_allowed: Handoff[ToolCallPart] = Handoff("distbrake_pydantic_ai_allowed")

# Not results: the tool did not finish (deferred, awaiting approval, skipped).
_CONTROL_FLOW = (SkipToolExecution, CallDeferred, ApprovalRequired)


def _with_warning(result: Any, warning: str) -> ToolReturn[Any]:
    """The tool's result for the model with the warning as extra content; the result is kept whole."""
    if not isinstance(result, ToolReturn):
        return ToolReturn(return_value=result, content=warning)
    content = result.content
    if content is None:
        added: Any = warning
    elif isinstance(content, str):
        added = text_with_warning(content, warning)
    else:
        added = [*content, warning]
    return dataclasses.replace(result, content=added)


def _observed(result: Any) -> object:
    return result.return_value if isinstance(result, ToolReturn) else result


class LoopBrakeCapability(AdapterOptions, AbstractCapability[Any]):
    """Deny the Nth identical tool call in a row before the tool runs (see the module text).

    `brake` is any distbrake brake (`LoopBrake`, `DistributedBrake`,
    `AsyncDistributedBrake`); `on_deny` is `"message"` (a `ToolFailed` the
    model reads) or `"raise"` (`LoopBrakeError` ends the run). `scope` is
    `"run"` or `"conversation"`; `session_id(ctx)` overrides it (see the
    module text).
    """

    on_deny: OnDeny

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None  # holds a live brake: not constructible from an agent spec

    async def before_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
    ) -> dict[str, Any]:
        """Check the call; raise `ToolFailed` (or `LoopBrakeError`) when it is denied."""
        last = _checked.get()
        if last is not None and last[0] is self.brake and last[1] is call:
            return args  # a capability with this brake already checked this call
        try:
            await self._check(ctx, call, args)
        except LoopBrakeError as error:
            if self.ends_run(error):
                raise
            raise ToolFailed(str(error)) from error
        _checked.set((self.brake, call))
        return args

    async def wrap_tool_execute(
        self,
        ctx: RunContext[Any],
        *,
        call: ToolCallPart,
        tool_def: ToolDefinition,
        args: dict[str, Any],
        handler: WrapToolExecuteHandler,
    ) -> Any:
        """Run the tool's lifecycle; then observe its result (progress tools) and add the warning."""
        try:
            result = await handler(args)
        except _CONTROL_FLOW:
            _allowed.take(self.brake, call)
            raise
        except Exception as raised:
            verdict = _allowed.take(self.brake, call)
            if verdict is not None:
                await settle(self.brake, verdict, raised)
            raise
        verdict = _allowed.take(self.brake, call)
        if verdict is None:
            return result
        warning = await settle(self.brake, verdict, _observed(result))
        return result if warning is None else _with_warning(result, warning)

    async def _check(self, ctx: RunContext[Any], call: ToolCallPart, args: dict[str, Any]) -> None:
        session_id = self.pick_session(ctx, lambda c: scoped_session(self.scope, c.conversation_id, c.run_id))
        # Ids some providers number per turn repeat: the run step tells the turns apart.
        call_id = f"{ctx.run_id}/{ctx.run_step}/{call.tool_call_id}" if call.tool_call_id else None
        try:
            verdict = await acheck(
                self.brake, call.tool_name, args, session_id=session_id, call_id=call_id
            )
        except UnsupportedArgumentsError:
            # Raised while hashing, before anything was counted: hash what the model sent.
            verdict = await acheck(
                self.brake, call.tool_name, call.args_as_dict(), session_id=session_id,
                call_id=call_id,
            )
        _allowed.put(self.brake, call, verdict)
