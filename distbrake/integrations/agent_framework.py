"""Microsoft Agent Framework: a function middleware that puts a brake in front of every tool call.

    from agent_framework import Agent
    from distbrake import DistributedBrake
    from distbrake.integrations.agent_framework import LoopBrakeMiddleware

    brake = DistributedBrake.from_url("redis://localhost:6379/0")
    agent = Agent(client=client, tools=[search], middleware=[LoopBrakeMiddleware(brake)])

Each call of the function-invocation loop (`FunctionInvocationLayer`, which
every chat client with tools uses) is checked before the tool runs:

* session, by `scope`: `"run"` (the default) is the agent session
  (`context.session.session_id`) together with the run: one `Agent.run` (or
  one `get_response` of a chat client), told apart by the run's own tool
  list (`context.tools`, a fresh list per run); `"conversation"` is the agent
  session alone, across runs (pass the same `AgentSession` to every turn).
  `session_id=callable(context)` (given the `FunctionInvocationContext`)
  overrides both; with no agent session and no run, distbrake's own rule
  applies (a bound session, else `"default"`);
* call id: the provider's `call_id` (`context.metadata["call_id"]`),
  qualified by the run and by a token the first braked layer puts in
  `context.metadata` (the one context every layer of a call shares): a
  provider that numbers calls per turn (`search:0` every turn) is still
  counted every turn, and a call that passes two braked layers is counted
  once (a second layer on the same brake object lets it through; another
  brake object on the same Redis sees the same call id, a replay);
* tool and arguments: `context.function.name` and `context.arguments` (a
  model's arguments are a mapping; a pydantic model is dumped as JSON).

On denial the tool does not run (`call_next` is skipped), and:

* `on_deny="message"` (default): `context.result` is the brake's text, which
  the model reads as the call's `function_result`; the run goes on. (Not an
  exception: the loop turns any ordinary exception into the bare text
  "Error: Function failed." unless `include_detailed_errors=True`, so the
  model would never learn why.)
* `on_deny="raise"`: `agent_framework.MiddlewareFailure` (the loop's
  fail-closed signal: the batch is cancelled and `Agent.run` raises it),
  whose `__cause__` is the `LoopBrakeError`.

A halt (`LoopBrakeHalt`) raises that `MiddlewareFailure` whatever `on_deny`
says.

Warnings and progress-aware tools: when an allowed call's verdict carries a
warning (the brake's `warn_at`; never in shadow mode), it is added to the
tool's result: one more text `Content` after a `list[Content]` (the default
result), a separate paragraph after a str, else the value's text then the
warning. For a progress-aware tool (`tools={"poll": {"progress": True}}`) the
result (its contents' text and data, never ids) or the exception the tool
raised is observed after it runs, so a poller whose result changes is never
denied.

The middleware is async: an `AsyncDistributedBrake` is awaited, a
`DistributedBrake` runs in a worker thread, a `LoopBrake` inline. It keeps
no per-run state, so one instance may serve many agents and runs.
"""

from __future__ import annotations

import itertools
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from threading import Lock
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from ..errors import LoopBrakeError, UnsupportedArgumentsError
from ..wrap import acheck
from .kernel import AdapterOptions, OnDeny, requires, run_allowed, scoped_session, text_with_warning, warning_of

with requires(__name__, "Microsoft Agent Framework (agent-framework-core >= 1.23)", "agent-framework"):
    from agent_framework import Content, FunctionInvocationContext, FunctionMiddleware, MiddlewareFailure

__all__ = ["LoopBrakeMiddleware", "OnDeny"]

_CALL_KEY = "distbrake.call_id"  # in context.metadata: the call id every braked layer uses
_CHECKED_KEY = "distbrake.checked_by"  # in context.metadata: ids of the brakes that checked this call
_RUNS_KEPT = 4096  # runs whose tool list is remembered (each entry holds the list, so its id is not reused)


class _Runs:
    """A run id for each run's tool list (`context.tools`), by identity; the oldest are forgotten."""

    def __init__(self) -> None:
        self._ids: OrderedDict[int, tuple[object, str]] = OrderedDict()
        self._next = itertools.count(1)
        self._lock = Lock()

    def id_of(self, tools: object) -> str | None:
        if tools is None:
            return None
        with self._lock:
            found = self._ids.get(id(tools))
            if found is not None and found[0] is tools:
                self._ids.move_to_end(id(tools))
                return found[1]
            run = f"r{next(self._next)}"
            self._ids[id(tools)] = (tools, run)
            while len(self._ids) > _RUNS_KEPT:
                self._ids.popitem(last=False)
            return run


# One registry for every middleware: layers on different brakes name a run alike.
_RUNS = _Runs()


def _arguments(arguments: object) -> object:
    if isinstance(arguments, BaseModel):
        return arguments.model_dump(mode="json")
    if isinstance(arguments, Mapping):
        return dict(arguments)
    return arguments


def _observed(result: object) -> object:
    """A result as a progress-aware tool's observation sees it: contents' type, text and data."""
    if isinstance(result, list | tuple):
        return [_observed(item) for item in result]
    if isinstance(result, Content):
        return {"type": result.type, "text": result.text, "data": getattr(result, "result", None)}
    return result


def _with_warning(result: object, warning: str) -> object:
    """The tool's result, whole, then the warning."""
    if isinstance(result, str):
        return text_with_warning(result, warning)
    if isinstance(result, list) and all(isinstance(item, Content) for item in result):
        return [*result, Content.from_text(warning)]
    text = "" if result is None else str(result)
    return [Content.from_text(text), Content.from_text(warning)] if text else [Content.from_text(warning)]


class LoopBrakeMiddleware(AdapterOptions, FunctionMiddleware):
    """Deny the Nth identical tool call in a row before the tool runs (see the module text).

    `brake` is any distbrake brake; `on_deny` is `"message"` (the refusal is
    the call's result) or `"raise"` (`MiddlewareFailure` ends the run);
    `scope` is `"run"` or `"conversation"`; `session_id`, a callable given the
    `FunctionInvocationContext`, overrides the scope.
    """

    on_deny: OnDeny

    def _identify(self, context: FunctionInvocationContext) -> tuple[object, str | None]:
        """(session id, call id) of the call."""
        run = _RUNS.id_of(context.tools)
        qualified = context.metadata.get(_CALL_KEY)
        if not isinstance(qualified, str):
            call_id = context.metadata.get("call_id") or ""
            qualified = f"{run or ''}/{call_id}/{uuid.uuid4().hex[:12]}"
            context.metadata[_CALL_KEY] = qualified
        conversation = context.session.session_id if context.session is not None else None
        return self.pick_session(context, lambda _: scoped_session(self.scope, conversation, run)), qualified

    async def _check(self, context: FunctionInvocationContext) -> Any:
        session, call_id = self._identify(context)
        tool = context.function.name
        arguments = _arguments(context.arguments)
        try:
            return await acheck(self.brake, tool, arguments, session_id=session, call_id=call_id)
        except UnsupportedArgumentsError:
            # Raised while hashing, before anything was counted: hash the arguments' JSON form.
            jsonable = to_jsonable_python(arguments, fallback=str)
            return await acheck(self.brake, tool, jsonable, session_id=session, call_id=call_id)

    async def process(
        self, context: FunctionInvocationContext, call_next: Callable[[], Awaitable[None]]
    ) -> None:
        """Check the call; skip it with the refusal as its result (or raise) when denied."""
        checked: list[int] = context.metadata.setdefault(_CHECKED_KEY, [])
        if id(self.brake) in checked:
            await call_next()  # an outer layer on this brake checked this call
            return
        checked.append(id(self.brake))
        try:
            verdict = await self._check(context)
        except LoopBrakeError as error:
            if self.ends_run(error):
                raise MiddlewareFailure(str(error)) from error
            context.result = str(error)
            return

        async def run() -> object:
            await call_next()
            return context.result

        result = await run_allowed(self.brake, verdict, run, _observed, Exception)
        warning = warning_of(verdict)
        if warning is not None:
            context.result = _with_warning(result, warning)
