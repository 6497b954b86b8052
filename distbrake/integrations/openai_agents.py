"""The loop brake as an OpenAI Agents SDK tool input guardrail (openai-agents >= 0.24).

::

    from distbrake import DistributedBrake
    from distbrake.integrations.openai_agents import attach_loop_brake, loop_brake_guardrail

    brake = DistributedBrake.from_url("redis://redis:6379/0")
    agent = attach_loop_brake(Agent(name="researcher", tools=[search]), brake)
    # or per tool: function_tool(search, tool_input_guardrails=[loop_brake_guardrail(brake)])

The guardrail runs before the tool (and before `on_tool_start` hooks). A
denied call never runs; with `on_deny="reject"` (the default) the model gets
the brake's text as the call's `function_call_output` and the run goes on, so
the model can change course; with `on_deny="raise"` the run stops with
`agents.exceptions.ToolInputGuardrailTripwireTriggered` (its
`.output.output_info` holds the denial: code, kind, tool, count, limit, hash
prefix, session, message). A halt (`LoopBrakeHalt`, the session is halted)
raises that tripwire whatever `on_deny` says (`output_info["kind"] ==
"halt"`).

What is counted: the tool name and its arguments (the model's JSON string,
parsed, so `{"q":"a"}` and `{ "q": "a" }` are the same call; a string that is
not JSON is hashed as it is). The call id is the model's `tool_call_id`, so a
guardrail that runs twice for one call (`ToolExecutionConfig(
pre_approval_tool_input_guardrails=True)` runs it before the approval
interruption and again after) counts that call once.

The session, by `scope`. The conversation is, first match wins: a
`session_id` key or attribute of your run context (`Runner.run(...,
context=...)`); `RunConfig.group_id` (the conversation id of the trace).
`scope="run"` (the default) keys a streak on the conversation together with
the run: the SDK has no run id, so distbrake gives each `Runner.run` (or
`run_streamed`) one, kept as an attribute of the run's `Usage` object, which
the SDK shares with every tool call of the run and copies into its
`RunState` (a run interrupted for approval and resumed in the same process
keeps its streak; one resumed from `RunState.to_json` in another process
starts a new one). The same question in three user turns is then three
streaks of one call.
`scope="conversation"` keys it on the conversation alone, across runs.
Without a conversation, a session bound with `bind_session` stands for it
(with none, `"run/<run>"`, or `"default"` under `scope="conversation"`).
`session_id=callable(data)` (given the `ToolInputGuardrailData`) overrides
both when it returns a str.

One turn can emit several identical calls, which the SDK runs concurrently:
every brake's check is one atomic step (a lock in process, one Lua script in
Redis), and the guardrail makes exactly one awaited call per tool call, so
three identical calls in one turn still give counts 1, 2, 3.

Warnings and progress-aware tools
---------------------------------
A tool input guardrail can allow or reject a call but cannot touch its
output, and a tool output guardrail can only replace the output by
*rejecting* it (recorded as a rejection, the output schema bypassed). So
`attach_loop_brake` (and `brake_function_tool` for one tool) also wraps each
tool's `on_invoke_tool`: the guardrail hands the allowed call's verdict to
the wrapper (through a context variable: the SDK runs each call in its own
task, created after the guardrail ran), which, after the tool body returns:

* for a progress-aware tool (`tools={"poll": {"progress": True}}`) observes
  the output (with the SDK's default `failure_error_function`, a body that
  raises gives the error text as its output; with `failure_error_function=
  None` the exception itself is observed, then re-raised), so a poller whose
  result changes is never denied. For a tool with `max_failures` only that
  raised exception is a failed call: the SDK hands the wrapper the default
  `failure_error_function`'s text as an ordinary output;
* when the verdict carries a warning (the brake's `warn_at`; never in shadow
  mode), appends it to the output the model reads: after a str output as a
  separate paragraph, after structured output (`ToolOutputText`, images,
  files, or a list of them) as one more `ToolOutputText`; any other value is
  sent as the SDK sends it, `str(output)`, followed by the warning. A tool
  with an output schema (`output_json_schema`) gets no warning (its output
  must stay a JSON object).

`loop_brake_guardrail` on its own (`function_tool(...,
tool_input_guardrails=[...])`) still denies, but cannot deliver warnings or
observe results: use `brake_function_tool(tool, brake)` for such tools.

Tools of `Agent.mcp_servers` are not `FunctionTool`s of the agent: pass the
guardrail to the server instead (`MCPServerStdio(...,
tool_input_guardrails=[loop_brake_guardrail(brake)])`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal, TypeVar, get_args
from uuid import uuid4

from ..errors import LoopBrakeError
from ..wrap import Brake
from .kernel import AdapterOptions, Handoff, Scope, requires, run_allowed, scoped_session, text_with_warning, warning_of

with requires(__name__, "the OpenAI Agents SDK (openai-agents >= 0.24)", "openai-agents"):
    from agents import (
        Agent,
        FunctionTool,
        ToolGuardrailFunctionOutput,
        ToolInputGuardrail,
        ToolInputGuardrailData,
        ToolOutputFileContent,
        ToolOutputImage,
        ToolOutputText,
    )

__all__ = [
    "GUARDRAIL_NAME",
    "attach_loop_brake",
    "brake_function_tool",
    "denial_info",
    "loop_brake_guardrail",
    "resolve_session",
    "run_id",
    "tool_arguments",
]

GUARDRAIL_NAME = "loop_brake"

OnDeny = Literal["reject", "raise"]
SessionIdFunction = Callable[[ToolInputGuardrailData], object]
AgentT = TypeVar("AgentT", bound=Agent[Any])
Invoke = Callable[[Any, str], Awaitable[Any]]



def _same_call(held: str | None, call_id: str | None) -> bool:
    """The invoked call is the one the guardrail allowed (either id unknown: taken as the same)."""
    return not (call_id and held is not None and call_id != held)


# The verdict of the call a guardrail just allowed, by tool call id; the
# wrapped `on_invoke_tool` of that call takes it.
_allowed: Handoff[str | None] = Handoff("distbrake_openai_agents_allowed", _same_call)

# The attribute of a run's `Usage` object that holds the run id distbrake gave that run.
_RUN_ATTRIBUTE = "_distbrake_run_id"


class _Options(AdapterOptions):
    """The options of one guardrail (`on_deny` is `"reject"` or `"raise"`)."""

    ON_DENY = get_args(OnDeny)

    def __init__(self, brake: Brake, on_deny: OnDeny, scope: Scope, session_id: SessionIdFunction | None) -> None:
        self.configure(brake, on_deny, scope, session_id)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def tool_arguments(raw: str) -> Any:
    """The model's arguments string as what gets hashed: parsed JSON, else the raw string.

    An empty string is `{}` (what models send for a tool without parameters).
    """
    if not raw.strip():
        return {}
    try:
        return json.loads(raw, parse_constant=_reject_constant)
    except ValueError:
        return raw


def _session_attribute(context: object) -> str | None:
    if context is None:
        return None
    value = context.get("session_id") if isinstance(context, Mapping) else getattr(
        context, "session_id", None
    )
    if isinstance(value, str):
        return value or None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def resolve_session(data: ToolInputGuardrailData) -> str | None:
    """The conversation: run context `session_id`, else `RunConfig.group_id`, else None."""
    tool_context = data.context
    found = _session_attribute(tool_context.context)
    if found is not None:
        return found
    run_config = tool_context.run_config
    group_id = run_config.group_id if run_config is not None else None
    return group_id or None


def run_id(data: ToolInputGuardrailData) -> str | None:
    """The id distbrake gave the run this call belongs to (kept on the run's `Usage`; see the module text)."""
    usage = data.context.usage  # one object per run, shared by the run's tool calls
    found = getattr(usage, _RUN_ATTRIBUTE, None)
    if isinstance(found, str):
        return found
    made = uuid4().hex
    try:
        setattr(usage, _RUN_ATTRIBUTE, made)
    except (AttributeError, TypeError):  # an object that takes no attribute: the conversation decides
        return None
    return made


def denial_info(error: LoopBrakeError) -> dict[str, Any]:
    """The denial as JSON-safe data (the guardrail's `output_info`); never the arguments. `kind` is the
    rule that refused (`"halt"`: the session is halted, the run was stopped whatever `on_deny` says)."""
    return {
        "code": error.code,
        "kind": error.kind,
        "tool_name": error.tool_name,
        "count": error.count,
        "max_repeats": error.max_repeats,
        "hash_prefix": error.hash_prefix,
        "session_id": error.session_id,
        "message": str(error),
    }


def loop_brake_guardrail(
    brake: Brake, *, on_deny: OnDeny = "reject", scope: Scope = "run",
    session_id: SessionIdFunction | None = None, name: str = GUARDRAIL_NAME,
) -> ToolInputGuardrail[Any]:
    """A tool input guardrail that denies the Nth identical call in a row.

    `brake` is any distbrake brake (a sync Redis brake runs in a worker
    thread). `on_deny="reject"` hands the model the brake's text instead of
    the tool's output and lets the run go on; `"raise"` aborts the run with
    `ToolInputGuardrailTripwireTriggered`. `scope` is `"run"` or
    `"conversation"`; `session_id(data)` overrides it (see the module text).
    """
    options = _Options(brake, on_deny, scope, session_id)

    def default_session(data: ToolInputGuardrailData) -> str | None:
        return scoped_session(scope, resolve_session(data), run_id(data) if scope == "run" else None)

    async def loop_brake(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        tool_context = data.context
        # One awaited, atomic check per call: safe when one turn runs
        # several identical calls concurrently.
        verdict, error = await options.screen(
            tool_context.tool_name,
            tool_arguments(tool_context.tool_arguments),
            session_id=options.pick_session(data, default_session),
            call_id=tool_context.tool_call_id or None,
        )
        if error is not None:
            _allowed.clear()
            if options.ends_run(error):
                return ToolGuardrailFunctionOutput.raise_exception(output_info=denial_info(error))
            return ToolGuardrailFunctionOutput.reject_content(
                str(error), output_info=denial_info(error)
            )
        # For the wrapped on_invoke_tool (brake_function_tool): warning, observation.
        _allowed.put(brake, tool_context.tool_call_id or None, verdict)
        return ToolGuardrailFunctionOutput.allow()

    loop_brake.__distbrake_brake__ = brake  # type: ignore[attr-defined]
    return ToolInputGuardrail(guardrail_function=loop_brake, name=name)


def _has_brake(tool: FunctionTool, brake: Brake) -> bool:
    return any(
        getattr(guardrail.guardrail_function, "__distbrake_brake__", None) is brake
        for guardrail in tool.tool_input_guardrails or ()
    )


def _structured(item: object) -> bool:
    """A structured output item the SDK sends as such (text, image, file)."""
    if isinstance(item, ToolOutputText | ToolOutputImage | ToolOutputFileContent):
        return True
    return isinstance(item, Mapping) and item.get("type") in ("text", "image", "file")


def with_warning(output: Any, warning: str) -> Any:
    """A tool's output as the model should read it: the output, whole, then the warning."""
    if isinstance(output, str):
        return text_with_warning(output, warning)
    note = ToolOutputText(text=warning)
    if isinstance(output, list | tuple) and output and all(_structured(item) for item in output):
        return [*output, note]
    if _structured(output):
        return [output, note]
    return f"{output}\n\n{warning}"


def _braked_invoke(tool: FunctionTool, brake: Brake) -> Invoke:
    invoke: Invoke = tool.on_invoke_tool

    @functools.wraps(invoke)
    async def on_invoke_tool(ctx: Any, arguments: str) -> Any:
        verdict = _allowed.take(brake, getattr(ctx, "tool_call_id", None))
        if verdict is None:
            return await invoke(ctx, arguments)
        output = await run_allowed(brake, verdict, lambda: invoke(ctx, arguments))
        warning = warning_of(verdict)
        if warning is None or tool.output_json_schema is not None:
            return output
        return with_warning(output, warning)

    on_invoke_tool.__distbrake_brake__ = brake  # type: ignore[attr-defined]
    return on_invoke_tool


def brake_function_tool(
    tool: FunctionTool, brake: Brake, *, on_deny: OnDeny = "reject", scope: Scope = "run",
    session_id: SessionIdFunction | None = None, name: str = GUARDRAIL_NAME,
) -> FunctionTool:
    """Brake one `FunctionTool` in place (returned): the guardrail, plus warnings and observation.

    Appends a loop-brake guardrail (unless one on this brake is there) and
    wraps `on_invoke_tool` (once per brake) so that the brake's warning reaches
    the model with the tool's output and a progress-aware tool's output is
    observed (see the module text).
    """
    if not _has_brake(tool, brake):
        guardrail = loop_brake_guardrail(
            brake, on_deny=on_deny, scope=scope, session_id=session_id, name=name
        )
        tool.tool_input_guardrails = [*(tool.tool_input_guardrails or ()), guardrail]
    if getattr(tool.on_invoke_tool, "__distbrake_brake__", None) is not brake:
        tool.on_invoke_tool = _braked_invoke(tool, brake)
    return tool


def attach_loop_brake(
    agent: AgentT, brake: Brake, *, on_deny: OnDeny = "reject", scope: Scope = "run",
    session_id: SessionIdFunction | None = None, name: str = GUARDRAIL_NAME,
) -> AgentT:
    """Brake every `FunctionTool` of `agent` (`brake_function_tool`); returns `agent`.

    The tools are changed in place (a tool shared with another agent is braked
    there too): one loop-brake guardrail is appended, and `on_invoke_tool` is
    wrapped for warnings and progress-aware tools. A tool that already has a
    guardrail on this brake gets no second one, so attaching twice never
    halves the limit. Tools of `agent.mcp_servers`, handoffs and hosted tools
    are not touched.
    """
    _Options(brake, on_deny, scope, session_id)
    for tool in agent.tools:
        if isinstance(tool, FunctionTool):
            brake_function_tool(
                tool, brake, on_deny=on_deny, scope=scope, session_id=session_id, name=name
            )
    return agent
