"""Cursor's agent hooks (`.cursor/hooks.json` or `~/.cursor/hooks.json`, `"version": 1`).

From Cursor's hooks documentation (cursor.com/docs/agent/hooks): every event carries
`conversation_id`, `generation_id`, `hook_event_name`, `workspace_roots`;
`preToolUse` adds `tool_name`, `tool_input`, `tool_use_id`; `beforeMCPExecution`
adds `tool_name` and `tool_input` (a JSON text); `beforeShellExecution` adds
`command` and `cwd` (the tool is Cursor's `Shell`); `postToolUse`,
`afterMCPExecution` and `afterShellExecution` follow a call. The permission
events answer `permission` ("allow" | "deny" | "ask") with `user_message` (the
user's) and `agent_message` (the model's); `preToolUse` is documented both with
that shape and with `decision` + `reason`, so a denial carries both. Cursor's
tool events cannot end the conversation: a halt is a denial. Configure one of
`preToolUse` or the `before*Execution` pair, not both (they would count one call twice).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from . import Answer, Decision, HookEvent, HookInputError, Phase, optional_text, text_field

NAME = "cursor"
PRE = ("preToolUse", "beforeMCPExecution", "beforeShellExecution")
POST = ("postToolUse", "afterMCPExecution", "afterShellExecution")
SHELL = "Shell"  # the name Cursor's preToolUse gives its shell tool


def parse(payload: Mapping[str, Any]) -> HookEvent | None:
    """The tool event of a Cursor tool payload; None for another event."""
    event = text_field(payload, "hook_event_name")
    if event not in PRE and event not in POST:
        return None
    session = text_field(payload, "conversation_id")
    run = optional_text(payload, "generation_id")
    call_id = optional_text(payload, "tool_use_id")
    phase: Phase = "pre" if event in PRE else "post"
    if event in ("beforeShellExecution", "afterShellExecution"):
        command = text_field(payload, "command")
        args: Any = {"command": command}
        result = payload.get("output")
        return HookEvent(phase, event, SHELL, args, session, run, call_id, result if phase == "post" else None)
    tool = text_field(payload, "tool_name")
    if "tool_input" not in payload:
        raise HookInputError("the event has no 'tool_input' field")
    args = payload["tool_input"]
    if event.endswith("MCPExecution") and isinstance(args, str):
        try:
            args = orjson.loads(args)
        except orjson.JSONDecodeError:
            raise HookInputError("the event's 'tool_input' is not JSON text") from None
    result = payload.get("tool_output", payload.get("result_json")) if phase == "post" else None
    return HookEvent(phase, event, tool, args, session, run, call_id, result)


def allow(event: str) -> Answer:
    return Answer("{}")


def answer(event: str, decision: Decision) -> Answer:
    if decision.verb in ("allow", "warn") or event not in PRE:
        return allow(event)  # Cursor's permission events have no allowed-with-context answer
    reply: dict[str, Any] = {
        "permission": "deny", "user_message": decision.message, "agent_message": decision.message,
    }
    if event == "preToolUse":
        reply.update({"decision": "deny", "reason": decision.message})
    return Answer(orjson.dumps(reply).decode())
