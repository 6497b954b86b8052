"""The Docker MCP Gateway interceptor, fed the exact bytes docker/mcp-gateway's `pkg/interceptors` sends.

`before:http:URL` POSTs `json.Marshal(req)` of the go-sdk's `*mcp.CallToolRequest`
(`ServerRequest[*CallToolParamsRaw]`: Go field names `Session`, `Params`,
`Extra`; `CallToolParamsRaw` has `_meta,omitempty`, `name`, `arguments,omitempty`);
it reads the whole answer body whatever the status: empty lets the call
through, anything else is unmarshalled into `mcp.CallToolResult` (`content`
items need their `type`, `isError`). `after:http:URL` POSTs the marshalled
`CallToolResult` alone. Docker itself cannot run here; the brake is a real one.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from distbrake import LoopBrake
from distbrake.gateways.docker import DockerInterceptor, refusal_body
from distbrake.gateways.sessions import GatewaySessions
from tests.backends import ADAPTER_BRAKES, Brakes, session_names
from tests.backends import AnyBrake as Brake

REFUSAL = 'loop brake: tool "search" called 3 times in a row with identical arguments'


def go_request(name: Any = "search", arguments: Any = None, meta: dict[str, Any] | None = None,
               extra: dict[str, Any] | None = None) -> bytes:
    """What Go's json.Marshal writes for the gateway's *mcp.CallToolRequest (field order as declared)."""
    params: dict[str, Any] = {}
    if meta:
        params["_meta"] = meta
    params["name"] = name
    if arguments is not None:
        params["arguments"] = arguments
    return json.dumps({"Session": {}, "Params": params, "Extra": extra}, separators=(",", ":")).encode()


def as_go_result(body: bytes) -> dict[str, Any]:
    """The body as the gateway's json.Unmarshal into mcp.CallToolResult needs it."""
    result: dict[str, Any] = json.loads(body)
    assert set(result) <= {"_meta", "content", "structuredContent", "isError"}, result
    assert all(item["type"] == "text" and isinstance(item["text"], str) for item in result["content"])
    return result


@pytest.fixture(params=ADAPTER_BRAKES)
def make_brake(request: pytest.FixtureRequest, brakes: Brakes) -> Callable[..., Brake]:
    return brakes.of(request.param)


async def test_third_identical_call_is_refused_with_a_call_tool_result(make_brake: Callable[..., Brake]) -> None:
    interceptor = DockerInterceptor(make_brake())
    body = go_request(arguments={"q": "secret-query"}, meta={"session_id": "s"})
    answers = [await interceptor.before(body) for _ in range(3)]
    assert answers[:2] == [b"", b""]
    result = as_go_result(answers[2])
    assert result["isError"] is True and REFUSAL in result["content"][0]["text"]
    assert b"secret-query" not in answers[2]
    assert await interceptor.before(go_request(arguments={"q": "secret-query"}, meta={"session_id": "t"})) == b""


async def test_a_halted_session_is_refused_every_later_call_of_any_tool(make_brake: Callable[..., Brake]) -> None:
    """The gateway cannot end its client's run: from the halting call on (`halt_at=5`), every call of the session,
    any tool, is answered with a `CallToolResult` saying the session is halted, by any interceptor on the store."""
    brake = make_brake(max_repeats=3, halt_at=5)
    first, second = DockerInterceptor(brake), DockerInterceptor(brake if isinstance(brake, LoopBrake) else make_brake())
    body = go_request(arguments={"q": "secret-query"}, meta={"session_id": "stuck"})
    answers = [await first.before(body) for _ in range(5)]
    assert answers[:2] == [b"", b""]
    texts = [as_go_result(answer)["content"][0]["text"] for answer in answers[2:]]
    assert not any("is halted" in text for text in texts[:2])
    assert 'session "stuck" is halted' in texts[2] and b"secret-query" not in answers[4]
    other = as_go_result(await second.before(go_request("fetch", {"url": "u"}, meta={"session_id": "stuck"})))
    assert other["isError"] is True and 'session "stuck" is halted' in other["content"][0]["text"]
    assert await second.before(go_request(arguments={"q": "secret-query"}, meta={"session_id": "free"})) == b""


async def test_the_issue_shape_and_other_methods(make_brake: Callable[..., Brake]) -> None:
    interceptor = DockerInterceptor(make_brake())
    body = json.dumps({"method": "tools/call",
                       "params": {"name": "search", "arguments": {"q": 1}, "_meta": {"session_id": "s"}}}).encode()
    assert [await interceptor.before(body) for _ in range(2)] == [b"", b""]
    assert REFUSAL in as_go_result(await interceptor.before(body))["content"][0]["text"]
    listing = json.dumps({"method": "tools/list", "params": {}}).encode()
    assert [await interceptor.before(listing) for _ in range(3)] == [b"", b"", b""]


async def test_absent_arguments_are_the_empty_object(make_brake: Callable[..., Brake]) -> None:
    interceptor = DockerInterceptor(make_brake())
    with_none = go_request(meta={"session_id": "e"})  # `arguments,omitempty`: absent
    with_empty = go_request(arguments={}, meta={"session_id": "e"})
    assert [await interceptor.before(with_none), await interceptor.before(with_empty)] == [b"", b""]
    assert as_go_result(await interceptor.before(with_none))["isError"] is True


async def test_malformed_arguments_are_their_own_streak(make_brake: Callable[..., Brake]) -> None:
    interceptor = DockerInterceptor(make_brake())
    raw = go_request(arguments='{"q": "unterminated', meta={"session_id": "m"})
    assert [await interceptor.before(raw) for _ in range(2)] == [b"", b""]
    assert await interceptor.before(go_request(arguments=[1, 2], meta={"session_id": "m"})) == b""
    assert await interceptor.before(raw) == b""  # the list broke the run of identical calls
    assert await interceptor.before(raw) == b""
    answer = await interceptor.before(raw)
    assert REFUSAL in as_go_result(answer)["content"][0]["text"] and b"unterminated" not in answer
    # the raw text is the identity: another text (or a well-formed call) is another streak
    other = go_request(arguments='{"q": "unterminated!', meta={"session_id": "m"})
    assert await interceptor.before(other) == b""
    assert await interceptor.before(go_request(arguments={"q": "unterminated"}, meta={"session_id": "m"})) == b""


async def test_principal_and_handshake_session_from_extra(make_brake: Callable[..., Brake]) -> None:
    brake = make_brake()
    interceptor = DockerInterceptor(brake)
    alice = {"TokenInfo": {"Scopes": ["tools"], "Expiration": "0001-01-01T00:00:00Z", "UserID": "alice",
                           "Extra": None}, "Header": {"Mcp-Session-Id": ["h-1"]}}
    bob = {**alice, "TokenInfo": {**alice["TokenInfo"], "UserID": "bob"}}
    stateful = {"TokenInfo": None, "Header": {"Mcp-Session-Id": ["h-2"], "Content-Type": ["application/json"]}}
    await interceptor.before(go_request(arguments={"q": 1}, meta={"session_id": "same"}, extra=alice))
    await interceptor.before(go_request(arguments={"q": 1}, meta={"session_id": "same"}, extra=bob))
    await interceptor.before(go_request(arguments={"q": 1}, extra=stateful))
    assert await session_names(brake) == ["mcp-session:h-2", "principal:::alice/same", "principal:::bob/same"]


async def test_bad_bodies_pass_and_are_logged_without_their_content(
    make_brake: Callable[..., Brake], caplog: pytest.LogCaptureFixture
) -> None:
    interceptor = DockerInterceptor(make_brake())
    with caplog.at_level(logging.WARNING, logger="distbrake"):
        for body in (b"not json secret-xyz", b"[1, 2]", json.dumps({"Params": "secret-xyz"}).encode()):
            assert await interceptor.before(body) == b""
    assert len(caplog.records) == 3 and "secret-xyz" not in caplog.text


async def test_a_fail_closed_brake_refuses_a_bad_body(brakes: Brakes) -> None:
    interceptor = DockerInterceptor(brakes.of("async-memory")(on_backend_error="closed"))
    result = as_go_result(await interceptor.before(b"{not json"))
    assert result["isError"] is True and "fail-closed" in result["content"][0]["text"]


async def test_require_session_refuses_a_call_naming_none(make_brake: Callable[..., Brake]) -> None:
    interceptor = DockerInterceptor(make_brake(), GatewaySessions(require_session=True))
    result = as_go_result(await interceptor.before(go_request(arguments={"q": 1})))
    assert "requires a session" in result["content"][0]["text"]
    assert await interceptor.before(go_request(arguments={"q": 1}, meta={"session_id": "s"})) == b""


async def test_after_lets_every_result_through(make_brake: Callable[..., Brake]) -> None:
    interceptor = DockerInterceptor(make_brake())
    result = {"content": [{"type": "text", "text": "ok"}], "isError": False}
    assert await interceptor.after(json.dumps(result).encode()) == b""
    assert await interceptor.after(b"garbage") == b""


def test_refusal_body_is_a_call_tool_result() -> None:
    assert json.loads(refusal_body("no \u00e9")) == {"content": [{"type": "text", "text": "no \u00e9"}],
                                                     "isError": True}
