"""Claude Agent SDK (claude-agent-sdk >= 0.2): hooks that put a brake in front of every tool use.

::

    from claude_agent_sdk import ClaudeAgentOptions, query
    from distbrake import AsyncDistributedBrake
    from distbrake.integrations.claude_agent_sdk import loop_brake_hooks

    brake = AsyncDistributedBrake.from_url("redis://localhost:6379/0")
    options = ClaudeAgentOptions(hooks=loop_brake_hooks(brake))

`loop_brake_hooks(brake)` returns `{"PreToolUse": [...], "PostToolUse":
[...], "PostToolUseFailure": [...]}` for `ClaudeAgentOptions(hooks=...)`
(merge it with your own hooks: the lists run side by side). The
`PreToolUse` hook checks every tool use before it runs (`matcher=` limits it
to some tools, as a `HookMatcher` matcher does):

* session (`scope="run"`, the default): the hook input's `session_id` (the
  Claude Code session: the whole conversation, across `query` turns and
  resumes) together with its `prompt_id` (the user prompt being answered),
  so one legitimate call per user turn is never a loop;
  `scope="conversation"`: the `session_id` alone; `session_id=`: a callable
  given the hook input (a `PreToolUseHookInput` dict) for anything else;
* call id: the hook input's `tool_use_id`, so a hook that sees one tool use
  twice counts it once;
* tool and arguments: `tool_name` and `tool_input`, as the CLI sends them.

On denial the tool does not run, and the hook answers
`permissionDecision: "deny"` with the brake's text as
`permissionDecisionReason`, which the CLI hands the model as the tool's
error result:

* `on_deny="message"` (default): the run goes on;
* `on_deny="raise"`: the answer also sets `continue: false` with the brake's
  text as `stopReason`, so Claude stops after this call, the SDK's own way
  of ending a run from a hook (the result message ends the `query`). Nothing
  is raised: a hook that raises is a hook failure, which the CLI counts as no
  decision under the default `on_failure` and runs the tool anyway. For the
  same reason a brake whose backend is down under the `closed` failure
  policy denies the call with the `BrakeUnavailableError` text (raised, it
  would let the tool run).

A halt (`LoopBrakeHalt`) answers `continue: false` (the halt text as
`stopReason`) whatever `on_deny` says: the query's result is the halt.

Warnings and progress-aware tools: the `PostToolUse` hook (or
`PostToolUseFailure`, when the tool failed) of an allowed call whose verdict
carries a warning (the brake's `warn_at`; none in shadow mode) answers the
warning as `additionalContext`, which the model reads beside the tool's
result (the result is not touched). For a progress-aware tool (`tools={"poll":
{"progress": True}}`) it observes `tool_response` (a failure as one kind of
result, whatever its text). The verdict waits for its post hook in a map
keyed by `tool_use_id`, capped at 4096 calls (a use that never reaches a
post hook, such as one another hook denied, is dropped from it in time).

Every brake kind works (the hooks are async): `AsyncDistributedBrake` is
awaited, `DistributedBrake` runs in a worker thread, `LoopBrake` inline.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import BrakeUnavailableError, LoopBrakeError
from ..wrap import Brake
from .kernel import AdapterOptions, OnDeny, Pending, Scope, SessionIdFunction, requires, scoped_session, settle

with requires(__name__, "the Claude Agent SDK 0.2 or newer", "claude-agent-sdk"):
    from claude_agent_sdk import HookContext, HookInput, HookJSONOutput, HookMatcher
    from claude_agent_sdk.types import (
        HookEvent,
        PostToolUseFailureHookSpecificOutput,
        PostToolUseHookSpecificOutput,
        PreToolUseHookSpecificOutput,
        SyncHookJSONOutput,
    )

__all__ = ["OnDeny", "ToolUseFailed", "loop_brake_hooks"]

PENDING_LIMIT = 4096


class ToolUseFailed(Exception):
    """What a progress-aware tool's failed use is observed as (`PostToolUseFailure`; never its text)."""


class _Hooks(AdapterOptions):
    """The brake and options behind one `loop_brake_hooks` call, and its allowed calls awaiting their post hook."""

    on_deny: OnDeny

    def configure(self, brake: Brake, on_deny: str, scope: Scope, session_id: SessionIdFunction | None) -> None:
        AdapterOptions.configure(self, brake, on_deny, scope, session_id)
        self.pending = Pending(PENDING_LIMIT)

    def session_of(self, data: Mapping[str, Any]) -> object:
        return self.pick_session(data, lambda d: scoped_session(self.scope, d.get("session_id"), d.get("prompt_id")))

    def deny(self, error: LoopBrakeError | BrakeUnavailableError) -> HookJSONOutput:
        text = str(error)
        refusal: PreToolUseHookSpecificOutput = {
            "hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": text,
        }
        output: SyncHookJSONOutput = {"hookSpecificOutput": refusal}
        if self.ends_run(error):
            output["continue_"] = False
            output["stopReason"] = text
        return output

    async def pre_tool_use(
        self, data: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        """Check the tool use: `{}` lets it run, a deny answer refuses it."""
        fields: Mapping[str, Any] = data
        if fields["hook_event_name"] != "PreToolUse":
            return {}
        call_id = fields.get("tool_use_id") or tool_use_id
        try:
            verdict, error = await self.screen(
                fields["tool_name"], fields["tool_input"], session_id=self.session_of(fields), call_id=call_id,
            )
        except BrakeUnavailableError as unavailable:
            return self.deny(unavailable)
        if error is not None:
            return self.deny(error)
        self.pending.keep(call_id, verdict)
        return {}

    async def post_tool_use(
        self, data: HookInput, tool_use_id: str | None, context: HookContext
    ) -> HookJSONOutput:
        """Observe a progress-aware tool's result; answer the warning as additional context."""
        fields: Mapping[str, Any] = data
        event = fields["hook_event_name"]
        if event == "PostToolUse":
            result: object = fields["tool_response"]
        elif event == "PostToolUseFailure":
            result = ToolUseFailed()
        else:
            return {}
        verdict = self.pending.take(str(fields.get("tool_use_id") or tool_use_id or ""))
        if verdict is None:
            return {}
        warning = await settle(self.brake, verdict, result)
        if warning is None:
            return {}
        note: PostToolUseHookSpecificOutput | PostToolUseFailureHookSpecificOutput
        if event == "PostToolUse":
            note = {"hookEventName": "PostToolUse", "additionalContext": warning}
        else:
            note = {"hookEventName": "PostToolUseFailure", "additionalContext": warning}
        return {"hookSpecificOutput": note}


def loop_brake_hooks(
    brake: Brake,
    *,
    on_deny: OnDeny = "message",
    scope: Scope = "run",
    session_id: SessionIdFunction | None = None,
    matcher: str | None = None,
    timeout: float | None = None,
) -> dict[HookEvent, list[HookMatcher]]:
    """The hooks for `ClaudeAgentOptions(hooks=...)` (see the module text).

    `matcher` (a tool name or `"A|B"`; None: every tool) and `timeout` (seconds
    per hook call, the SDK's default when None) go to each `HookMatcher`.
    """
    hooks = _Hooks(brake, on_deny=on_deny, scope=scope, session_id=session_id)
    return {
        "PreToolUse": [HookMatcher(matcher=matcher, hooks=[hooks.pre_tool_use], timeout=timeout)],
        "PostToolUse": [HookMatcher(matcher=matcher, hooks=[hooks.post_tool_use], timeout=timeout)],
        "PostToolUseFailure": [HookMatcher(matcher=matcher, hooks=[hooks.post_tool_use], timeout=timeout)],
    }
