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
`.output.output_info` holds the denial: code, tool, count, limit, hash prefix,
session, message).

What is counted: the tool name and its arguments (the model's JSON string,
parsed, so `{"q":"a"}` and `{ "q": "a" }` are the same call; a string that is
not JSON is hashed as it is). The call id is the model's `tool_call_id`, so a
guardrail that runs twice for one call (`ToolExecutionConfig(
pre_approval_tool_input_guardrails=True)` runs it before the approval
interruption and again after) counts that call once.

The session is, first match wins: `session_from(data)` when you pass one and
it returns a non-empty str; a `session_id` key or attribute of your run
context (`Runner.run(..., context=...)`); `RunConfig.group_id` (the
conversation id of the trace); else distbrake's own rule (a session bound with
`bind_session`, else `"default"`).

One turn can emit several identical calls, which the SDK runs concurrently:
every brake's check is one atomic step (a lock in process, one Lua script in
Redis), and the guardrail makes exactly one awaited call per tool call, so
three identical calls in one turn still give counts 1, 2, 3.

Tools of `Agent.mcp_servers` are not `FunctionTool`s of the agent: pass the
guardrail to the server instead (`MCPServerStdio(...,
tool_input_guardrails=[loop_brake_guardrail(brake)])`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, get_args

from ..errors import LoopBrakeError
from ..wrap import Brake, acheck
from .options import check_adapter_options

try:
    from agents import (
        Agent,
        FunctionTool,
        ToolGuardrailFunctionOutput,
        ToolInputGuardrail,
        ToolInputGuardrailData,
    )
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "distbrake.integrations.openai_agents needs the OpenAI Agents SDK "
        '(openai-agents >= 0.24): pip install "distbrake[openai-agents]"'
    ) from error

__all__ = [
    "GUARDRAIL_NAME",
    "attach_loop_brake",
    "denial_info",
    "loop_brake_guardrail",
    "resolve_session",
    "tool_arguments",
]

GUARDRAIL_NAME = "loop_brake"

OnDeny = Literal["reject", "raise"]
SessionFrom = Callable[[ToolInputGuardrailData], str | None]
AgentT = TypeVar("AgentT", bound=Agent[Any])


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
    """The default session: run context `session_id`, else `RunConfig.group_id`, else None."""
    tool_context = data.context
    found = _session_attribute(tool_context.context)
    if found is not None:
        return found
    run_config = tool_context.run_config
    group_id = run_config.group_id if run_config is not None else None
    return group_id or None


def denial_info(error: LoopBrakeError) -> dict[str, Any]:
    """The denial as JSON-safe data (the guardrail's `output_info`); never the arguments."""
    return {
        "code": error.code,
        "tool_name": error.tool_name,
        "count": error.count,
        "max_repeats": error.max_repeats,
        "hash_prefix": error.hash_prefix,
        "session_id": error.session_id,
        "message": str(error),
    }


def loop_brake_guardrail(
    brake: Brake,
    *,
    session_from: SessionFrom | None = None,
    on_deny: OnDeny = "reject",
    name: str = GUARDRAIL_NAME,
) -> ToolInputGuardrail[Any]:
    """A tool input guardrail that denies the Nth identical call in a row.

    `brake` is any distbrake brake (a sync Redis brake runs in a worker
    thread). `on_deny="reject"` hands the model the brake's text instead of
    the tool's output and lets the run go on; `"raise"` aborts the run with
    `ToolInputGuardrailTripwireTriggered`.
    """
    check_adapter_options(brake, on_deny, get_args(OnDeny))

    async def loop_brake(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        tool_context = data.context
        session = session_from(data) if session_from is not None else None
        try:
            # One awaited, atomic check per call: safe when one turn runs
            # several identical calls concurrently.
            await acheck(
                brake,
                tool_context.tool_name,
                tool_arguments(tool_context.tool_arguments),
                session_id=session or resolve_session(data),
                call_id=tool_context.tool_call_id or None,
            )
        except LoopBrakeError as error:
            if on_deny == "raise":
                return ToolGuardrailFunctionOutput.raise_exception(output_info=denial_info(error))
            return ToolGuardrailFunctionOutput.reject_content(
                str(error), output_info=denial_info(error)
            )
        return ToolGuardrailFunctionOutput.allow()

    loop_brake.__distbrake_brake__ = brake  # type: ignore[attr-defined]
    return ToolInputGuardrail(guardrail_function=loop_brake, name=name)


def _has_brake(tool: FunctionTool, brake: Brake) -> bool:
    return any(
        getattr(guardrail.guardrail_function, "__distbrake_brake__", None) is brake
        for guardrail in tool.tool_input_guardrails or ()
    )


def attach_loop_brake(
    agent: AgentT,
    brake: Brake,
    *,
    session_from: SessionFrom | None = None,
    on_deny: OnDeny = "reject",
    name: str = GUARDRAIL_NAME,
) -> AgentT:
    """Append one loop-brake guardrail to every `FunctionTool` of `agent`; returns `agent`.

    The tools are changed in place (a tool shared with another agent is braked
    there too). A tool that already has a guardrail on this brake is left
    alone, so attaching twice never halves the limit. Tools of
    `agent.mcp_servers`, handoffs and hosted tools are not touched.
    """
    guardrail = loop_brake_guardrail(brake, session_from=session_from, on_deny=on_deny, name=name)
    for tool in agent.tools:
        if isinstance(tool, FunctionTool) and not _has_brake(tool, brake):
            tool.tool_input_guardrails = [*(tool.tool_input_guardrails or ()), guardrail]
    return agent
