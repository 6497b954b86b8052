"""Each host's documented example of a pre-tool event (used by `--self-test`, `doctor`, and the tests).

The field names and shapes follow each host's documentation (see the host's
module); the values are the documentation's examples.
"""

from __future__ import annotations

from typing import Any

__all__ = ["pre_event"]


def pre_event(host: str, session: str, call_id: str) -> dict[str, Any]:
    """Host `host`'s pre-tool event for a `Bash`-like call of `session`, with tool-use id `call_id`."""
    if host == "claude-code":  # code.claude.com/docs/en/hooks, "PreToolUse input"
        return {
            "session_id": session, "transcript_path": "/home/user/.claude/projects/x/transcript.jsonl",
            "cwd": "/home/user/my-project", "permission_mode": "default", "hook_event_name": "PreToolUse",
            "tool_name": "Bash", "tool_input": {"command": "npm test", "description": "Run the tests"},
            "tool_use_id": call_id, "prompt_id": "prompt-1",
        }
    if host == "codex":  # codex-rs/hooks/schema/generated/pre-tool-use.command.input.schema.json
        return {
            "session_id": session, "turn_id": "turn-1", "transcript_path": None, "cwd": "/home/user/my-project",
            "hook_event_name": "PreToolUse", "model": "gpt-5", "permission_mode": "default",
            "tool_name": "Bash", "tool_input": {"command": "npm test"}, "tool_use_id": call_id,
        }
    if host == "gemini":  # google-gemini/gemini-cli docs/hooks/reference.md, "Base input schema" + BeforeTool
        return {
            "session_id": session, "transcript_path": "/home/user/.gemini/tmp/chats/session.json",
            "cwd": "/home/user/my-project", "hook_event_name": "BeforeTool", "timestamp": "2026-01-01T00:00:00Z",
            "tool_name": "run_shell_command", "tool_input": {"command": "npm test"},
        }
    if host == "cursor":  # cursor.com/docs/agent/hooks, common fields + preToolUse
        return {
            "conversation_id": session, "generation_id": "gen-1", "hook_event_name": "preToolUse",
            "workspace_roots": ["/home/user/my-project"], "tool_name": "Shell",
            "tool_input": {"command": "npm test"}, "tool_use_id": call_id, "cwd": "/home/user/my-project",
        }
    raise KeyError(host)
