"""FastMCP: `LoopBrakeMiddleware` over the in-memory transport, on every brake kind.

Covers the stateless-session trap: under 2026-07-28 (the client default) the
transport session id is new on every request, so the session must come from
the client's `_meta`, the principal, or (handshake era only) the transport.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import pytest
from fastmcp import Client, Context, FastMCP
from fastmcp.client.transports import StreamableHttpTransport
from fastmcp.exceptions import ToolError
from fastmcp.server.auth.providers.jwt import StaticTokenVerifier
from mcp.server.auth.middleware.auth_context import auth_context_var
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken

from distbrake import (
    ConfigurationError,
    LoopBrake,
    LoopBrakeError,
    call_hash,
    hash_prefix,
)
from distbrake.integrations.fastmcp import LoopBrakeMiddleware
from tests.adapters import Body, Run, Seen, refused_each_day
from tests.backends import AnyBrake as Brake
from tests.backends import inspect_count, next_answer, session_names

ARGS = {"q": "weather"}
PREFIX = hash_prefix(call_hash("search", ARGS))


# -- a server with one counted tool ---------------------------------------------------


class SearchServer:
    """A FastMCP server whose `search` tool counts its runs and records `ctx.session_id`."""

    def __init__(self, brake: Brake, *, auth: Any = None, **options: Any) -> None:
        self.runs = 0
        self.transport_sessions: list[str] = []
        self.mcp = FastMCP(
            "search", auth=auth, middleware=[LoopBrakeMiddleware(brake, **options)]
        )

        @self.mcp.tool
        def search(q: str, ctx: Context) -> str:
            self.runs += 1
            if ctx.request_context is not None:  # None when called server-side
                self.transport_sessions.append(ctx.session_id)
            return f"results for {q}"


class Driver:
    """The contract test's FastMCP: a server with the middleware, called by a client naming its session and run
    in `_meta` (the server cannot see the client's runs: the client names them)."""

    async def run(self, brake: Any, body: Body, plan: Run, **options: Any) -> list[Seen]:
        mcp = FastMCP("search", middleware=[LoopBrakeMiddleware(brake, **options)])

        @mcp.tool
        def search(q: str) -> str:
            return body(q)

        meta = {"session_id": plan.conversation, "run_id": plan.ids[0]}
        async with Client(mcp) as client:
            results = [await client.call_tool("search", ARGS, raise_on_error=False, meta=meta) for _ in plan.ids]
        return [Seen(r.is_error, "\n".join(getattr(block, "text", "") for block in r.content)) for r in results]


async def call(client: Client[Any], meta: dict[str, Any] | None = None) -> tuple[bool, str]:
    result = await client.call_tool("search", ARGS, raise_on_error=False, meta=meta)
    return result.is_error, result.content[0].text  # type: ignore[union-attr]


def assert_refusal(text: str, count: int = 3) -> None:
    assert "loop brake" in text
    assert PREFIX in text
    assert f"called {count} times in a row" in text


# -- the full loop ------------------------------------------------------------------


async def test_third_identical_call_is_refused(make_brake: Callable[..., Brake]) -> None:
    brake = make_brake()
    app = SearchServer(brake)
    async with Client(app.mcp) as client:
        first = await call(client, {"session_id": "s1"})
        second = await call(client, {"session_id": "s1"})
        denied, text = await call(client, {"session_id": "s1"})
        # The default client raises on a tool error: the run ends there.
        with pytest.raises(ToolError, match="loop brake") as raised:
            await client.call_tool("search", ARGS, meta={"session_id": "s1"})
    assert first == (False, "results for weather")
    assert second == (False, "results for weather")
    assert denied is True
    assert_refusal(text)
    assert_refusal(str(raised.value), count=4)
    assert app.runs == 2
    assert await inspect_count(brake, "s1") == 4


async def test_refusal_on_the_wire_and_unmasked(make_brake: Callable[..., Brake]) -> None:
    brake = make_brake()
    mcp = FastMCP("masked", mask_error_details=True, middleware=[LoopBrakeMiddleware(brake)])
    runs: list[str] = []

    @mcp.tool
    def search(q: str) -> str:
        runs.append(q)
        return q

    async with Client(mcp) as client:
        for _ in range(2):
            await client.call_tool_mcp("search", ARGS)
        raw = await client.call_tool_mcp("search", ARGS)
    wire = raw.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert wire["isError"] is True
    assert_refusal(wire["content"][0]["text"])
    assert len(runs) == 2


async def test_denial_is_a_tool_error_chained_from_the_brake_error() -> None:
    app = SearchServer(LoopBrake())
    for _ in range(2):
        await app.mcp.call_tool("search", ARGS)
    with pytest.raises(ToolError) as raised:
        await app.mcp.call_tool("search", ARGS)
    cause = raised.value.__cause__
    assert isinstance(cause, LoopBrakeError)
    assert (cause.tool_name, cause.count, cause.hash_prefix) == ("search", 3, PREFIX)
    assert str(raised.value) == str(cause)
    assert app.runs == 2


async def test_other_arguments_and_other_sessions_are_separate_streaks(
    make_brake: Callable[..., Brake],
) -> None:
    app = SearchServer(make_brake())
    async with Client(app.mcp) as client:
        outcomes = [
            await call(client, {"session_id": "s1"}),
            await call(client, {"session_id": "s1"}),
            await call(client, {"session_id": "s2"}),
            await call(client, {"session_id": "s2"}),
            await call(client, {"session_id": "s1"}),  # s1's streak is still 2 -> 3
        ]
        other = await client.call_tool("search", {"q": "news"}, meta={"session_id": "s2"})
    assert [denied for denied, _ in outcomes] == [False, False, False, False, True]
    assert other.is_error is False
    assert app.runs == 5


# -- the stateless-session trap -------------------------------------------------------


async def test_stateless_protocol_meta_session_denies_third_call(
    make_brake: Callable[..., Brake],
) -> None:
    brake = make_brake()
    app = SearchServer(brake)
    async with Client(app.mcp) as client:  # mode="auto" negotiates 2026-07-28
        assert client.protocol_version == "2026-07-28"
        results = [await call(client, {"session_id": "s1"}) for _ in range(3)]
    assert [denied for denied, _ in results] == [False, False, True]
    # The trap: the transport "session" was new on every request.
    assert len(set(app.transport_sessions)) == 2
    assert await session_names(brake) == ["s1"]


async def test_stateless_protocol_without_meta_falls_back_to_default_not_transport(
    make_brake: Callable[..., Brake],
) -> None:
    brake = make_brake()
    app = SearchServer(brake)
    async with Client(app.mcp) as client:
        results = [await call(client) for _ in range(3)]
    assert [denied for denied, _ in results] == [False, False, True]
    assert len(set(app.transport_sessions)) == 2  # a fresh UUID per request ...
    assert await session_names(brake) == ["default"]  # ... and never a brake session


async def test_a_brake_keyed_on_the_transport_session_would_never_fire() -> None:
    brake = LoopBrake()

    def transport_id(context: Any) -> str:
        return str(context.fastmcp_context.session_id)

    app = SearchServer(brake, session_id=transport_id)
    async with Client(app.mcp) as client:
        results = [await call(client, {"session_id": "s1"}) for _ in range(4)]
    assert [denied for denied, _ in results] == [False] * 4
    assert app.runs == 4
    assert len(list(brake.sessions())) == 4


async def test_legacy_connection_uses_its_transport_session(
    make_brake: Callable[..., Brake],
) -> None:
    brake = make_brake()
    app = SearchServer(brake)
    async with Client(app.mcp, mode="legacy") as one, Client(app.mcp, mode="legacy") as two:
        assert one.protocol_version != "2026-07-28"
        first = [await call(one), await call(one)]
        other = [await call(two), await call(two)]  # another connection, another streak
        denied, text = await call(one)
    assert [d for d, _ in first + other] == [False] * 4
    assert denied is True
    assert_refusal(text)
    stable = app.transport_sessions[0]
    assert app.transport_sessions[:2] == [stable, stable]
    assert await inspect_count(brake, f"mcp-session:{stable}") == 3
    assert len(await session_names(brake)) == 2


async def test_meta_session_wins_over_the_legacy_transport_session() -> None:
    brake = LoopBrake()
    app = SearchServer(brake)
    async with Client(app.mcp, mode="legacy") as one, Client(app.mcp, mode="legacy") as two:
        await call(one, {"session_id": "run-7"})
        await call(two, {"session_id": "run-7"})
        denied, _ = await call(one, {"session_id": "run-7"})
    assert denied is True
    assert [s.session_id for s in brake.sessions()] == ["run-7"]


@pytest.fixture
def principal() -> Iterator[AccessToken]:
    """An authenticated request context (what the bearer-auth middleware sets over HTTP)."""
    token = AccessToken(
        token="opaque", client_id="alice-client", scopes=[], subject="alice",
        claims={"iss": "https://issuer.example"},
    )
    reset = auth_context_var.set(AuthenticatedUser(token))
    yield token
    auth_context_var.reset(reset)


async def test_authenticated_principal_is_the_session_without_meta(principal: AccessToken) -> None:
    brake = LoopBrake()
    app = SearchServer(brake)
    async with Client(app.mcp) as client:
        results = [await call(client) for _ in range(3)]
    assert [denied for denied, _ in results] == [False, False, True]
    assert [s.session_id for s in brake.sessions()] == [
        "principal:alice-client:https%3A%2F%2Fissuer.example:alice"
    ]


async def test_meta_session_is_scoped_by_the_principal(principal: AccessToken) -> None:
    brake = LoopBrake()
    app = SearchServer(brake)
    async with Client(app.mcp) as client:
        results = [await call(client, {"session_id": "s1"}) for _ in range(3)]
    assert results[2][0] is True
    assert [s.session_id for s in brake.sessions()] == [
        "principal:alice-client:https%3A%2F%2Fissuer.example:alice/s1"
    ]


async def test_session_id_overrides_and_none_falls_back() -> None:
    brake = LoopBrake()
    seen: list[Any] = []

    def from_header(context: Any) -> str | None:
        seen.append(context.message.name)
        meta = context.fastmcp_context.request_context.meta or {}
        return meta.get("tenant")

    app = SearchServer(brake, session_id=from_header)
    async with Client(app.mcp) as client:
        await call(client, {"tenant": "acme", "session_id": "ignored"})
        await call(client, {"session_id": "s9"})  # session_id says None: the default rule
    assert seen == ["search", "search"]
    assert sorted(s.session_id for s in brake.sessions()) == ["acme", "s9"]


async def test_custom_meta_key() -> None:
    brake = LoopBrake()
    app = SearchServer(brake, meta_key="thread_id")
    async with Client(app.mcp) as client:
        await call(client, {"thread_id": "t-1", "session_id": "not-this"})
    assert [s.session_id for s in brake.sessions()] == ["t-1"]


async def test_client_call_id_makes_a_retry_count_once(make_brake: Callable[..., Brake]) -> None:
    brake = make_brake()
    app = SearchServer(brake)
    async with Client(app.mcp) as client:
        retried = [await call(client, {"session_id": "s1", "call_id": "c1"}) for _ in range(3)]
        after = [
            await call(client, {"session_id": "s1", "call_id": "c2"}),
            await call(client, {"session_id": "s1", "call_id": "c3"}),
        ]
    assert [denied for denied, _ in retried] == [False, False, False]
    assert [denied for denied, _ in after] == [False, True]
    assert await inspect_count(brake, "s1") == 3


# -- Streamable HTTP (in-process ASGI, bearer auth) ------------------------------------


def asgi_client_factory(app: Any) -> Callable[..., httpx2.AsyncClient]:
    """An httpx2 client factory that sends every request to `app` in-process (no sockets)."""

    def factory(
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
        **options: Any,
    ) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(
            transport=httpx2.ASGITransport(app=app),
            base_url="http://mcp.test",
            headers=headers,
            auth=auth,
            timeout=timeout or 10.0,
            **options,
        )

    return factory


@pytest.mark.parametrize(
    ("stateless_http", "mode", "authenticated", "expected"),
    [
        (False, "legacy", False, "mcp-session:"),  # the negotiated session id
        (True, "legacy", False, "default"),  # stateless HTTP: a new id per request
        (False, "auto", False, "default"),  # 2026-07-28: a new id per request
        (True, "auto", False, "default"),
        (False, "legacy", True, "principal:alice-client::alice"),
        (True, "auto", True, "principal:alice-client::alice"),
    ],
)
async def test_streamable_http_sessions(
    stateless_http: bool, mode: str, authenticated: bool, expected: str
) -> None:
    brake = LoopBrake()
    auth = StaticTokenVerifier(
        tokens={"tok-alice": {"client_id": "alice-client", "sub": "alice", "scopes": []}}
    )
    app = SearchServer(brake, auth=auth if authenticated else None)
    http_app = app.mcp.http_app(stateless_http=stateless_http, json_response=True)
    transport = StreamableHttpTransport(
        "http://mcp.test/mcp",
        httpx_client_factory=asgi_client_factory(http_app),
        auth="tok-alice" if authenticated else None,
    )
    async with http_app.router.lifespan_context(http_app), Client(transport, mode=mode) as client:
        results = [await call(client) for _ in range(3)]
    assert [denied for denied, _ in results] == [False, False, True]
    assert_refusal(results[2][1])
    sessions = [s.session_id for s in brake.sessions()]
    assert len(sessions) == 1
    assert sessions[0].startswith(expected)
    stable = len(set(app.transport_sessions)) == 1
    assert stable == (not stateless_http and mode == "legacy")
    if expected == "mcp-session:":
        assert sessions[0] == f"mcp-session:{app.transport_sessions[0]}"


# -- warn before deny, progress-aware tools (issue 10) ------------------------------


class Poller:
    """A FastMCP server with a progress-aware `get_job_status` that returns (or raises) what it is told."""

    def __init__(self, brake: Brake, answers: list[Any]) -> None:
        self.answers = iter(answers)
        self.runs = 0
        self.mcp = FastMCP("jobs", middleware=[LoopBrakeMiddleware(brake)])

        @self.mcp.tool
        def get_job_status(job: str) -> str:
            self.runs += 1
            return str(next_answer(self.answers))

    async def poll(self, times: int) -> list[bool]:
        """`is_error` of each of `times` identical polls."""
        async with Client(self.mcp) as client:
            return [
                (await client.call_tool_mcp("get_job_status", {"job": "j1"})).is_error
                for _ in range(times)
            ]


POLLER = {"get_job_status": {"progress": True}}


async def test_a_raised_error_is_observed_as_a_result(make_brake: Callable[..., Brake]) -> None:
    # Result, error, result, ...: each differs from the one before, so the streak restarts.
    answers: list[Any] = ["running", ToolError("backend busy")] * 3
    poller = Poller(make_brake(tools=POLLER), answers)
    assert await poller.poll(6) == [False, True, False, True, False, True]  # the tool's own errors
    assert poller.runs == 6


# -- the session scope: the client names the session, and may name its run --------------

async def week(app: SearchServer, with_run: bool = True) -> list[bool]:
    async with Client(app.mcp) as client:
        return await refused_each_day(lambda meta: call(client, meta), with_run)


@pytest.mark.parametrize("scope", ["run", "conversation"])
async def test_without_a_run_id_both_scopes_are_the_clients_session(scope: Any) -> None:
    assert await week(SearchServer(LoopBrake(), scope=scope), with_run=False) == [False, False, True]


def test_scope_and_session_id_are_checked_at_build_time() -> None:
    with pytest.raises(ConfigurationError, match="scope"):
        LoopBrakeMiddleware(LoopBrake(), scope="thread")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="session_id"):
        LoopBrakeMiddleware(LoopBrake(), session_id="week")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="check"):
        LoopBrakeMiddleware(object())  # type: ignore[arg-type]
