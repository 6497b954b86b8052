"""Each host's documented hook events, as its documentation prints them (the tests of `distbrake hook` send them).

Sources (field names and example values):
- Claude Code: code.claude.com/docs/en/hooks ("PreToolUse input", "PostToolUse input"), and the
  `@anthropic-ai/claude-code` 2.1.x bundle's hook input builder (`session_id`, `transcript_path`, `cwd`,
  `prompt_id`, `permission_mode`, then `hook_event_name`, `tool_name`, `tool_input`, `tool_use_id`).
- Codex: openai/codex `codex-rs/hooks/schema/generated/pre-tool-use.command.input.schema.json` and
  `post-tool-use.command.input.schema.json` (`turn_id` on both in current releases).
- Gemini CLI: google-gemini/gemini-cli `docs/hooks/reference.md` ("Base input schema", `BeforeTool`, `AfterTool`).
- Cursor: cursor.com/docs/agent/hooks (common fields `conversation_id`, `generation_id`, `hook_event_name`,
  `workspace_roots`; `preToolUse`, `beforeShellExecution`, `beforeMCPExecution` with `tool_input` as JSON text).
"""

from __future__ import annotations

import json
from typing import Any


def claude_pre(session: str = "abc123", call: str = "toolu_01ABC", prompt: str = "prompt-1") -> dict[str, Any]:
    return {
        "session_id": session, "transcript_path": "/Users/me/.claude/projects/my-project/abc123.jsonl",
        "cwd": "/Users/me/my-project", "permission_mode": "default", "hook_event_name": "PreToolUse",
        "tool_name": "Bash", "tool_input": {"command": "npm test", "description": "Run the test suite"},
        "tool_use_id": call, "prompt_id": prompt,
    }


def claude_post(session: str = "abc123", call: str = "toolu_01ABC") -> dict[str, Any]:
    event = claude_pre(session, call)
    event.update(hook_event_name="PostToolUse", tool_response={"stdout": "ok", "stderr": "", "interrupted": False})
    return event


def codex_pre(session: str = "019d036d-c7fa-72d2", call: str = "call_1", turn: str = "turn-1") -> dict[str, Any]:
    return {
        "session_id": session, "turn_id": turn, "transcript_path": None, "cwd": "/home/me/repo",
        "hook_event_name": "PreToolUse", "model": "gpt-5.1-codex", "permission_mode": "default",
        "tool_name": "Bash", "tool_input": {"command": "cargo test"}, "tool_use_id": call,
    }


def codex_post(session: str = "019d036d-c7fa-72d2", call: str = "call_1") -> dict[str, Any]:
    event = codex_pre(session, call)
    event.update(hook_event_name="PostToolUse", tool_response="test result: ok")
    return event


def gemini_pre(session: str = "gemini-session-1") -> dict[str, Any]:
    return {
        "session_id": session, "transcript_path": "/home/me/.gemini/tmp/chats/session.json", "cwd": "/home/me/repo",
        "hook_event_name": "BeforeTool", "timestamp": "2026-01-15T10:00:00.000Z",
        "tool_name": "run_shell_command", "tool_input": {"command": "ls -la"},
    }


def gemini_post(session: str = "gemini-session-1") -> dict[str, Any]:
    event = gemini_pre(session)
    event.update(hook_event_name="AfterTool", tool_response={"llmContent": "total 0", "returnDisplay": "total 0"})
    return event


def cursor_common(event: str, conversation: str = "conv-123") -> dict[str, Any]:
    return {
        "hook_event_name": event, "conversation_id": conversation, "generation_id": "gen-456",
        "workspace_roots": ["/path/to/project"], "model": "gpt-4", "cursor_version": "2.0.77",
    }


def cursor_pre(conversation: str = "conv-123", call: str = "tool-1") -> dict[str, Any]:
    return {**cursor_common("preToolUse", conversation), "tool_name": "Shell",
            "tool_input": {"command": "npm install express"}, "tool_use_id": call, "cwd": "/path/to/project"}


def cursor_shell(conversation: str = "conv-123") -> dict[str, Any]:
    return {**cursor_common("beforeShellExecution", conversation), "command": "npm install express",
            "cwd": "/path/to/project"}


def cursor_mcp(conversation: str = "conv-123") -> dict[str, Any]:
    return {**cursor_common("beforeMCPExecution", conversation), "tool_name": "database_query",
            "tool_input": json.dumps({"query": "SELECT * FROM users"}), "command": "npx my-mcp"}


PRE = {"claude-code": claude_pre, "codex": codex_pre, "gemini": gemini_pre, "cursor": cursor_pre}
POST = {"claude-code": claude_post, "codex": codex_post, "gemini": gemini_post}
