"""LangChain 1.x agents and plain LangGraph: a brake in front of every tool call.

    from langchain.agents import create_agent
    from distbrake import DistributedBrake
    from distbrake.integrations.langchain import LoopBrakeMiddleware

    brake = DistributedBrake.from_url("redis://localhost:6379/0")
    agent = create_agent(model, tools, middleware=[LoopBrakeMiddleware(brake)])

Each tool call the model makes is checked before the tool runs:

* session, by `scope`: `scope="run"` (the default) keys a streak on the
  thread id (`config={"configurable": {"thread_id": ...}}`, read from
  `request.runtime.execution_info`) together with the run: the invocation's
  `run_id` (`execution_info.run_id`: the `run_id` of the invoke config, when
  one is passed), else the id of the latest user message (`HumanMessage`) in
  the state, the turn being answered (it is checkpointed, so a run resumed
  after an interrupt, on any worker sharing the checkpointer, keeps its
  streak). The same question in three user turns is then three streaks of
  one call.
  `scope="conversation"` keys it on the thread id alone, across turns.
  Without a thread, a session bound with `distbrake.bind_session` stands for
  it (with none, `"run/<run>"`, or `"default"` under `scope="conversation"`).
  `session_id=callable(request)` (given the `ToolCallRequest`) overrides both
  when it returns a str;
* call id: the model's tool call id (`tool_call["id"]`) prefixed with the
  LangGraph task running it (`execution_info.task_id`). Every layer of one
  call sees the same id, so a call that passes two braked layers is counted
  once. The prefix matters for providers that number calls per turn
  (`call_0`, `search:0` on every turn): with the bare id each repeat would be
  a replay and never be denied. Layers sharing one brake object check a call
  only once (the outer layer marks it for the inner ones), so that holds even
  when a turn's parallel calls interleave; two different brake objects on one
  Redis rely on the backend's replay rule, which remembers only the last call
  id of a session;
* tool and arguments: `tool_call["name"]` and `tool_call["args"]`.

On denial the tool does not run, and:

* `on_deny="message"` (default): the call's result is
  `ToolMessage(str(error), status="error")`; the model reads the refusal and
  the run goes on;
* `on_deny="raise"`: `LoopBrakeError` propagates and aborts the run (with
  `create_agent`, or a `ToolNode` with the default `handle_tool_errors`; a
  `ToolNode(handle_tool_errors=True)` turns it into an error message instead).

A halt (`LoopBrakeHalt`: the session is halted, by `halt_at` or an operator)
is raised whatever `on_deny` says, so it reaches `invoke`/`ainvoke`'s caller.

Warnings and progress-aware tools: when an allowed call's verdict carries a
warning (the brake's `warn_at`), the `ToolMessage` the tool produced reaches
the model with the warning added: appended as a separate paragraph to a str
content, or as one more `{"type": "text"}` block to a list content; its
status, artifact, name and ids are kept (a `Command` result gets it on the
`ToolMessage` of this call in its update). Nothing is added in shadow mode
(`enforce=False`). For a progress-aware tool (`tools={"poll": {"progress":
True}}`) the result the tool produced (the `ToolMessage`'s content and
status, never its ids) or the exception it raised is observed after it runs,
so a poller whose result changes is never denied. For a tool with
`max_failures` the same observation counts failures: an exception, or an
error `ToolMessage` (`status="error"`, also inside a `Command`), is a failed
call.

Sync (`invoke`, `stream`) and async (`ainvoke`, `astream`) runs are both
supported. An `AsyncDistributedBrake` works in async runs only: a sync run
raises `TypeError` before the tool runs (its Redis connections belong to the
event loop that made them, so it cannot be driven from a worker thread). Use
`DistributedBrake` for code that runs both ways: async runs check it in a
worker thread, so the event loop never blocks on Redis.

Plain LangGraph: `ToolNode(tools, wrap_tool_call=wrap, awrap_tool_call=awrap)`
with `wrap, awrap = tool_call_wrappers(brake)`. Pass both: a `ToolNode` with
only `awrap_tool_call` runs sync invocations without any wrapper at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from ..errors import LoopBrakeError
from ..wrap import Brake, is_async_brake
from . import kernel
from .kernel import AdapterOptions, OnDeny, Scope, SessionIdFunction, requires, scoped_session

with requires(__name__, "LangChain 1.x and LangGraph", "langchain"):
    from langchain.agents.middleware import AgentMiddleware, AgentState
    from langchain_core.messages import HumanMessage, ToolMessage
    from langgraph.prebuilt.tool_node import (
        AsyncToolCallWrapper,
        ToolCallRequest,
        ToolCallWrapper,
    )
    from langgraph.types import Command

__all__ = ["LoopBrakeMiddleware", "OnDeny", "tool_call_wrappers"]

ToolResult = ToolMessage | Command[Any]

# (id(brake), tool call id) of the call an outer layer checked and is running now.
_running: ContextVar[tuple[int, str] | None] = ContextVar(
    "distbrake_langchain_running", default=None
)


def _run_id(request: ToolCallRequest) -> str | None:
    """The invocation's run id, else the id of the latest user message (the turn being answered)."""
    info = getattr(getattr(request, "runtime", None), "execution_info", None)
    run = getattr(info, "run_id", None)
    if run:
        return str(run)
    state = request.state
    messages = state.get("messages") if isinstance(state, dict) else getattr(state, "messages", state)
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            return message.id or None
    return None


def _call_id(request: ToolCallRequest) -> str | None:
    """The model's tool call id, prefixed with the id of the LangGraph task running it.

    Providers that number calls per turn repeat ids across turns; the task id
    (one per turn and call, the same for every layer of that call) keeps them apart.
    """
    tool_call_id = request.tool_call.get("id")
    if not tool_call_id:
        return None
    info = getattr(getattr(request, "runtime", None), "execution_info", None)
    task_id = getattr(info, "task_id", None)
    return f"{task_id}/{tool_call_id}" if task_id else str(tool_call_id)


def _thread_id(request: ToolCallRequest) -> str | None:
    """The run's thread id; None (the brake's default session) when there is none."""
    runtime = getattr(request, "runtime", None)  # None outside a graph
    info = getattr(runtime, "execution_info", None)
    thread: object = getattr(info, "thread_id", None)
    if thread is None:
        config = getattr(runtime, "config", None)
        configurable = config.get("configurable") if isinstance(config, dict) else None
        if isinstance(configurable, dict):
            thread = configurable.get("thread_id")
    if thread is None or thread == "":
        return None
    return thread if isinstance(thread, str) else str(thread)


def _observed(result: object) -> object:
    """What of a tool's result is observed for a progress-aware tool (never the call's ids)."""
    if isinstance(result, ToolMessage):
        return {"content": result.content, "status": result.status}
    if isinstance(result, Command) and isinstance(result.update, dict):
        messages = result.update.get("messages")
        if isinstance(messages, list):
            return [_observed(m) for m in messages if isinstance(m, ToolMessage)]
    return result


def _tool_error(result: object) -> bool:
    """Whether a tool's result is LangChain's tool error (a `ToolMessage` with `status="error"`, also
    inside a `Command`): a failed call for a tool with `max_failures`."""
    if isinstance(result, ToolMessage):
        return result.status == "error"
    if isinstance(result, Command) and isinstance(result.update, dict):
        messages = result.update.get("messages")
        return isinstance(messages, list) and any(_tool_error(m) for m in messages if isinstance(m, ToolMessage))
    return False


def _warned_message(message: ToolMessage, warning: str) -> ToolMessage:
    """`message` with `warning` added to its content; everything else kept."""
    content = message.content
    if isinstance(content, str):
        new: Any = kernel.text_with_warning(content, warning)
    else:
        new = [*content, {"type": "text", "text": warning}]
    return message.model_copy(update={"content": new})


def _with_warning(result: ToolResult, warning: str | None, tool_call_id: str | None) -> ToolResult:
    """The tool's result as the model should read it: with the brake's warning, if any."""
    if warning is None:
        return result
    if isinstance(result, ToolMessage):
        return _warned_message(result, warning)
    update = result.update
    if isinstance(update, dict) and isinstance(update.get("messages"), list):
        messages = list(update["messages"])
        for i, message in enumerate(messages):
            if isinstance(message, ToolMessage) and (
                tool_call_id is None or message.tool_call_id == tool_call_id
            ):
                messages[i] = _warned_message(message, warning)
                return dataclasses.replace(result, update={**update, "messages": messages})
    return result


class LoopBrakeMiddleware(AdapterOptions, AgentMiddleware[AgentState[Any], Any, Any]):
    """Deny the Nth identical tool call in a row before the tool runs (see the module text).

    `brake` is any distbrake brake: `LoopBrake`, `DistributedBrake` or
    `AsyncDistributedBrake` (async runs only). `on_deny` is `"message"` or
    `"raise"`. `scope` is `"run"` or `"conversation"`; `session_id(request)`
    overrides it (see the module text). `name` distinguishes two instances in
    one agent (LangChain refuses two middlewares of the same name).
    """

    on_deny: OnDeny

    def __init__(
        self, brake: Brake, *, on_deny: OnDeny = "message", scope: Scope = "run",
        session_id: SessionIdFunction | None = None, name: str | None = None,
    ) -> None:
        self.configure(brake, on_deny, scope, session_id)
        self._name = name

    @property
    def name(self) -> str:
        return self._name if self._name is not None else type(self).__name__

    def _identify(self, request: ToolCallRequest) -> tuple[str, Any, object, str | None, tuple[int, str] | None]:
        """(tool name, arguments, session id, call id, running mark) of a tool call request."""
        call = request.tool_call
        session = self.pick_session(request, lambda r: scoped_session(self.scope, _thread_id(r), _run_id(r)))
        call_id = _call_id(request)
        mark = None if call_id is None else (id(self.brake), call_id)
        return call["name"], call.get("args", {}), session, call_id, mark

    def _deny(self, request: ToolCallRequest, error: LoopBrakeError) -> ToolMessage:
        """The error `ToolMessage` the model reads instead of the tool's result (or the raise)."""
        if self.ends_run(error):
            raise error
        call = request.tool_call
        return ToolMessage(
            content=str(error), tool_call_id=call.get("id") or "", name=call["name"],
            status="error",
        )

    def wrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], ToolResult],
    ) -> ToolResult:
        """Check the call with the brake; run `handler` only when it is allowed."""
        if is_async_brake(self.brake):
            raise TypeError(
                "LoopBrakeMiddleware: the brake is an AsyncDistributedBrake, which works in "
                "async runs (ainvoke, astream) only; use DistributedBrake for sync runs"
            )
        tool, args, session_id, call_id, mark = self._identify(request)
        if mark is not None and _running.get() == mark:
            return handler(request)  # an outer layer with this brake checked it
        verdict, error = self.screen_sync(tool, args, session_id=session_id, call_id=call_id)
        if error is not None:
            return self._deny(request, error)
        token = _running.set(mark)
        try:
            result = kernel.run_allowed_sync(
                self.brake, verdict, lambda: handler(request), _observed, failed=_tool_error
            )
        finally:
            _running.reset(token)
        return _with_warning(result, kernel.warning_of(verdict), request.tool_call.get("id"))

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        """Check the call with the brake (never blocking the loop); await `handler` if allowed."""
        tool, args, session_id, call_id, mark = self._identify(request)
        if mark is not None and _running.get() == mark:
            return await handler(request)  # an outer layer with this brake checked it
        verdict, error = await self.screen(tool, args, session_id=session_id, call_id=call_id)
        if error is not None:
            return self._deny(request, error)
        token = _running.set(mark)
        try:
            result = await kernel.run_allowed(
                self.brake, verdict, lambda: handler(request), _observed, failed=_tool_error
            )
        finally:
            _running.reset(token)
        return _with_warning(result, kernel.warning_of(verdict), request.tool_call.get("id"))


def tool_call_wrappers(
    brake: Brake,
    *,
    on_deny: OnDeny = "message",
    scope: Scope = "run",
    session_id: SessionIdFunction | None = None,
) -> tuple[ToolCallWrapper, AsyncToolCallWrapper]:
    """`(wrap, awrap)` for `ToolNode(tools, wrap_tool_call=wrap, awrap_tool_call=awrap)`."""
    middleware = LoopBrakeMiddleware(brake, on_deny=on_deny, scope=scope, session_id=session_id)
    return middleware.wrap_tool_call, middleware.awrap_tool_call
