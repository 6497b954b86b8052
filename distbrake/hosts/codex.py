"""Codex CLI's hooks (`~/.codex/hooks.json`, or `[hooks]` in `config.toml`).

From the Codex source (`codex-rs/hooks/schema/generated/pre-tool-use.command.input.schema.json`,
`post-tool-use.command.input.schema.json`, `pre-tool-use.command.output.schema.json`): the
input carries `session_id`, `turn_id`, `hook_event_name` (`PreToolUse`, `PostToolUse`),
`tool_name`, `tool_input`, `tool_use_id` (and `tool_response` after the tool); the output
is Claude Code's: `hookSpecificOutput` {`hookEventName`, `permissionDecision` "deny",
`permissionDecisionReason`, `additionalContext`}, `continue` and `stopReason`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import HookEvent
from .claude_code import allow, answer, parse_tool_event  # the answers are Claude Code's

NAME = "codex"
PRE = ("PreToolUse",)
POST = ("PostToolUse",)
RUN_FIELD = "turn_id"

__all__ = ["NAME", "allow", "answer", "parse"]


def parse(payload: Mapping[str, Any]) -> HookEvent | None:
    """The tool event of a Codex `PreToolUse`/`PostToolUse` payload; None for another event."""
    return parse_tool_event(payload, PRE, POST, RUN_FIELD)

