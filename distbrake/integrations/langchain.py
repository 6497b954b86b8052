"""LangChain 1.x agents and plain LangGraph: a brake in front of every tool call.

    from langchain.agents import create_agent
    from distbrake import DistributedBrake
    from distbrake.integrations.langchain import LoopBrakeMiddleware

    brake = DistributedBrake.from_url("redis://localhost:6379/0")
    agent = create_agent(model, tools, middleware=[LoopBrakeMiddleware(brake)])

Each tool call the model makes is checked before the tool runs:

* session: the LangGraph thread id (`config={"configurable": {"thread_id": ...}}`,
  read from `request.runtime.execution_info`); without one, the session bound
  with `distbrake.bind_session`, else `"default"`;
* call id: the model's tool call id (`tool_call["id"]`), so a call that passes
  two braked layers (two middlewares, a middleware and a `ToolNode` wrapper,
  two brake objects on one Redis) is counted once;
* tool and arguments: `tool_call["name"]` and `tool_call["args"]`.

On denial the tool does not run, and:

* `on_deny="message"` (default): the call's result is
  `ToolMessage(str(error), status="error")`; the model reads the refusal and
  the run goes on;
* `on_deny="raise"`: `LoopBrakeError` propagates and aborts the run (with
  `create_agent`, or a `ToolNode` with the default `handle_tool_errors`; a
  `ToolNode(handle_tool_errors=True)` turns it into an error message instead).

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

from collections.abc import Awaitable, Callable
from typing import Any, Literal, get_args

try:
    from langchain.agents.middleware import AgentMiddleware, AgentState
    from langchain_core.messages import ToolMessage
    from langgraph.prebuilt.tool_node import (
        AsyncToolCallWrapper,
        ToolCallRequest,
        ToolCallWrapper,
    )
    from langgraph.types import Command
except ImportError as error:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "distbrake.integrations.langchain needs LangChain 1.x and LangGraph: "
        'pip install "distbrake[langchain]"'
    ) from error

from ..errors import ConfigurationError, LoopBrakeError
from ..wrap import Brake, acheck, is_async_brake

__all__ = ["LoopBrakeMiddleware", "OnDeny", "tool_call_wrappers"]

OnDeny = Literal["message", "raise"]
_ON_DENY: tuple[str, ...] = get_args(OnDeny)

ToolResult = ToolMessage | Command[Any]


def _identify(request: ToolCallRequest) -> tuple[str, Any, str | None, str | None]:
    """(tool name, arguments, session id, call id) of a tool call request."""
    call = request.tool_call
    call_id = call.get("id")
    return call["name"], call.get("args", {}), _thread_id(request), None


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


class LoopBrakeMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Deny the Nth identical tool call in a row before the tool runs (see the module text).

    `brake` is any distbrake brake: `LoopBrake`, `DistributedBrake` or
    `AsyncDistributedBrake` (async runs only). `on_deny` is `"message"` or
    `"raise"`. `name` distinguishes two instances in one agent (LangChain
    refuses two middlewares of the same name).
    """

    def __init__(
        self, brake: Brake, *, on_deny: OnDeny = "message", name: str | None = None
    ) -> None:
        super().__init__()
        if on_deny not in _ON_DENY:
            raise ConfigurationError(
                f"on_deny must be one of {', '.join(map(repr, _ON_DENY))}, not {on_deny!r}"
            )
        if not callable(getattr(brake, "check", None)):
            raise TypeError(f"brake must have a check method, not {type(brake).__name__}")
        self.brake = brake
        self.on_deny: OnDeny = on_deny
        self._name = name

    @property
    def name(self) -> str:
        return self._name if self._name is not None else type(self).__name__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.brake!r}, on_deny={self.on_deny!r})"

    def _deny(self, request: ToolCallRequest, error: LoopBrakeError) -> ToolMessage:
        """The error `ToolMessage` the model reads instead of the tool's result."""
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
        tool, args, session_id, call_id = _identify(request)
        try:
            self.brake.check(tool, args, session_id=session_id, call_id=call_id)
        except LoopBrakeError as error:
            if self.on_deny == "raise":
                raise
            return self._deny(request, error)
        return handler(request)

    async def awrap_tool_call(
        self,
        request: ToolCallRequest,
        handler: Callable[[ToolCallRequest], Awaitable[ToolResult]],
    ) -> ToolResult:
        """Check the call with the brake (never blocking the loop); await `handler` if allowed."""
        tool, args, session_id, call_id = _identify(request)
        try:
            await acheck(self.brake, tool, args, session_id=session_id, call_id=call_id)
        except LoopBrakeError as error:
            if self.on_deny == "raise":
                raise
            return self._deny(request, error)
        return await handler(request)


def tool_call_wrappers(
    brake: Brake, *, on_deny: OnDeny = "message"
) -> tuple[ToolCallWrapper, AsyncToolCallWrapper]:
    """`(wrap, awrap)` for `ToolNode(tools, wrap_tool_call=wrap, awrap_tool_call=awrap)`."""
    middleware = LoopBrakeMiddleware(brake, on_deny=on_deny)
    return middleware.wrap_tool_call, middleware.awrap_tool_call
