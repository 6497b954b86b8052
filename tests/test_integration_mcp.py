"""Low-level MCP SDK server: `brake_call_tool` and `LoopBrakeExtension`, on every brake kind.

Driven in-process by `mcp.Client(server, mode=...)`: "auto" negotiates the
stateless 2026-07-28 protocol (a fresh connection per request), "legacy" the
2025-11-25 handshake (one connection for the client's life).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import MCPServer, Server, ServerRequestContext
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.extension import compose_tool_call_handler
from mcp.shared.exceptions import MCPError

from distbrake import ConfigurationError, LoopBrake, call_hash, hash_prefix
from distbrake.integrations.mcp import LoopBrakeExtension, brake_call_tool
from tests.adapters import Body, Run, Seen, refused_each_day
from tests.backends import AnyBrake as Brake
from tests.backends import inspect_count, next_answer, session_names

ARGS = {"q": "weather"}
PREFIX = hash_prefix(call_hash("search", ARGS))
WIRINGS = ["wrap", "extension"]


# -- a low-level server with one counted tool -------------------------------------------


class SearchServer:
    """A low-level `Server` whose `search` handler counts runs and records its connection."""

    def __init__(
        self, brake: Brake, wiring: str = "wrap", body: Callable[[str], str] | None = None, **options: Any
    ) -> None:
        self.runs = 0
        self.body = body
        self.connections: list[Any] = []  # kept alive, so distinct ones never share an id()
        self.stream_ids: list[str | None] = []
        handler: Any
        if wiring == "wrap":
            handler = brake_call_tool(self.call_tool, brake, **options)
        else:
            handler = compose_tool_call_handler(
                [LoopBrakeExtension(brake, **options)], self.call_tool
            )
        self.server = Server("search", on_list_tools=self.list_tools, on_call_tool=handler)

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
        return types.ListToolsResult(tools=[types.Tool(name="search", input_schema=schema)])

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        self.runs += 1
        connection = ctx.session._connection  # what the SDK offers of the transport session
        self.connections.append(connection)
        self.stream_ids.append(connection.state.get("distbrake.session_id"))
        q = (params.arguments or {}).get("q")
        text = f"results for {q}" if self.body is None else self.body(str(q))
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


class Driver:
    """The contract test's low-level MCP server: `brake_call_tool` around the handler, called by a client naming
    its session and run in `_meta` (the server cannot see the client's runs: the client names them)."""

    async def run(self, brake: Any, body: Body, plan: Run, **options: Any) -> list[Seen]:
        app = SearchServer(brake, body=body, **options)
        meta = {"session_id": plan.conversation, "run_id": plan.ids[0]}
        async with Client(app.server) as client:
            results = [await client.call_tool("search", ARGS, meta=meta) for _ in plan.ids]  # type: ignore[arg-type]
        return [Seen(r.is_error, "\n".join(getattr(block, "text", "") for block in r.content)) for r in results]


async def call(client: Client, meta: dict[str, Any] | None = None) -> tuple[bool, str]:
    result = await client.call_tool("search", ARGS, meta=meta)  # type: ignore[arg-type]
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return result.is_error, block.text


def assert_refusal(text: str, count: int = 3) -> None:
    assert "loop brake" in text
    assert PREFIX in text
    assert f"called {count} times in a row" in text


# -- the full loop ------------------------------------------------------------------


@pytest.mark.parametrize("wiring", WIRINGS)
async def test_third_identical_call_is_refused(
    make_brake: Callable[..., Brake], wiring: str
) -> None:
    brake = make_brake()
    app = SearchServer(brake, wiring)
    async with Client(app.server) as client:
        results = [await call(client, {"session_id": "s1"}) for _ in range(3)]
        raw = await client.call_tool("search", ARGS, meta={"session_id": "s1"})  # type: ignore[arg-type]
    assert results[:2] == [(False, "results for weather")] * 2
    assert results[2][0] is True
    assert_refusal(results[2][1])
    wire = raw.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert wire["isError"] is True
    assert_refusal(wire["content"][0]["text"], count=4)
    assert "io.modelcontextprotocol/serverInfo" in wire["_meta"]  # serialised like any result
    assert app.runs == 2
    assert await inspect_count(brake, "s1") == 4


@pytest.mark.parametrize("wiring", WIRINGS)
async def test_stateless_protocol_meta_session_and_default_fallback(
    make_brake: Callable[..., Brake], wiring: str
) -> None:
    brake = make_brake()
    app = SearchServer(brake, wiring)
    async with Client(app.server) as client:  # mode="auto": 2026-07-28
        with_meta = [await call(client, {"session_id": "s1"}) for _ in range(3)]
        without = [await call(client) for _ in range(3)]
    assert [d for d, _ in with_meta] == [False, False, True]
    assert [d for d, _ in without] == [False, False, True]
    # The trap: every request had its own connection, and no transport session was kept.
    assert len({id(c) for c in app.connections}) == 4
    assert app.stream_ids == [None] * 4
    assert await session_names(brake) == ["default", "s1"]


@pytest.mark.parametrize("wiring", WIRINGS)
async def test_legacy_stream_connection_is_its_own_session(
    make_brake: Callable[..., Brake], wiring: str
) -> None:
    brake = make_brake()
    app = SearchServer(brake, wiring)
    async with Client(app.server, mode="legacy") as one, Client(app.server, mode="legacy") as two:
        first = [await call(one), await call(one)]
        other = [await call(two), await call(two)]  # another connection, another streak
        denied, text = await call(one)
    assert [d for d, _ in first + other] == [False] * 4
    assert denied is True
    assert_refusal(text)
    stream = app.stream_ids[0]
    assert stream is not None
    assert app.stream_ids[1] == stream
    assert app.connections[0] is app.connections[1]
    assert await inspect_count(brake, f"mcp-session:{stream}") == 3
    assert len(await session_names(brake)) == 2


async def test_client_call_id_makes_a_retry_count_once(make_brake: Callable[..., Brake]) -> None:
    brake = make_brake()
    app = SearchServer(brake)
    async with Client(app.server) as client:
        retried = [await call(client, {"session_id": "s1", "call_id": "c1"}) for _ in range(3)]
        after = [
            await call(client, {"session_id": "s1", "call_id": "c2"}),
            await call(client, {"session_id": "s1", "call_id": 3}),  # int ids work too
        ]
    assert [d for d, _ in retried] == [False] * 3
    assert [d for d, _ in after] == [False, True]
    assert await inspect_count(brake, "s1") == 3


async def test_unusable_meta_values_are_ignored() -> None:
    brake = LoopBrake()
    app = SearchServer(brake)
    async with Client(app.server) as client:
        await call(client, {"session_id": {"nested": 1}, "call_id": ["x"]})
        await call(client, {"session_id": "", "call_id": True})
    assert [(s.session_id, s.count) for s in brake.sessions()] == [("default", 2)]


@pytest.fixture
def principal() -> Iterator[AccessToken]:
    """An authenticated request context (what the bearer-auth middleware sets over HTTP)."""
    token = AccessToken(token="opaque", client_id="bot:1", scopes=[], subject="u/7")
    reset = auth_context_var.set(AuthenticatedUser(token))
    yield token
    auth_context_var.reset(reset)


@pytest.mark.parametrize("wiring", WIRINGS)
async def test_principal_session_and_scoping(principal: AccessToken, wiring: str) -> None:
    brake = LoopBrake()
    app = SearchServer(brake, wiring)
    async with Client(app.server) as client:
        plain = [await call(client) for _ in range(3)]
        scoped = await call(client, {"session_id": "s1"})
        run = await call(client, {"run_id": "r1"})  # a run of the principal's own session
    assert [d for d, _ in plain] == [False, False, True]
    assert scoped[0] is False and run[0] is False
    # Parts are percent-quoted: "bot:1" and "u/7" cannot forge the separators.
    assert sorted(s.session_id for s in brake.sessions()) == [
        "principal:bot%3A1::u%2F7",
        "principal:bot%3A1::u%2F7/run/r1",
        "principal:bot%3A1::u%2F7/s1",
    ]


@pytest.mark.parametrize("wiring", WIRINGS)
async def test_session_id_and_meta_keys(wiring: str) -> None:
    brake = LoopBrake()

    def tenant(ctx: ServerRequestContext[Any, Any]) -> str | None:
        meta = (ctx.params or {}).get("_meta") or {}
        return meta.get("tenant")

    app = SearchServer(brake, wiring, session_id=tenant, meta_key="thread_id", call_id_key=None)
    async with Client(app.server) as client:
        await call(client, {"tenant": "acme", "thread_id": "t1"})
        await call(client, {"thread_id": "t1", "session_id": "nope"})
        await call(client, {"thread_id": "t1", "call_id": "c"})  # call ids not read: counts
        await call(client, {"thread_id": "t1", "call_id": "c"})
    assert sorted((s.session_id, s.count) for s in brake.sessions()) == [("acme", 1), ("t1", 3)]


async def test_extension_on_the_high_level_mcpserver(make_brake: Callable[..., Brake]) -> None:
    brake = make_brake()
    extension = LoopBrakeExtension(brake)
    mcp = MCPServer("search", extensions=[extension])
    runs: list[str] = []

    @mcp.tool()
    def search(q: str) -> str:
        runs.append(q)
        return f"results for {q}"

    async with Client(mcp) as client:
        results = [await call(client, {"session_id": "s1"}) for _ in range(3)]
        advertised = client.server_capabilities
    assert [d for d, _ in results] == [False, False, True]
    assert_refusal(results[2][1])
    assert runs == ["weather", "weather"]
    assert advertised is not None
    assert advertised.extensions is not None
    assert advertised.extensions[LoopBrakeExtension.identifier] == {
        "sessionMetaKey": "session_id",
        "callIdMetaKey": "call_id",
        "runIdMetaKey": "run_id",
    }


# -- Streamable HTTP (in-process ASGI) ------------------------------------------------


@pytest.mark.parametrize(
    ("stateless_http", "mode", "expected"),
    [
        (False, "legacy", "mcp-session:"),  # the negotiated mcp-session-id
        (True, "legacy", "default"),  # stateless HTTP: no session to trust
        (False, "auto", "default"),  # 2026-07-28: none either
        (True, "auto", "default"),
    ],
)
async def test_streamable_http_sessions(stateless_http: bool, mode: str, expected: str) -> None:
    brake = LoopBrake()
    app = SearchServer(brake)
    http_app = app.server.streamable_http_app(stateless_http=stateless_http, json_response=True)
    base = "http://127.0.0.1:8000"  # only what the DNS-rebinding guard accepts; no socket
    async with (
        http_app.router.lifespan_context(http_app),
        httpx2.AsyncClient(transport=httpx2.ASGITransport(app=http_app), base_url=base) as http,
        Client(streamable_http_client(f"{base}/mcp", http_client=http), mode=mode) as client,
    ):
        results = [await call(client) for _ in range(3)]
    assert [d for d, _ in results] == [False, False, True]
    sessions = [s.session_id for s in brake.sessions()]
    assert len(sessions) == 1
    assert sessions[0].startswith(expected)
    one_connection = len({id(c) for c in app.connections}) == 1
    assert one_connection == (not stateless_http and mode == "legacy")


# -- warn before deny, progress-aware tools (issue 10) ------------------------------


POLLER = {"get_job_status": {"progress": True}}


class PollServer:
    """A low-level server with a progress-aware `get_job_status` returning (or raising) what it is told."""

    def __init__(self, brake: Brake, wiring: str, answers: list[Any]) -> None:
        self.answers = iter(answers)
        self.runs = 0
        handler: Any
        if wiring == "wrap":
            handler = brake_call_tool(self.call_tool, brake)
        else:
            handler = compose_tool_call_handler([LoopBrakeExtension(brake)], self.call_tool)
        self.server = Server("jobs", on_list_tools=self.list_tools, on_call_tool=handler)

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        schema = {"type": "object", "properties": {"job": {"type": "string"}}}
        return types.ListToolsResult(tools=[types.Tool(name="get_job_status", input_schema=schema)])

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        self.runs += 1
        answer = next_answer(self.answers)
        if isinstance(answer, types.CallToolResult):
            return answer
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=str(answer))],
            structured_content={"status": answer},
        )

    async def poll(self, times: int) -> list[str]:
        """What each of `times` identical polls gave: "ok", "denied" or "raised"."""
        seen = []
        async with Client(self.server) as client:
            for _ in range(times):
                try:
                    result = await client.call_tool("get_job_status", {"job": "j1"})
                except MCPError:  # the handler's own exception, as the client sees it
                    seen.append("raised")
                    continue
                seen.append("denied" if result.is_error else "ok")
        return seen


@pytest.mark.parametrize("wiring", WIRINGS)
async def test_a_raised_error_is_observed_as_a_result(wiring: str) -> None:
    answers: list[Any] = ["running", RuntimeError("backend busy")] * 3
    poller = PollServer(LoopBrake(tools=POLLER), wiring, answers)
    assert await poller.poll(6) == ["ok", "raised"] * 3  # each differs from the one before
    assert poller.runs == 6


def tool_error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


@pytest.mark.parametrize("wiring", WIRINGS)
async def test_is_error_results_are_failures_for_max_failures(wiring: str) -> None:
    """A handler's `isError` result is a failed call: two in a row refuse the third call (`max_failures=2`); a
    success in between resets the count."""
    brake = LoopBrake(10, tools={"get_job_status": {"max_failures": 2}})
    poller = PollServer(brake, wiring, [tool_error("down"), "running", tool_error("down"), tool_error("down")])
    async with Client(poller.server) as client:
        results = [await client.call_tool("get_job_status", {"job": "j1"}) for _ in range(5)]
    assert poller.runs == 4
    assert [r.is_error for r in results] == [True, False, True, True, True]
    refusal = results[4].content[0]
    assert isinstance(refusal, types.TextContent)
    assert 'tool "get_job_status" failed 2 times in a row' in refusal.text, refusal.text


# -- the session scope: the client names the session, and may name its run --------------

async def week(app: SearchServer, with_run: bool = True) -> list[bool]:
    async with Client(app.server) as client:
        return await refused_each_day(lambda meta: call(client, meta), with_run)


@pytest.mark.parametrize("wiring", WIRINGS)
async def test_scope_conversation_ignores_the_client_run_id(wiring: str) -> None:
    brake = LoopBrake()
    app = SearchServer(brake, wiring, scope="conversation")

    assert await week(app) == [False, False, True]
    assert [s.session_id for s in brake.sessions()] == ["week"]
    assert LoopBrakeExtension(brake, scope="conversation").settings()["runIdMetaKey"] is None


@pytest.mark.parametrize("scope", ["run", "conversation"])
async def test_without_a_run_id_both_scopes_are_the_clients_session(scope: Any) -> None:
    app = SearchServer(LoopBrake(), scope=scope)

    assert await week(app, with_run=False) == [False, False, True]


def test_scope_and_session_id_are_checked_at_build_time() -> None:
    async def handler(ctx: Any, params: Any) -> Any:
        raise AssertionError("never called")

    for build in (lambda **o: brake_call_tool(handler, LoopBrake(), **o),
                  lambda **o: LoopBrakeExtension(LoopBrake(), **o)):
        with pytest.raises(ConfigurationError, match="scope"):
            build(scope="thread")
        with pytest.raises(TypeError, match="session_id"):
            build(session_id="week")
    with pytest.raises(TypeError, match="check"):
        brake_call_tool(handler, object())  # type: ignore[arg-type]
