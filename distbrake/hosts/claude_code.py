"""Claude Code's hooks (`type: "command"` on stdin/stdout, `type: "http"` POSTed to `distbrake serve`).

From the hooks reference (code.claude.com/docs/en/hooks) and the CLI's own schema
(`@anthropic-ai/claude-code` 2.1.x, read in its bundle): every event carries
`session_id`, `transcript_path`, `cwd`, `prompt_id`, `permission_mode`,
`hook_event_name`; `PreToolUse` adds `tool_name`, `tool_input`, `tool_use_id`;
`PostToolUse` adds `tool_response`. An answer is JSON on stdout, exit 0:
`hookSpecificOutput` {`hookEventName`, `permissionDecision` ("deny"),
`permissionDecisionReason` (shown to Claude), `additionalContext`}, and the
common `continue: false` + `stopReason` that end the turn. An allowed call
answers nothing: an explicit "allow" would skip the user's permission prompts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from . import Answer, Decision, HookEvent, HookInputError, optional_text, text_field

NAME = "claude-code"
PRE = ("PreToolUse",)
POST = ("PostToolUse", "PostToolUseFailure")
RUN_FIELD = "prompt_id"  # the prompt (turn) a tool call belongs to


def parse(payload: Mapping[str, Any]) -> HookEvent | None:
    """The tool event of a `PreToolUse`/`PostToolUse` payload; None for another event."""
    return parse_tool_event(payload, PRE, POST, RUN_FIELD)


def parse_tool_event(
    payload: Mapping[str, Any], pre: tuple[str, ...], post: tuple[str, ...], run_field: str | None
) -> HookEvent | None:
    """The shape Claude Code, Codex and Gemini share (`hook_event_name`, `session_id`, `tool_name`, `tool_input`)."""
    event = text_field(payload, "hook_event_name")
    if event not in pre and event not in post:
        return None
    session = text_field(payload, "session_id")
    tool = text_field(payload, "tool_name")
    if "tool_input" not in payload:
        raise HookInputError("the event has no 'tool_input' field")
    run = optional_text(payload, run_field) if run_field else None
    call_id = optional_text(payload, "tool_use_id")
    result = payload.get("tool_response", payload.get("error")) if event in post else None
    return HookEvent(
        "pre" if event in pre else "post", event, tool, payload["tool_input"], session, run, call_id, result,
        event.endswith("Failure"),
    )


def allow(event: str) -> Answer:
    """Nothing on stdout: no decision, so the host's own permission rules still apply."""
    return Answer("")


def answer(event: str, decision: Decision) -> Answer:
    """`decision` in the PreToolUse output shape (Claude Code and Codex share it)."""
    if decision.verb == "allow" or event not in ("PreToolUse",):
        return allow(event)
    specific: dict[str, Any] = {"hookEventName": "PreToolUse"}
    reply: dict[str, Any] = {"hookSpecificOutput": specific}
    if decision.verb == "warn":
        specific["additionalContext"] = decision.message
    else:
        specific["permissionDecision"] = "deny"
        specific["permissionDecisionReason"] = decision.message
        if decision.verb == "halt":
            reply["continue"] = False
            reply["stopReason"] = decision.message
    return Answer(orjson.dumps(reply).decode())
