"""Gemini CLI's hooks (`settings.json` `hooks.BeforeTool` / `hooks.AfterTool`).

From google-gemini/gemini-cli `docs/hooks/reference.md`: every event carries
`session_id`, `transcript_path`, `cwd`, `hook_event_name`, `timestamp`; `BeforeTool`
adds `tool_name`, `tool_input` (and `mcp_context`); `AfterTool` adds `tool_response`.
No tool-use id and no turn id are sent. A denial is JSON on stdout, exit 0:
`decision: "deny"` with `reason` ("sent to the agent as a tool error"); `continue:
false` + `stopReason` end the agent loop; `systemMessage` is shown to the user
(BeforeTool has no field that adds context for the model, so a warning goes there).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from . import Answer, Decision, HookEvent
from .claude_code import parse_tool_event

NAME = "gemini"
PRE = ("BeforeTool",)
POST = ("AfterTool",)


def parse(payload: Mapping[str, Any]) -> HookEvent | None:
    """The tool event of a `BeforeTool`/`AfterTool` payload; None for another event."""
    return parse_tool_event(payload, PRE, POST, None)


def allow(event: str) -> Answer:
    return Answer("{}")


def answer(event: str, decision: Decision) -> Answer:
    if decision.verb == "allow" or event not in PRE:
        return allow(event)
    reply: dict[str, Any]
    if decision.verb == "warn":
        reply = {"systemMessage": decision.message}
    else:
        reply = {"decision": "deny", "reason": decision.message}
        if decision.verb == "halt":
            reply.update({"continue": False, "stopReason": decision.message})
    return Answer(orjson.dumps(reply).decode())
