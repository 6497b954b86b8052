"""LlamaIndex (llama-index-core >= 0.14): braked copies of `FunctionTool`s.

::

    from llama_index.core.agent.workflow import FunctionAgent
    from distbrake import DistributedBrake
    from distbrake.integrations.llamaindex import guard_tools

    brake = DistributedBrake.from_url("redis://localhost:6379/0")
    agent = FunctionAgent(tools=guard_tools(brake, [search_tool]), llm=llm)

`guard_tools(brake, tools)` returns one `BrakedFunctionTool` per
`FunctionTool` (a subclass: same function, metadata, callbacks and partial
params; the originals are untouched), for any agent or workflow that calls
tools (`FunctionAgent`, `ReActAgent`, `AgentWorkflow`, your own steps). Sync
(`call`) and async (`acall`) calls are both braked, sync and async functions
both work. LlamaIndex offers no tool-call hook on its agents without private
API, so the tool is the seam.

* session (`scope="run"`, the default): the session bound with
  `distbrake.bind_session` around `agent.run(...)` (LlamaIndex names no
  conversation) together with the workflow run id (`handler.run_id`, the
  `llamaindex.run_id` tag LlamaIndex puts on every event of the run), so
  each `agent.run` starts a fresh streak; `scope="conversation"`: the bound
  session alone, across runs (else `"default"`); `session_id=`: a callable
  given the step's workflow `Context` (None outside a workflow);
* call id: none. LlamaIndex does not hand a tool its call id, so a call that
  is run again (a step retried by a retry policy) counts again;
* tool and arguments: the tool's name and the keyword arguments it is
  called with (the workflow `Context` parameter and partial params left out).

On denial the function does not run, and:

* `on_deny="message"` (default): the call returns
  `ToolOutput(content=<the brake's text>, is_error=True)` (its `raw_input`
  empty, never the arguments): the agent hands it to the model as the tool
  result and the run goes on;
* `on_deny="raise"`: the call raises `LoopBrakeError`. Called directly, it
  propagates; inside an agent, LlamaIndex catches every exception a tool
  raises and hands its text to the model as an error result (the exception
  kept in `ToolOutput.exception`), so the run would go on: end it the
  LlamaIndex way with `await raise_on_denial(agent.run(...))`, which watches
  the run's event stream, cancels the run (`handler.cancel_run()`) at the
  first refused call and raises its `LoopBrakeError`.

A halt (`LoopBrakeHalt`) is raised from the call whatever `on_deny` says:
`raise_on_denial` then cancels the run and raises it (without it, LlamaIndex
hands the model the halt text, and every later call of the session is
refused the same way).

A brake error (`BrakeUnavailableError` under the `closed` failure policy)
is raised from the call before the function runs; inside an agent the model
reads its text as an error result.

Warnings and progress-aware tools: an allowed call whose verdict carries a
warning (the brake's `warn_at`; none in shadow mode) returns the tool's
output with the warning as one more `TextBlock` after its blocks (the model
reads both; `raw_output` untouched). For a progress-aware tool
(`tools={"poll": {"progress": True}}`) the function's result (`raw_output`)
or the exception it raised is observed; for a tool with `max_failures` an
exception or an `is_error` output is a failed call.

Brakes: in `acall` any brake (`AsyncDistributedBrake` awaited,
`DistributedBrake` in a worker thread); in `call` a sync brake
(`DistributedBrake`, `LoopBrake`), an `AsyncDistributedBrake` raising
`TypeError` before anything runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import LoopBrakeError
from ..session import bound_session
from ..wrap import Brake, is_async_brake
from . import kernel
from .kernel import AdapterOptions, OnDeny, Scope, SessionIdFunction, requires, scoped_session

with requires(__name__, "LlamaIndex 0.14 or newer", "llamaindex"):
    from llama_index.core.agent.workflow import ToolCallResult
    from llama_index.core.base.llms.types import TextBlock
    from llama_index.core.tools import FunctionTool, ToolOutput
    from llama_index_instrumentation.dispatcher import active_instrument_tags
    from workflows import Context
    from workflows.errors import WorkflowRuntimeError
    from workflows.handler import WorkflowHandler

__all__ = ["BrakedFunctionTool", "OnDeny", "guard_tools", "raise_on_denial"]

RUN_ID_TAG = "llamaindex.run_id"


class _Guard(AdapterOptions):
    """One brake with its options: what every braked copy of one `guard_tools` call shares."""

    on_deny: OnDeny

    def identify(self, tool: FunctionTool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any, object]:
        """(tool name, hashed arguments, session) of one call."""
        hidden = tool.ctx_param_name
        context = kwargs.get(hidden) if hidden is not None else None
        fixed = tool.partial_params  # the same on every call (`tool(...)` passes them in, agents do not)
        named = {key: value for key, value in kwargs.items() if key != hidden and key not in fixed}
        hashed: Any = named if not args else {"args": list(args), "kwargs": named}
        return tool.metadata.get_name(), hashed, self.session_of(context)

    def session_of(self, context: object) -> object:
        given = context if context is not None or self.session_id is None else _step_context()
        return self.pick_session(given, self._scoped)

    def _scoped(self, context: object) -> str | None:
        run = active_instrument_tags.get().get(RUN_ID_TAG)
        return scoped_session(self.scope, bound_session(), run)

    def refused(self, tool: FunctionTool, error: LoopBrakeError) -> ToolOutput:
        """The refusal as the call's output (`on_deny="message"`), or the raise."""
        if self.ends_run(error):
            raise error
        text = str(error)
        return ToolOutput(
            content=text, tool_name=tool.metadata.get_name(), raw_input={}, raw_output=text,
            is_error=True,
        )


def _raw_output(output: ToolOutput) -> object:
    return output.raw_output


def _is_error(output: ToolOutput) -> bool:
    return bool(output.is_error)


def _step_context() -> Context | None:
    """The workflow `Context` of the step running this call, or None outside a workflow."""
    try:
        return Context.get_step_context()
    except WorkflowRuntimeError:
        return None


def with_warning(output: ToolOutput, warning: str | None) -> ToolOutput:
    """The tool's output, whole, with the warning as one more text block."""
    if warning is None:
        return output
    return output.model_copy(update={"blocks": [*output.blocks, TextBlock(text=warning)]})


class BrakedFunctionTool(FunctionTool):
    """A braked copy of a `FunctionTool` (see the module text); `original` is the tool it copies."""

    def __init__(self, tool: FunctionTool, guard: _Guard) -> None:
        # No FunctionTool.__init__: the copy shares the original's function, metadata and callbacks.
        self.__dict__.update(vars(tool))
        self.original = tool
        self._guard = guard

    @property
    def brake(self) -> Brake:
        return self._guard.brake

    def call(self, *args: Any, **kwargs: Any) -> ToolOutput:
        """Check the call with the (sync) brake; run the tool only when it is allowed."""
        guard = self._guard
        if is_async_brake(guard.brake):
            raise TypeError(
                f"{self.metadata.get_name()}: the brake is an AsyncDistributedBrake, which "
                "brakes acall only; use DistributedBrake or LoopBrake for sync calls"
            )
        name, hashed, session = guard.identify(self, args, kwargs)
        verdict, error = guard.screen_sync(name, hashed, session_id=session)
        if error is not None:
            return guard.refused(self, error)
        output = kernel.run_allowed_sync(
            guard.brake, verdict, lambda: super(BrakedFunctionTool, self).call(*args, **kwargs), _raw_output,
            Exception, _is_error,
        )
        return with_warning(output, kernel.warning_of(verdict))

    async def acall(self, *args: Any, **kwargs: Any) -> ToolOutput:
        """Check the call with any brake (never blocking the loop); run the tool only when it is allowed."""
        guard = self._guard
        name, hashed, session = guard.identify(self, args, kwargs)
        verdict, error = await guard.screen(name, hashed, session_id=session)
        if error is not None:
            return guard.refused(self, error)
        output = await kernel.run_allowed(
            guard.brake, verdict, lambda: super(BrakedFunctionTool, self).acall(*args, **kwargs), _raw_output,
            Exception, _is_error,
        )
        return with_warning(output, kernel.warning_of(verdict))


def guard_tools(
    brake: Brake,
    tools: Iterable[FunctionTool],
    *,
    on_deny: OnDeny = "message",
    scope: Scope = "run",
    session_id: SessionIdFunction | None = None,
) -> list[FunctionTool]:
    """Braked copies of `tools` (`FunctionTool`s), in order; the originals are untouched.

    A tool already braked by this brake is returned as it is (braking twice
    must not halve the limit); any other tool type raises `TypeError`.
    """
    guard = _Guard(brake, on_deny=on_deny, scope=scope, session_id=session_id)
    braked: list[FunctionTool] = []
    for tool in tools:
        if isinstance(tool, BrakedFunctionTool) and tool.brake is brake:
            braked.append(tool)
        elif isinstance(tool, FunctionTool):
            braked.append(BrakedFunctionTool(tool, guard))
        else:
            raise TypeError(f"guard_tools brakes FunctionTools, not {type(tool).__name__}")
    return braked


async def raise_on_denial(handler: WorkflowHandler) -> Any:
    """The run's result; at the first call a brake refused with `on_deny="raise"` (or a halt), cancel the run and
    raise.

    `handler` is what `agent.run(...)` returns. Its events are consumed here
    (use your own loop over `handler.stream_events()` to show them as well).
    """
    async for event in handler.stream_events():
        if isinstance(event, ToolCallResult) and isinstance(event.tool_output.exception, LoopBrakeError):
            await handler.cancel_run()
            raise event.tool_output.exception
    return await handler
