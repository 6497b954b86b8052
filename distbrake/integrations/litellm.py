"""The loop brake as a LiteLLM proxy guardrail (litellm >= 1.110): MCP tool calls through LiteLLM's gateway.

Configured the way LiteLLM documents custom guardrails, in its `config.yaml`::

    guardrails:
      - guardrail_name: distbrake
        litellm_params:
          guardrail: distbrake.integrations.litellm.LoopBrakeGuardrail
          mode: [pre_mcp_call, post_mcp_call]
          default_on: true
          url: os.environ/DISTBRAKE_URL      # the fleet's Redis (default: $DISTBRAKE_URL)

* `pre_mcp_call`: every MCP `tools/call` LiteLLM's MCP gateway forwards is
  checked before it runs; a denied one fails with the brake's text (LiteLLM
  answers the MCP client with that error: HTTP 400 `{"error": "loop brake:
  ..."}` inside LiteLLM, a tool error on the MCP wire);
* `post_mcp_call`: the tool's result (its texts) is observed for a
  progress-aware tool (`DISTBRAKE_TOOLS='{"poll": {"progress": true}}'`), so a
  poller whose result changes is never denied;
* `post_call` (opt-in, add it to `mode`): the tool calls a model returns in a
  chat completion are checked too. This is what LiteLLM's `post_call` is: a
  denied tool call fails **the whole completion response** (HTTP 400 with the
  brake's text), not one tool call; use it for agents whose tools run outside
  LiteLLM's MCP gateway, knowing the agent loses the entire model turn.

Which session a call belongs to, first match wins: the `x-litellm-session-id`
header; the `x-litellm-trace-id` header; otherwise the caller LiteLLM
authenticated (its virtual key's hash, `"litellm-key:<hash>"`, else its user
id, `"litellm-user:<id>"`); otherwise one shared session `"default"` with a
WARNING once (`require_session: true` refuses instead). A session named by a
header is scoped by the caller when there is one
(`"litellm-user:<id>/<session>"`), so a caller never touches another's
streaks. LiteLLM's own tools/list scans (its catalog guard runs `pre_mcp_call`
guardrails over every listed tool) are not calls and are not counted. Arguments and results never leave the process.

A halted session (`LoopBrakeHalt`; LiteLLM has no run of its own to end) is
refused with the halt text for every later call, any tool, MCP or in a
completion.

A brake failure follows the brake's failure policy (`DISTBRAKE_ON_BACKEND_ERROR`);
a call the guardrail cannot read (no tool name) is let through.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import quote

from ..errors import DistbrakeError, LoopBrakeError
from ..wrap import Brake, acheck, aobserve
from .kernel import requires

with requires(__name__, "LiteLLM's proxy (litellm >= 1.110)", "litellm"):
    from fastapi import HTTPException
    from litellm.integrations.custom_guardrail import CustomGuardrail
    from litellm.types.guardrails import GuardrailEventHooks
    from litellm.types.utils import GenericGuardrailAPIInputs

from ..gateways.calls import call_identity, refusal_text
from ..gateways.sessions import GatewaySessions

__all__ = ["SESSION_HEADERS", "LoopBrakeGuardrail"]

SESSION_HEADERS = ("x-litellm-session-id", "x-litellm-trace-id")
_VERDICT = "distbrake_verdict"  # where a progress-aware call's verdict waits for its result (never serialized)
_MAX_ARGUMENT_TEXT = 1 << 20


def _headers(data: Mapping[str, Any]) -> dict[str, str]:
    metadata = data.get("metadata")
    headers = metadata.get("headers") if isinstance(metadata, Mapping) else None
    if not isinstance(headers, Mapping):
        return {}
    return {str(k).lower(): v for k, v in headers.items() if isinstance(v, str)}


def _usable(value: object) -> str | None:
    return value if isinstance(value, str) and 0 < len(value) <= 256 else None


def _key(data: Mapping[str, Any]) -> str | None:
    """The caller LiteLLM authenticated: its virtual key's hash, else its user id (percent-quoted)."""
    metadata = data.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    for kind, name in (("key", "user_api_key_hash"), ("user", "user_api_key_user_id")):
        found = _usable(data.get(name)) or _usable(metadata.get(name))
        if found is not None:
            return f"litellm-{kind}:{quote(found, safe='')}"
    return None


def _is_tool_call(logging_obj: object, data: Mapping[str, Any]) -> bool:
    """A `tools/call` LiteLLM forwards, not its catalog guard's scan of a `tools/list`.

    LiteLLM 1.110 builds the call's guardrail data with a `litellm_logging_obj`
    entry (the call's logger, `call_type` "call_mcp_tool"); the scan of a listed
    tool has none, or the listing's logger (`call_type` "list_mcp_tools").
    """
    if "litellm_logging_obj" not in data and logging_obj is None:
        return False
    holder = logging_obj if logging_obj is not None else data.get("litellm_logging_obj")
    return getattr(holder, "call_type", None) != "list_mcp_tools"


def _refuse(text: str) -> HTTPException:
    return HTTPException(status_code=400, detail={"error": text})


class LoopBrakeGuardrail(CustomGuardrail):
    """Deny the Nth identical MCP tool call in a row through LiteLLM's proxy (see the module text).

    `url` (or `brake`, any async-capable distbrake brake) is the fleet's
    backend; `require_session` refuses a call that names no session; the rest
    (`guardrail_name`, `event_hook`/`mode`, `default_on`) is LiteLLM's.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        brake: Brake | None = None,
        require_session: bool = False,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault(
            "supported_event_hooks",
            [GuardrailEventHooks.pre_mcp_call, GuardrailEventHooks.post_mcp_call, GuardrailEventHooks.post_call],
        )
        super().__init__(**kwargs)
        if brake is None:
            from ..redis.aio import AsyncDistributedBrake

            brake = AsyncDistributedBrake.from_url(url)
        elif not callable(getattr(brake, "check", None)):
            raise TypeError(f"brake must have a check method, not {type(brake).__name__}")
        self.brake: Brake = brake
        self.sessions = GatewaySessions(require_session=require_session, scope="conversation")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(guardrail_name={self.guardrail_name!r}, brake={self.brake!r})"

    def session(self, data: Mapping[str, Any]) -> str:
        """The session of a LiteLLM request (see the module text)."""
        headers = _headers(data)
        named = next((headers[name] for name in SESSION_HEADERS if headers.get(name)), None)
        return self.sessions.resolve({"session_id": named} if named else None, _key(data))

    async def _check(self, tool: object, arguments: object, data: Mapping[str, Any]) -> Any:
        name, args, _ = call_identity(tool, arguments)
        try:
            return await acheck(self.brake, name, args, session_id=self.session(data))
        except LoopBrakeError as denied:
            raise _refuse(refusal_text(denied)) from None
        except DistbrakeError as failed:  # no session under require_session, a fail-closed brake failure
            raise _refuse(str(failed)) from None

    async def apply_guardrail(
        self,
        inputs: GenericGuardrailAPIInputs,
        request_data: dict[str, Any],
        input_type: Literal["request", "response"],
        logging_obj: Any = None,
    ) -> GenericGuardrailAPIInputs:
        """LiteLLM's unified guardrail seam: an MCP call before it runs, its result, or a completion's tool calls."""
        if input_type == "request":
            tool = request_data.get("mcp_tool_name")
            if not tool or not _is_tool_call(logging_obj, request_data):
                return inputs  # not an MCP tool call (a chat request, a tools/list scan): nothing to count
            verdict = await self._check(tool, request_data.get("mcp_arguments"), request_data)
            if getattr(verdict, "observe_token", None) is not None:
                holder = logging_obj if logging_obj is not None else request_data.get("litellm_logging_obj")
                details = getattr(holder, "model_call_details", None)
                if isinstance(details, dict):
                    details[_VERDICT] = verdict
            return inputs
        verdict = request_data.pop(_VERDICT, None)
        if verdict is not None:  # post_mcp_call: the result of a progress-aware tool
            await aobserve(self.brake, verdict, list(inputs.get("texts") or []))
            return inputs
        for call in inputs.get("tool_calls") or []:  # post_call: a completion's tool calls
            function = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(function, Mapping):
                continue
            await self._check(function.get("name"), _arguments(function.get("arguments")), request_data)
        return inputs


def _arguments(raw: object) -> object:
    """A model's tool-call arguments (JSON text) as the object they name; malformed text stays text."""
    if isinstance(raw, str) and len(raw) <= _MAX_ARGUMENT_TEXT:
        try:
            parsed = json.loads(raw)
        except (ValueError, RecursionError):
            return raw
        return parsed if isinstance(parsed, dict) else raw
    return raw
