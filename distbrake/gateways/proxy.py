"""`distbrake proxy`: one upstream MCP server mirrored by FastMCP's own proxy, the brake in front of every call.

`build_proxy(upstream, brake)` is `fastmcp.server.create_proxy(upstream)` with
three layers added, so tools, resources, prompts, progress notifications and
`_meta` pass through as FastMCP's proxy passes them:

* `GatewayMiddleware` (outermost FastMCP middleware): the gateway's own
  answers as tool errors: a halted session (a `LoopBrakeError` of kind
  `"halt"`) gets an error result saying so, a call naming no session under
  `require_session` and a brake failure that the failure policy turns into an
  error get their one-line text; anything the upstream raises passes through
  unchanged;
* `distbrake.integrations.fastmcp.LoopBrakeMiddleware` with the gateway's
  session rule (`distbrake.gateways.sessions`): every `tools/call` the
  proxy serves, unknown tools included (the tool name as sent, the arguments
  as sent), is checked before it is forwarded;
* `MalformedCalls`, on the MCP server under FastMCP (it runs before the
  request is validated): a `tools/call` whose arguments are not a JSON object
  (or whose name is not a string) is counted too, with its own identity: the
  tool name as sent and the raw argument text. Allowed, it gets the
  protocol's invalid-params error as it would without the proxy; repeated,
  it is refused with the brake's text as a tool error.
"""

from __future__ import annotations

from typing import Any

from ..errors import DistbrakeError, LoopBrakeError
from ..wrap import Brake, acheck

try:
    import mcp_types as mt
    from fastmcp import FastMCP
    from fastmcp.client.transports import ClientTransport
    from fastmcp.exceptions import ToolError
    from fastmcp.server import create_proxy
    from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
    from fastmcp.tools import ToolResult
    from mcp.server.context import CallNext as ServerCallNext
    from mcp.server.context import HandlerResult, ServerRequestContext
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        'distbrake proxy needs FastMCP (fastmcp >= 4): pip install "distbrake[fastmcp]"'
    ) from error

from ..integrations import fastmcp as fastmcp_adapter
from ..integrations import mcp as mcp_adapter
from .calls import RAW_ARGUMENTS_KEY, halt_text, malformed_call, refusal_text
from .sessions import GatewaySessions

__all__ = ["GatewayMiddleware", "MalformedCalls", "build_proxy"]

_PRINCIPAL = mcp_adapter.PRINCIPAL_PREFIX

CallToolContext = MiddlewareContext[mt.CallToolRequestParams]


def _split(found: str | None) -> tuple[str | None, str | None]:
    """(principal, transport session) from what the adapters' steps 3-4 found."""
    if found is None:
        return None, None
    return (found, None) if found.startswith(_PRINCIPAL) else (None, found)


def fastmcp_session(sessions: GatewaySessions, context: CallToolContext) -> str:
    """The session of a FastMCP `tools/call` under the gateway's rule."""
    fastmcp_context = context.fastmcp_context
    request = fastmcp_context.request_context if fastmcp_context is not None else None
    meta = request.meta if request is not None else None
    principal, transport = _split(fastmcp_adapter.resolve_session(context, meta_key=None))
    return sessions.resolve(meta, principal, lambda: transport)


def lowlevel_session(sessions: GatewaySessions, ctx: ServerRequestContext[Any, Any]) -> str:
    """The session of a raw (not yet validated) `tools/call` under the gateway's rule."""
    principal, transport = _split(mcp_adapter.resolve_session(ctx, meta_key=None))
    return sessions.resolve(mcp_adapter.request_meta(ctx), principal, lambda: transport)


class GatewayMiddleware(Middleware):
    """The gateway's own refusals as tool errors (see the module text); upstream errors pass unchanged."""

    async def on_call_tool(
        self, context: CallToolContext, call_next: CallNext[mt.CallToolRequestParams, ToolResult]
    ) -> ToolResult:
        try:
            return await call_next(context)
        except ToolError as raised:
            cause = raised.__cause__
            if isinstance(cause, LoopBrakeError) and cause.kind == "halt":
                raise ToolError(halt_text(cause)) from cause
            raise
        except DistbrakeError as error:  # no session under require_session, fail-closed brake failure
            raise ToolError(str(error)) from error


class MalformedCalls:
    """A `Server.middleware` (before validation) that brakes malformed `tools/call` requests."""

    def __init__(self, brake: Brake, sessions: GatewaySessions) -> None:
        self.brake = brake
        self.sessions = sessions

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: ServerCallNext) -> HandlerResult:
        if ctx.method != "tools/call" or ctx.request_id is None:
            return await call_next(ctx)
        identity = malformed_call(ctx.params)
        if identity is None:
            return await call_next(ctx)
        tool, raw = identity
        try:
            session = lowlevel_session(self.sessions, ctx)
            await acheck(self.brake, tool, {RAW_ARGUMENTS_KEY: raw}, session_id=session, call_id=None)
        except LoopBrakeError as error:
            return _error_result(refusal_text(error))
        except DistbrakeError as failed:  # no session under require_session, fail-closed brake failure
            return _error_result(str(failed))
        return await call_next(ctx)


def _error_result(text: str) -> dict[str, Any]:
    result = mt.CallToolResult(content=[mt.TextContent(type="text", text=text)], is_error=True)
    return result.model_dump(mode="json", by_alias=True, exclude_none=True)


def build_proxy(
    upstream: ClientTransport | FastMCP[Any] | str,
    brake: Brake,
    *,
    sessions: GatewaySessions | None = None,
    name: str = "distbrake-proxy",
) -> FastMCP[Any]:
    """A FastMCP server mirroring `upstream` (a transport, a Streamable HTTP URL, or a FastMCP server) behind `brake`.

    `sessions` is the session rule (default: `GatewaySessions()`); its scope
    is the middleware's.
    """
    rule = sessions if sessions is not None else GatewaySessions()
    proxy: FastMCP[Any] = create_proxy(upstream, name=name)
    proxy.add_middleware(GatewayMiddleware())
    proxy.add_middleware(
        fastmcp_adapter.LoopBrakeMiddleware(
            brake, scope=rule.scope, session_id=lambda context: fastmcp_session(rule, context),
            meta_key=rule.meta_key, run_key=rule.run_key,
        )
    )
    # FastMCP has no public seam before validation: its low-level MCP server's middleware list is one.
    proxy._mcp_server.middleware.append(MalformedCalls(brake, rule))
    return proxy
