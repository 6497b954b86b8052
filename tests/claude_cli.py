"""A scripted stand-in for the Claude Code CLI behind the Claude Agent SDK's public `Transport`.

The SDK's real `query()` / `ClaudeSDKClient` talk to it over the SDK's own
control protocol: `initialize` registers the SDK's hook callbacks (with
their matchers); for each tool use the model's script asks for, this CLI
sends a `hook_callback` request per matching `PreToolUse` callback, runs
the tool body only when no answer denied it, then the `PostToolUse` (or
`PostToolUseFailure`) callbacks; it hands the model (`model_inputs`) the
tool results as the CLI does: a denial's `permissionDecisionReason` as an
error result, each `additionalContext` beside the results; an answer with
`continue: false` ends the turn with its `stopReason`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from claude_agent_sdk import Transport

FINAL = "It is sunny."
ToolUse = tuple[str, dict[str, Any]]


class ScriptedCLI(Transport):
    """`script`: one entry per model turn, a list of tool uses or a final text; `tools`: the bodies."""

    def __init__(
        self, script: list[list[ToolUse] | str], tools: dict[str, Callable[..., Any]], session_id: str = "sess-1"
    ) -> None:
        self.script = list(script)
        self.tools = tools
        self.session_id = session_id
        self.model_inputs: list[list[dict[str, Any]]] = []  # what the model was sent after each tool turn
        self.hook_inputs: list[dict[str, Any]] = []
        self.stop_reasons: list[str] = []
        self._out: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._hooks: dict[str, list[dict[str, Any]]] = {}
        self._answers: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._turns: list[asyncio.Task[None]] = []

    # -- Transport -----------------------------------------------------------------------

    async def connect(self) -> None:
        return None

    def is_ready(self) -> bool:
        return True

    async def end_input(self) -> None:
        """Stdin closed: the CLI finishes the turns under way and exits (its output ends)."""
        await asyncio.gather(*self._turns)
        self._out.put_nowait(None)

    async def close(self) -> None:
        for turn in self._turns:
            turn.cancel()
        self._out.put_nowait(None)

    async def read_messages(self) -> AsyncIterator[dict[str, Any]]:
        while (message := await self._out.get()) is not None:
            yield message

    async def write(self, data: str) -> None:
        message = json.loads(data)
        kind = message.get("type")
        if kind == "control_request" and message["request"]["subtype"] == "initialize":
            self._hooks = message["request"].get("hooks") or {}
            self._send({"type": "control_response", "response": {
                "subtype": "success", "request_id": message["request_id"], "response": {"commands": []},
            }})
        elif kind == "control_response":
            response = message["response"]
            self._answers.pop(response["request_id"]).set_result(response.get("response") or {})
        elif kind == "user":
            self._turns.append(asyncio.create_task(self._turn()))

    # -- the CLI's side -----------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        self._out.put_nowait(message)

    async def _hook(self, event: str, tool: str, fields: dict[str, Any]) -> list[dict[str, Any]]:
        """Every matching callback's answer to `event` for one tool use."""
        answers = []
        for matcher in self._hooks.get(event, []):
            pattern = matcher.get("matcher")
            if pattern and not re.fullmatch(pattern, tool):
                continue
            for callback_id in matcher["hookCallbackIds"]:
                request_id = f"cli-{next(self._ids)}"
                self._answers[request_id] = asyncio.get_running_loop().create_future()
                data = {"hook_event_name": event, "tool_name": tool, **fields}
                self.hook_inputs.append(data)
                self._send({"type": "control_request", "request_id": request_id, "request": {
                    "subtype": "hook_callback", "callback_id": callback_id, "input": data,
                    "tool_use_id": fields["tool_use_id"],
                }})
                answers.append(await self._answers[request_id])
        return answers

    async def _use(
        self, tool: str, tool_input: dict[str, Any], base: dict[str, Any]
    ) -> tuple[dict[str, Any], list[str], str | None]:
        """One tool use: (its tool_result block, additional contexts, a stop reason)."""
        use_id = f"toolu_{uuid.uuid4().hex[:12]}"
        fields = {**base, "tool_input": tool_input, "tool_use_id": use_id}
        contexts, stop = [], None
        for answer in await self._hook("PreToolUse", tool, fields):
            if answer.get("continue") is False:
                stop = answer.get("stopReason", "")
            specific = answer.get("hookSpecificOutput") or {}
            if specific.get("permissionDecision") == "deny":
                reason = specific.get("permissionDecisionReason", "")
                return {"type": "tool_result", "tool_use_id": use_id, "content": reason, "is_error": True}, [], stop
        try:
            output, failed = self.tools[tool](**tool_input), False
        except Exception as error:  # the CLI reports a failed tool use to the model
            output, failed = f"Error: {error}", True
        post = {**fields, "error": output} if failed else {**fields, "tool_response": output}
        for answer in await self._hook("PostToolUseFailure" if failed else "PostToolUse", tool, post):
            context = (answer.get("hookSpecificOutput") or {}).get("additionalContext")
            if context:
                contexts.append(context)
        result = {"type": "tool_result", "tool_use_id": use_id, "content": str(output), "is_error": failed}
        return result, contexts, stop

    async def _turn(self) -> None:
        """Answer one user prompt: tool turns from the script until a text (or a stop), then a result."""
        base = {
            "session_id": self.session_id, "transcript_path": "/dev/null", "cwd": "/", "prompt_id": str(uuid.uuid4()),
        }
        turns, stop, text = 0, None, FINAL
        while self.script:
            step = self.script.pop(0)
            if isinstance(step, str):
                text = step
                break
            turns += 1
            results, contexts = [], []
            for tool, tool_input in step:
                result, extra, halt = await self._use(tool, tool_input, base)
                results.append(result)
                contexts += extra
                stop = halt if halt is not None else stop
            self.model_inputs.append([*results, *({"type": "text", "text": c} for c in contexts)])
            self._send({"type": "user", "message": {"role": "user", "content": results}})
            if stop is not None:
                self.stop_reasons.append(stop)
                break
        if stop is None:
            self._send({"type": "assistant", "message": {
                "role": "assistant", "model": "scripted", "content": [{"type": "text", "text": text}],
            }})
        self._send({
            "type": "result", "subtype": "success", "duration_ms": 1, "duration_api_ms": 1, "is_error": False,
            "num_turns": turns, "session_id": self.session_id, "result": stop if stop is not None else text,
            "stop_reason": "stop_sequence" if stop is not None else "end_turn",
        })
