"""The loop brake for the low-level MCP SDK server (`mcp.server.lowlevel.Server`, mcp >= 2.3).

Wrap the `tools/call` handler::

    from distbrake import DistributedBrake
    from distbrake.integrations.mcp import brake_call_tool

    brake = DistributedBrake.from_url("redis://redis:6379/0")
    server = Server("search", on_list_tools=list_tools,
                    on_call_tool=brake_call_tool(call_tool, brake))

or use the `Extension` (what `mcp.server.MCPServer(extensions=[...])` takes; on
a low-level server, fold it in with `compose_tool_call_handler`)::

    server = Server("search", on_list_tools=list_tools,
                    on_call_tool=compose_tool_call_handler([LoopBrakeExtension(brake)], call_tool))

(`Server.middleware` would work too, but the SDK marks it provisional, it sees
unvalidated params, and a result it returns skips the runner's serialisation.)

A denied call never reaches the handler: the client receives
`CallToolResult(content=[TextContent(text=str(error))], is_error=True)`, an
ordinary tool error its model can read ("loop brake: tool "search" called 3
times in a row with identical arguments (call 1a2b3c4d5e6f…, limit 3); ...").
A server cannot end its client's run: a halted session (`LoopBrakeHalt`)
gets that error result, saying the session is halted, for this and every
later call of any tool.

Which session a call belongs to -- the stateless-MCP trap
---------------------------------------------------------
Under the current protocol (2026-07-28, what `mcp.Client` and FastMCP's client
negotiate by default) every request is its own connection: the transport's
"session id" is new on every call (FastMCP's `ctx.session_id` is a fresh UUID
each time, the SDK's `Connection` is rebuilt per request). A brake keyed on it
sees every call as the first of a new session and never fires. So the session
is, first match wins:

1. `session_id(ctx)`, when you pass one and it returns a non-empty str;
2. the client's `_meta` entry `meta_key` (default `"session_id"`), e.g.
   `client.call_tool("search", {...}, meta={"session_id": thread_id})`. When
   the request is authenticated it is scoped by the principal
   (`"principal:<client_id>:<issuer>:<subject>/<session_id>"`), so a client
   can only ever touch its own principal's streaks;
3. the authenticated principal (`"principal:<client_id>:<issuer>:<subject>"`,
   from the bearer token);
4. the transport session (`"mcp-session:<id>"`), but only where the protocol
   keeps one: a handshake-era (2025-11-25 and older) connection that has a
   negotiated session id (stateful Streamable HTTP) or is one long-lived stream
   (stdio, in-memory). Never under 2026-07-28, never on stateless HTTP;
5. otherwise distbrake's own rule: a session bound with `bind_session`, else
   `"default"` (one streak shared by every caller of the server).

The server cannot see the client's agent runs, so the session is whatever
the client names. `scope` says what a run id the client sends (`_meta` entry
`run_key`, default `"run_id"`) does: under `scope="run"` (the default) the
session of steps 2-4 is qualified by it (`"<session>/run/<run_id>"`), so a
client that sends its thread and its run gets one streak per run; under
`scope="conversation"` it is ignored. Without a run id both scopes are the
session of steps 2-5: a client that names its run in `session_id` gets runs.

The JSON-RPC request id is not a call id (it is only unique per connection).
A client that retries a request may send `_meta` entry `call_id_key` (default
`"call_id"`): the same call id with the same arguments in the same session is
counted once.

Warnings and progress-aware tools
---------------------------------
An allowed call whose verdict carries a warning (the brake's `warn_at`) gets
it appended to the tool's result as one more `TextContent` block (the
tool's own content, `structuredContent`, `isError` and `_meta` are kept), so
the client's model reads when denial begins. Nothing is added in shadow mode
(`enforce=False`). For a progress-aware tool (`tools={"poll": {"progress":
True}}`) the result is observed after the handler returns (content,
structured content and the error flag, never `_meta`), or the exception it
raised, so a poller whose result changes is never denied. For a tool with
`max_failures` an exception or an `isError` result is a failed call.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import quote
from uuid import uuid4

from ..errors import LoopBrakeError
from ..wrap import Brake
from .kernel import AdapterOptions, Scope, requires, run_allowed, scoped_session, warning_of

with requires(__name__, "the MCP SDK (mcp >= 2.3)", "mcp"):
    import mcp_types as types
    from mcp.server.auth.middleware.auth_context import get_access_token
    from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
    from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
    from mcp.server.extension import Extension
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

__all__ = [
    "DEFAULT_CALL_ID_KEY",
    "DEFAULT_META_KEY",
    "DEFAULT_RUN_KEY",
    "LoopBrakeExtension",
    "brake_call_tool",
    "denial_result",
    "principal_session",
    "request_meta",
    "resolve_session",
    "session_for",
    "transport_session",
    "with_warning",
]

DEFAULT_META_KEY = "session_id"
DEFAULT_CALL_ID_KEY = "call_id"
DEFAULT_RUN_KEY = "run_id"
TRANSPORT_PREFIX = "mcp-session:"
PRINCIPAL_PREFIX = "principal:"
_CONNECTION_KEY = "distbrake.session_id"

Context = ServerRequestContext[Any, Any]
SessionIdFunction = Callable[[Context], object]
CtxT = TypeVar("CtxT", bound=ServerRequestContext[Any, Any])
ResultT = TypeVar("ResultT")


# -- session resolution (shared with distbrake.integrations.fastmcp) ------------------


def id_value(value: object) -> str | None:
    """A usable id from a `_meta` value: a non-empty str or an int; anything else is ignored."""
    if isinstance(value, str):
        return value or None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def meta_value(meta: Mapping[str, Any] | None, key: str | None) -> str | None:
    """`meta[key]` as an id, or None when the key is unset, absent or unusable."""
    if meta is None or key is None:
        return None
    return id_value(meta.get(key))


def principal_session(token: object) -> str | None:
    """The session of an authenticated principal (`client_id`, issuer, `subject` of the token).

    Each part is percent-quoted, so no part can forge another's separators.
    """
    if token is None:
        return None
    claims = getattr(token, "claims", None)
    issuer = claims.get("iss") if isinstance(claims, Mapping) else None
    parts = [getattr(token, "client_id", None), issuer, getattr(token, "subject", None)]
    if not any(parts):
        return None
    return PRINCIPAL_PREFIX + ":".join(quote(str(p), safe="") if p else "" for p in parts)


def transport_session(
    session: object,
    request: object,
    protocol_version: str | None,
    *,
    stream_id: Callable[[], str] | None = None,
) -> str | None:
    """The transport's session, only where the protocol keeps one across calls.

    `session` is the SDK `ServerSession` of the request, `request` its HTTP
    request (None on stdio and in-memory transports). Under 2026-07-28 (or any
    version this SDK does not know as a handshake version) there is none. On a
    handshake-era connection it is the negotiated session id (stateful
    Streamable HTTP); without one, an HTTP request stands alone (stateless
    HTTP) and has none, while a stream transport (stdio, in-memory) is one
    connection for its whole life and gets an id kept on that connection
    (`stream_id()` when given, else a random one stored in its `state`).
    """
    if protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
        return None
    # The SDK offers no public accessor for the request's Connection (FastMCP
    # reads the same private attribute for its own session id).
    connection = getattr(session, "_connection", None)
    if connection is None:
        return None
    negotiated = id_value(getattr(connection, "session_id", None))
    if negotiated is not None:
        return TRANSPORT_PREFIX + negotiated
    if request is not None:
        return None
    if stream_id is not None:
        return TRANSPORT_PREFIX + stream_id()
    state = getattr(connection, "state", None)
    if not isinstance(state, dict):
        return None
    return TRANSPORT_PREFIX + str(state.setdefault(_CONNECTION_KEY, uuid4().hex))


def observed(result: object) -> object:
    """What of a tool result is observed for a progress-aware tool: never its `_meta`."""
    if isinstance(result, BaseException):
        return result
    if isinstance(result, Mapping):
        return {k: v for k, v in result.items() if k not in ("_meta", "meta")}
    dump = getattr(result, "model_dump", None)
    if callable(dump):
        try:
            return dump(mode="json", by_alias=True, exclude_none=True, exclude={"meta"})
        except Exception:  # an unusual model: digest it as it is
            return result
    return result


def is_error(result: object) -> bool:
    """Whether a tool result is a tool error (`isError`: a `CallToolResult`, FastMCP's result, their wire
    dicts): a failed call for a tool with `max_failures`."""
    if isinstance(result, Mapping):
        return result.get("isError") is True or result.get("is_error") is True
    if hasattr(result, "is_error"):  # first: FastMCP warns on reading the old name, `isError`
        return getattr(result, "is_error", None) is True
    return getattr(result, "isError", None) is True


def with_warning(result: ResultT, warning: str | None) -> ResultT:
    """`result` with `warning` appended as a text content block (a `CallToolResult` or its
    wire dict; anything else unchanged)."""
    if warning is None:
        return result
    if isinstance(result, Mapping) and isinstance(result.get("content"), list):
        text = {"type": "text", "text": warning}
        return {**result, "content": [*result["content"], text]}  # type: ignore[return-value]
    if not isinstance(result, types.CallToolResult):
        return result
    block = types.TextContent(type="text", text=warning)
    return result.model_copy(update={"content": [*result.content, block]})


def session_for(
    meta: Mapping[str, Any] | None,
    meta_key: str | None,
    principal: str | None,
    transport: Callable[[], str | None],
) -> str | None:
    """Steps 2-4 of the rule in the module text; None leaves the choice to distbrake."""
    explicit = meta_value(meta, meta_key)
    if explicit is not None:
        return explicit if principal is None else f"{principal}/{explicit}"
    if principal is not None:
        return principal
    return transport()


def scoped(
    scope: str, meta: Mapping[str, Any] | None, run_key: str | None, session: str | None
) -> str | None:
    """`session` qualified by the client's run id under `scope="run"` (see the module text)."""
    return scoped_session(scope, session, meta_value(meta, run_key) if scope == "run" else None)


class ToolCallGate(AdapterOptions):
    """What both MCP adapters share: the options, the session rule, the check, observation and the warning.

    An MCP adapter has no `on_deny`: a refused call is always a tool error (the
    server cannot end the client's run).
    """

    ON_DENY = ("tool-error",)

    def __init__(
        self,
        brake: Brake,
        *,
        scope: Scope = "run",
        session_id: Callable[[Any], object] | None = None,
        meta_key: str | None = DEFAULT_META_KEY,
        call_id_key: str | None = DEFAULT_CALL_ID_KEY,
        run_key: str | None = DEFAULT_RUN_KEY,
    ) -> None:
        self.configure(brake, "tool-error", scope, session_id)
        self.meta_key = meta_key
        self.call_id_key = call_id_key
        self.run_key = run_key

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(brake={self.brake!r}, scope={self.scope!r}, "
            f"meta_key={self.meta_key!r})"
        )

    def session_in(
        self, context: Any, meta: Mapping[str, Any] | None, resolve: Callable[[Any], str | None]
    ) -> object:
        """The session a call is counted in: `session_id(context)`, else steps 2-5 (`resolve`), by the scope."""
        return self.pick_session(context, lambda c: scoped(self.scope, meta, self.run_key, resolve(c)))

    async def gated(
        self,
        params: Any,
        session: object,
        meta: Mapping[str, Any] | None,
        call: Callable[[], Awaitable[Any]],
        refuse: Callable[[LoopBrakeError], Any],
        warn: Callable[[Any, str], Any],
    ) -> Any:
        """Check the `tools/call` of `params`; `refuse(error)` when refused, else run `call()` (its result or
        exception observed for a progress-aware tool or one with `max_failures`: an exception or an `isError`
        result failed) and `warn(result, warning)` when the verdict warns."""
        verdict, error = await self.screen(
            params.name, params.arguments or {}, session_id=session,
            call_id=meta_value(meta, self.call_id_key),
        )
        if error is not None:
            return refuse(error)
        result = await run_allowed(self.brake, verdict, call, observed, failed=is_error)
        warning = warning_of(verdict)
        return result if warning is None else warn(result, warning)


# -- the low-level server -------------------------------------------------------------


def request_meta(ctx: Context) -> Mapping[str, Any] | None:
    """The client's `_meta` of this request, custom keys included."""
    params = ctx.params
    if isinstance(params, Mapping):
        raw = params.get("_meta")
        if isinstance(raw, Mapping):
            return raw
    meta = ctx.meta
    return meta if isinstance(meta, Mapping) else None


def _access_token(ctx: Context) -> object:
    token: object = get_access_token()
    if token is None:
        scope = getattr(ctx.request, "scope", None)
        user = scope.get("user") if isinstance(scope, Mapping) else None
        if isinstance(user, AuthenticatedUser):
            token = user.access_token
    return token


def resolve_session(ctx: Context, *, meta_key: str | None = DEFAULT_META_KEY) -> str | None:
    """The default session of a low-level request (steps 2-4 of the module text)."""
    return session_for(
        request_meta(ctx),
        meta_key,
        principal_session(_access_token(ctx)),
        lambda: transport_session(ctx.session, ctx.request, ctx.protocol_version),
    )


def denial_result(error: LoopBrakeError) -> types.CallToolResult:
    """The tool error a client (and its model) receives for a denied call."""
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=str(error))], is_error=True
    )


class _Gate(ToolCallGate):
    """One check of a low-level `tools/call` against the brake; the denial result when refused."""

    def session_of(self, ctx: Context) -> object:
        return self.session_in(ctx, request_meta(ctx), lambda c: resolve_session(c, meta_key=self.meta_key))

    async def run(
        self, ctx: Context, params: types.CallToolRequestParams, call: Callable[[], Awaitable[Any]]
    ) -> Any:
        """Check the call; run `call()` only when it is allowed, then observe and warn."""
        return await self.gated(
            params, self.session_of(ctx), request_meta(ctx), call, denial_result, with_warning
        )


def brake_call_tool(
    handler: Callable[[CtxT, types.CallToolRequestParams], Awaitable[ResultT]],
    brake: Brake,
    *,
    scope: Scope = "run",
    session_id: SessionIdFunction | None = None,
    meta_key: str | None = DEFAULT_META_KEY,
    call_id_key: str | None = DEFAULT_CALL_ID_KEY,
    run_key: str | None = DEFAULT_RUN_KEY,
) -> Callable[[CtxT, types.CallToolRequestParams], Awaitable[ResultT | types.CallToolResult]]:
    """`handler` (a low-level `on_call_tool`) behind the brake; denied calls never reach it.

    `brake` is any distbrake brake (a sync Redis brake runs in a worker thread).
    `session_id(ctx)` overrides the session rule of the module text when it
    returns a str; `scope` says whether the client's run id qualifies the
    session; `meta_key` / `call_id_key` / `run_key` name the client `_meta`
    entries read for the session, the call id and the run id (None: don't read).
    """
    gate = _Gate(
        brake, scope=scope, session_id=session_id, meta_key=meta_key, call_id_key=call_id_key, run_key=run_key
    )

    @functools.wraps(handler)
    async def braked(
        ctx: CtxT, params: types.CallToolRequestParams
    ) -> ResultT | types.CallToolResult:
        result: ResultT | types.CallToolResult = await gate.run(
            ctx, params, lambda: handler(ctx, params)
        )
        return result

    return braked


class LoopBrakeExtension(_Gate, Extension):
    """The brake as an MCP extension interceptor (`MCPServer(extensions=[...])`).

    Same options as `brake_call_tool`. Its settings advertise the `_meta` keys
    it reads, so a client can discover how to name its session.
    """

    identifier = "dev.distbrake/loop-brake"

    def settings(self) -> dict[str, Any]:
        return {
            "sessionMetaKey": self.meta_key,
            "callIdMetaKey": self.call_id_key,
            "runIdMetaKey": self.run_key if self.scope == "run" else None,
        }

    async def intercept_tool_call(
        self,
        params: types.CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        result: HandlerResult = await self.run(ctx, params, lambda: call_next(ctx))
        return result
