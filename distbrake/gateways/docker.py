"""The Docker MCP Gateway interceptor: docker/mcp-gateway's `--interceptor before:http:URL` / `after:http:URL`.

No framework: `DockerInterceptor.before(body)` and `.after(body)` take the
bytes the gateway POSTs and return the bytes to answer with (HTTP 200). The
gateway (`pkg/interceptors/interceptors.go`, `runHTTP`) ignores the status
code and reads the body: an empty body lets the call through, a non-empty
one must be a JSON `CallToolResult` and replaces the call's result.

`before` receives the gateway's `json.Marshal` of the go-sdk's
`*mcp.CallToolRequest`: `{"Session": {}, "Params": {"_meta": {...}, "name":
"...", "arguments": {...}}, "Extra": null}` (Go field names; `Extra`, when
present, carries `TokenInfo` and the HTTP `Header`). The shape
`{"method": "tools/call", "params": {...}}` is read too (keys are matched
case-insensitively, as Go's decoder does). The call is checked against the
brake: allowed, the answer is empty; denied, it is
`{"content": [{"type": "text", "text": "<the brake's text>"}], "isError": true}`.
A call whose arguments are not a JSON object is counted with its own
identity (tool name as sent, raw argument text), as `distbrake proxy` does.

The session is `distbrake.gateways.sessions`' rule on `Params._meta`, with
`Extra.TokenInfo.UserID` as the principal and the `Mcp-Session-Id` header of
`Extra.Header` as the handshake-era session.

`after` receives only the `CallToolResult` (the gateway sends nothing of the
request with it), so it cannot tell which call a result answers: it answers
empty (the result passes unchanged) and observes nothing. Progress-aware tools
and failure streaks therefore need `distbrake proxy`, not this interceptor.

A body that is not such a request is let through (empty answer) and logged
without its content, unless the brake fails closed (`on_backend_error=
"closed"`), which refuses it. A brake failure follows the brake's failure policy.

Mounting it on an HTTP server (`distbrake serve`, or any ASGI app): one
`DockerInterceptor(brake, GatewaySessions(require_session=...))` per server,
on the server's async brake; `POST /docker/before` answers
`await interceptor.before(body)` and `POST /docker/after` answers
`await interceptor.after(body)`, both HTTP 200 with those bytes as the body
(`Content-Type: application/json` when not empty). Never answer an error
status with a body: the gateway would try to read it as a `CallToolResult`
and fail the call.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ..errors import DistbrakeError, LoopBrakeError
from ..wrap import Brake, acheck
from .calls import call_identity, refusal_text
from .sessions import GatewaySessions

__all__ = ["MAX_BODY_BYTES", "DockerInterceptor", "refusal_body"]

logger = logging.getLogger("distbrake")

MAX_BODY_BYTES = 16 * 1024 * 1024
_TRANSPORT_PREFIX = "mcp-session:"  # as distbrake.integrations.mcp names them (that module needs the mcp extra)
_PRINCIPAL_PREFIX = "principal:"


def refusal_body(text: str) -> bytes:
    """The `CallToolResult` JSON that refuses a call with `text`."""
    return json.dumps({"content": [{"type": "text", "text": text}], "isError": True},
                      ensure_ascii=False).encode("utf-8")


def _get(mapping: Mapping[str, Any], key: str) -> Any:
    """`mapping[key]`, matched case-insensitively as Go's encoding/json does (exact match first)."""
    if key in mapping:
        return mapping[key]
    lowered = key.lower()
    for name, value in mapping.items():
        if isinstance(name, str) and name.lower() == lowered:
            return value
    return None


def _principal(extra: object) -> str | None:
    """The gateway's authenticated user, as the MCP adapters name a principal with only a subject."""
    token = _get(extra, "TokenInfo") if isinstance(extra, Mapping) else None
    user = _get(token, "UserID") if isinstance(token, Mapping) else None
    if not isinstance(user, str) or not user or len(user) > 256:
        return None
    return f"{_PRINCIPAL_PREFIX}::{quote(user, safe='')}"


def _handshake_session(extra: object) -> str | None:
    headers = _get(extra, "Header") if isinstance(extra, Mapping) else None
    values = _get(headers, "Mcp-Session-Id") if isinstance(headers, Mapping) else None
    value = values[0] if isinstance(values, list) and values else values
    if isinstance(value, str) and 0 < len(value) <= 256:
        return _TRANSPORT_PREFIX + value
    return None


class DockerInterceptor:
    """The brake as docker/mcp-gateway's HTTP interceptor (see the module text)."""

    def __init__(self, brake: Brake, sessions: GatewaySessions | None = None) -> None:
        if not callable(getattr(brake, "check", None)):
            raise TypeError(f"brake must have a check method, not {type(brake).__name__}")
        self.brake = brake
        self.sessions = sessions if sessions is not None else GatewaySessions()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(brake={self.brake!r}, sessions={self.sessions!r})"

    def _bad_input(self, why: str) -> bytes:
        settings = getattr(self.brake, "settings", None)
        if getattr(settings, "on_backend_error", None) == "closed":
            return refusal_body(f"loop brake: the interceptor could not read the call ({why}); refused (fail-closed)")
        logger.warning("distbrake docker interceptor: let a call through unchecked: %s", why)
        return b""

    async def before(self, body: bytes) -> bytes:
        """The answer to a `before:http:` POST: empty (let the call through) or a refusing `CallToolResult`."""
        if len(body) > MAX_BODY_BYTES:
            return self._bad_input(f"body over {MAX_BODY_BYTES} bytes")
        try:
            request = json.loads(body)
        except (ValueError, RecursionError):
            return self._bad_input("body is not JSON")
        if not isinstance(request, Mapping):
            return self._bad_input("body is not a JSON object")
        method = _get(request, "method")
        if method is not None and method != "tools/call":
            return b""  # the gateway only intercepts tools/call; anything else is not ours
        params = _get(request, "params")
        if not isinstance(params, Mapping):
            return self._bad_input("no params object")
        tool, args, _ = call_identity(_get(params, "name"), _get(params, "arguments"))
        meta = _get(params, "_meta")
        extra = _get(request, "Extra")
        try:
            session = self.sessions.resolve(meta if isinstance(meta, Mapping) else None, _principal(extra),
                                            lambda: _handshake_session(extra))
            await acheck(self.brake, tool, args, session_id=session)
        except LoopBrakeError as denied:
            return refusal_body(refusal_text(denied))
        except DistbrakeError as failed:  # no session under require_session; a fail-closed brake failure
            return refusal_body(str(failed))
        return b""

    async def after(self, body: bytes) -> bytes:
        """The answer to an `after:http:` POST: always empty (the result passes unchanged; see the module text)."""
        return b""
