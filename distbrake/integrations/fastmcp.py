"""The loop brake as FastMCP middleware (fastmcp >= 4).

::

    from fastmcp import FastMCP
    from distbrake import DistributedBrake
    from distbrake.integrations.fastmcp import LoopBrakeMiddleware

    mcp = FastMCP("search", middleware=[LoopBrakeMiddleware(DistributedBrake.from_url(url))])

`on_call_tool` checks every `tools/call` before the tool runs. A denied call
raises `fastmcp.exceptions.ToolError(str(error))` (chained from the
`LoopBrakeError`), which FastMCP returns as an ordinary tool error: the client
gets `is_error=True` with the brake's text, unmasked even under
`mask_error_details=True` (`fastmcp.Client.call_tool` raises it as a
`ToolError` unless called with `raise_on_error=False`). A plain exception
would reach the client as a JSON-RPC "Internal server error" instead. A
server cannot end its client's run: a halted session (`LoopBrakeHalt`) gets
that tool error, saying the session is halted, for this and every later call
of any tool. A tool error (a raised exception, an `is_error` result) is a
failed call for a tool with `max_failures`.

Which session a call belongs to -- the stateless-MCP trap
---------------------------------------------------------
Under the current MCP protocol (2026-07-28, which `fastmcp.Client` negotiates
by default) every request is its own connection, so `ctx.session_id` is a new
UUID on every call. A brake keyed on it never sees a second call of the same
session and never fires. The session is therefore, first match wins:

1. `session_id(context)` (the `MiddlewareContext`), when you pass one and it
   returns a non-empty str;
2. the client's `_meta` entry `meta_key` (default `"session_id"`):
   `await client.call_tool("search", {...}, meta={"session_id": thread_id})`,
   read from `context.fastmcp_context.request_context.meta`. On an
   authenticated request it is scoped by the principal
   (`"principal:<client_id>:<issuer>:<subject>/<session_id>"`), so a client
   can only touch its own principal's streaks;
3. the authenticated principal (`get_access_token()`:
   `"principal:<client_id>:<issuer>:<subject>"`);
4. `ctx.session_id` (as `"mcp-session:<id>"`), but only where the protocol
   keeps a session: a handshake-era (2025-11-25 or older, `mode="legacy"`)
   connection that is stateful Streamable HTTP or one long-lived stream
   (stdio, in-memory). Never under 2026-07-28, never on stateless HTTP;
5. otherwise distbrake's own rule: a session bound with `bind_session`, else
   `"default"` (one streak shared by every caller of the server).

The server cannot see the client's agent runs, so the session is whatever
the client names; `scope` says what a run id the client sends (`_meta` entry
`run_key`, default `"run_id"`) does: under `scope="run"` (the default) the
session of steps 2-4 becomes `"<session>/run/<run_id>"`, one streak per run;
under `scope="conversation"` it is ignored. Without one, both scopes are the
session above.

`ctx.client_id` is not used: it is a `_meta` value the client sets, not an
identity. The JSON-RPC request id is not a call id either (it is unique per
connection only); a retrying client may send `_meta` entry `call_id_key`
(default `"call_id"`): the same call id with the same arguments in the same
session is counted once.

Warnings and progress-aware tools
---------------------------------
An allowed call whose verdict carries a warning (the brake's `warn_at`) gets
it appended to the `ToolResult` as one more `TextContent` block; the tool's
own content, `structured_content`, `meta` and `is_error` are kept. Nothing is
added in shadow mode (`enforce=False`). For a progress-aware tool
(`tools={"poll": {"progress": True}}`) the result (content, structured
content, error flag; never `meta`) or the exception the tool raised is
observed after `call_next`, so a poller whose result changes is never denied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

from ..errors import LoopBrakeError
from .kernel import requires
from .mcp import (
    DEFAULT_META_KEY,
    ToolCallGate,
    principal_session,
    session_for,
    transport_session,
)

with requires(__name__, "FastMCP (fastmcp >= 4)", "fastmcp"):
    import mcp_types as mt
    from fastmcp.exceptions import ToolError
    from fastmcp.server.dependencies import get_access_token
    from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
    from fastmcp.tools import ToolResult

__all__ = ["LoopBrakeMiddleware", "resolve_session"]

CallToolContext = MiddlewareContext[mt.CallToolRequestParams]
SessionIdFunction = Callable[[CallToolContext], object]


def _meta(context: CallToolContext) -> dict[str, Any] | None:
    fastmcp_context = context.fastmcp_context
    request = fastmcp_context.request_context if fastmcp_context is not None else None
    return request.meta if request is not None else None


def _transport(context: CallToolContext) -> str | None:
    fastmcp_context = context.fastmcp_context
    request = fastmcp_context.request_context if fastmcp_context is not None else None
    if fastmcp_context is None or request is None:
        return None
    return transport_session(
        request.session,
        request.request,
        request.protocol_version,
        stream_id=lambda: fastmcp_context.session_id,
    )


def resolve_session(
    context: CallToolContext, *, meta_key: str | None = DEFAULT_META_KEY
) -> str | None:
    """The default session of a `tools/call` (steps 2-4 of the module text), or None."""
    return session_for(
        _meta(context),
        meta_key,
        principal_session(get_access_token()),
        lambda: _transport(context),
    )


def _refuse(error: LoopBrakeError) -> NoReturn:
    raise ToolError(str(error)) from error


def _with_warning(result: ToolResult, warning: str) -> ToolResult:
    block = mt.TextContent(type="text", text=warning)
    return result.model_copy(update={"content": [*result.content, block]})


class LoopBrakeMiddleware(ToolCallGate, Middleware):
    """Deny the Nth identical tool call in a row, before the tool runs.

    `brake` is any distbrake brake (`LoopBrake`, `DistributedBrake` -- run in a
    worker thread -- or `AsyncDistributedBrake`). `session_id(context)`
    overrides the session rule of the module text when it returns a str;
    `scope` says whether the client's run id qualifies the session; `meta_key`
    / `call_id_key` / `run_key` name the client `_meta` entries read for the
    session, the call id and the run id (None: don't read).
    """

    def session(self, context: CallToolContext) -> object:
        """The session this call is counted in (None: distbrake's bound session or "default")."""
        return self.session_in(context, _meta(context), lambda c: resolve_session(c, meta_key=self.meta_key))

    async def on_call_tool(
        self,
        context: CallToolContext,
        call_next: CallNext[mt.CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        result: ToolResult = await self.gated(
            context.message, self.session(context), _meta(context), lambda: call_next(context), _refuse,
            _with_warning,
        )
        return result
