"""The LiteLLM guardrail: LiteLLM's proxy as a real process, and the class under LiteLLM's own hooks.

The real run: a redis-server, the upstream MCP server (`tests.gateway_upstream`)
over Streamable HTTP, and `litellm --config config.yaml` with the guardrail in
its `guardrails:` list, a local fake model (`mock_response`) and the upstream
in its `mcp_servers:`; an MCP client (FastMCP's `Client`) calls the tool
through LiteLLM's `/mcp/` gateway.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm is imported: no network fetch

import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import pytest
import yaml
from fastapi import HTTPException
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

from distbrake import AsyncDistributedBrake
from distbrake.integrations.litellm import LoopBrakeGuardrail
from tests.adapters import import_leaves_the_framework_alone, names_its_extra_when_missing
from tests.backends import ADAPTER_BRAKES, Brakes, session_names
from tests.backends import AnyBrake as Brake
from tests.gateway_processes import UPSTREAM, gateway_env, served
from tests.servers import free_port

REFUSAL = 'loop brake: tool "search" called 3 times in a row with identical arguments'
MASTER_KEY = "sk-distbrake-test-master"
UVICORN = re.compile(r"Uvicorn running on (http://\S+)")
LITELLM = shutil.which("litellm", path=str(Path(sys.executable).parent))


@pytest.fixture(scope="module")
def litellm_gateway(tmp_path_factory: pytest.TempPathFactory, redis_server: Any) -> Iterator[tuple[str, Any]]:
    """LiteLLM's proxy (a real process) with the guardrail, a fake model and the upstream MCP server."""
    assert LITELLM is not None, "the litellm console script is not installed next to this Python"
    folder = tmp_path_factory.mktemp("litellm")
    env = gateway_env(redis_server.url, LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_MODE="PRODUCTION")
    with served([*UPSTREAM, "--http"], env) as upstream:
        config = {
            "model_list": [{"model_name": "fake", "litellm_params": {
                "model": "openai/fake", "api_key": "sk-fake", "mock_response": "hello from the fake model"}}],
            "mcp_servers": {"upstream": {"url": upstream.url, "transport": "http"}},
            "guardrails": [{"guardrail_name": "distbrake", "litellm_params": {
                "guardrail": "distbrake.integrations.litellm.LoopBrakeGuardrail",
                "mode": ["pre_mcp_call", "post_mcp_call"], "default_on": True, "url": "os.environ/DISTBRAKE_URL"}}],
            "general_settings": {"master_key": MASTER_KEY},
        }
        (folder / "config.yaml").write_text(yaml.safe_dump(config))
        port = free_port()
        argv = [LITELLM, "--config", str(folder / "config.yaml"), "--host", "127.0.0.1", "--port", str(port)]
        with served(argv, env, serving=UVICORN, cwd=folder) as gateway:
            yield gateway.url, gateway


async def fleet_sessions(url: str) -> list[str]:
    """The sessions the fleet's Redis holds, read by a brake of our own."""
    brake = AsyncDistributedBrake.from_url(url)
    try:
        return await session_names(brake)
    finally:
        await brake.aclose()


def mcp_client(url: str, session: str | None) -> Client[Any]:
    headers = {"Authorization": f"Bearer {MASTER_KEY}"}
    if session is not None:
        headers["x-litellm-session-id"] = session
    return Client(StreamableHttpTransport(f"{url}/mcp/", headers=headers), timeout=60)


async def test_third_identical_mcp_call_through_litellm_is_refused_with_the_brakes_text(
    litellm_gateway: tuple[str, Any], redis_server: Any
) -> None:
    url, _ = litellm_gateway
    async with mcp_client(url, "agent-1") as client:
        tools = [tool.name for tool in await client.list_tools()]
        assert "upstream-search" in tools
        results = [await client.call_tool("upstream-search", {"q": "same"}, raise_on_error=False)
                   for _ in range(3)]
        other = await client.call_tool("upstream-search", {"q": "other"}, raise_on_error=False)
    texts = [result.content[0].text for result in results]  # type: ignore[union-attr]
    assert [result.is_error for result in results] == [False, False, True]
    assert texts[:2] == ["found same (call 1)", "found same (call 2)"]
    assert REFUSAL in texts[2] and "same" not in texts[2].replace("identical", "")
    assert other.is_error is False
    async with mcp_client(url, "agent-2") as client:  # another session: its own streak
        fresh = await client.call_tool("upstream-search", {"q": "same"}, raise_on_error=False)
    assert fresh.is_error is False
    sessions = await fleet_sessions(redis_server.url)
    assert {"litellm-user:default_user_id/agent-1", "litellm-user:default_user_id/agent-2"} <= set(sessions)


async def test_the_fake_model_answers_and_listing_is_not_counted(
    litellm_gateway: tuple[str, Any], redis_server: Any
) -> None:
    url, _ = litellm_gateway
    async with httpx2.AsyncClient(timeout=60) as http:
        answer = await http.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {MASTER_KEY}"},
                                 json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "hello from the fake model"
    async with mcp_client(url, "lister") as client:
        for _ in range(3):
            await client.list_tools()
    sessions = await fleet_sessions(redis_server.url)
    assert not any("lister" in session for session in sessions)  # tools/list scans count nothing


# -- the class under LiteLLM's own hook arguments ---------------------------------------------


@pytest.fixture(params=ADAPTER_BRAKES)
def make_brake(request: pytest.FixtureRequest, brakes: Brakes) -> Callable[..., Brake]:
    return brakes.of(request.param)


def mcp_data(tool: str, arguments: dict[str, Any], session: str | None = "s", call_type: str = "call_mcp_tool",
             **extra: Any) -> tuple[dict[str, Any], Any]:
    """What LiteLLM's `_convert_mcp_to_llm_format` hands a guardrail for one MCP call, and its logger."""
    logger = SimpleNamespace(call_type=call_type, model_call_details={})
    headers = {"x-litellm-session-id": session} if session else {}
    data = {"mcp_tool_name": tool, "mcp_arguments": arguments, "metadata": {"headers": headers},
            "user_api_key_user_id": "default_user_id", "litellm_logging_obj": logger, **extra}
    return data, logger


async def pre(guardrail: LoopBrakeGuardrail, data: dict[str, Any], logger: Any) -> str | None:
    try:
        await guardrail.apply_guardrail({"texts": []}, data, "request", logger)
    except HTTPException as refused:
        text: str = refused.detail["error"]
        return text
    return None


async def test_pre_mcp_call_refuses_the_third_identical_call(make_brake: Callable[..., Brake]) -> None:
    guardrail = LoopBrakeGuardrail(brake=make_brake(), guardrail_name="distbrake")
    outcomes = [await pre(guardrail, *mcp_data("search", {"q": "secret-q"})) for _ in range(3)]
    assert outcomes[:2] == [None, None]
    assert outcomes[2] is not None and REFUSAL in outcomes[2] and "secret-q" not in outcomes[2]


async def test_a_halted_session_is_refused_every_later_call_and_completion(make_brake: Callable[..., Brake]) -> None:
    """LiteLLM has no run of its own to end: from the halting call on, every call of the session (any tool, MCP or
    in a completion: the whole completion fails) is refused with the halt text; other sessions go on."""
    guardrail = LoopBrakeGuardrail(brake=make_brake(max_repeats=3, halt_at=5), event_hook=["pre_mcp_call", "post_call"])
    outcomes = [await pre(guardrail, *mcp_data("search", {"q": "secret-q"}, "stuck")) for _ in range(5)]
    assert outcomes[:2] == [None, None] and all(o is not None for o in outcomes[2:])
    assert not any("is halted" in str(o) for o in outcomes[:4])
    halted = str(outcomes[4])
    assert 'session "litellm-user:default_user_id/stuck" is halted' in halted and "secret-q" not in halted
    other = await pre(guardrail, *mcp_data("fetch", {"url": "u"}, "stuck"))
    assert other is not None and "is halted" in other
    call = {"id": "c", "type": "function", "function": {"name": "fetch", "arguments": '{"url": "v"}'}}
    data = {"metadata": {"headers": {"x-litellm-session-id": "stuck"}}, "user_api_key_user_id": "default_user_id"}
    with pytest.raises(HTTPException) as refused:
        await guardrail.apply_guardrail({"texts": ["ok"], "tool_calls": [call]}, data, "response")
    assert "is halted" in refused.value.detail["error"]
    assert await pre(guardrail, *mcp_data("search", {"q": "secret-q"}, "free")) is None


async def test_sessions_are_scoped_by_the_caller_and_listing_is_not_a_call(make_brake: Callable[..., Brake]) -> None:
    brake = make_brake()
    guardrail = LoopBrakeGuardrail(brake=brake)
    await pre(guardrail, *mcp_data("search", {"q": 1}, "conv"))
    await pre(guardrail, *mcp_data("search", {"q": 1}, None, metadata={"headers": {"x-litellm-trace-id": "tr"}}))
    await pre(guardrail, *mcp_data("search", {"q": 1}, "conv", user_api_key_hash="h4sh"))
    await pre(guardrail, *mcp_data("search", {}, "listing", call_type="list_mcp_tools"))
    scan, _ = mcp_data("search", {}, "scan")
    del scan["litellm_logging_obj"]  # LiteLLM's catalog guard scans a listed tool with no logger
    await guardrail.apply_guardrail({"texts": []}, scan, "request", None)
    assert await session_names(brake) == [
        "litellm-key:h4sh/conv", "litellm-user:default_user_id/conv", "litellm-user:default_user_id/tr"]


async def test_require_session_refuses_a_call_naming_none(make_brake: Callable[..., Brake]) -> None:
    guardrail = LoopBrakeGuardrail(brake=make_brake(), require_session=True)
    data, logger = mcp_data("search", {"q": 1}, None)
    del data["user_api_key_user_id"]
    text = await pre(guardrail, data, logger)
    assert text is not None and "requires a session" in text


async def test_post_mcp_call_observes_a_progress_aware_tools_result(make_brake: Callable[..., Brake]) -> None:
    guardrail = LoopBrakeGuardrail(brake=make_brake(tools={"poll": {"progress": True}}))

    async def poll(result: str) -> str | None:
        data, logger = mcp_data("poll", {"job": 7})
        refused = await pre(guardrail, data, logger)
        if refused is None:  # LiteLLM hands post_mcp_call the logger's model_call_details
            await guardrail.apply_guardrail({"texts": [result]}, logger.model_call_details, "response", logger)
        return refused

    assert [await poll(f"{n}% done") for n in (10, 20, 30, 40)] == [None] * 4  # changing: never denied
    outcomes = [await poll("stuck at 40%") for _ in range(3)]
    assert outcomes[:2] == [None, None] and outcomes[2] is not None and "poll" in outcomes[2]


async def test_post_call_mode_checks_a_completions_tool_calls(make_brake: Callable[..., Brake]) -> None:
    guardrail = LoopBrakeGuardrail(brake=make_brake(), event_hook=["post_call"])
    call = {"id": "call_1", "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}}
    data = {"metadata": {"headers": {"x-litellm-session-id": "chat"}}}
    for _ in range(2):
        await guardrail.apply_guardrail({"texts": ["ok"], "tool_calls": [call]}, dict(data), "response")
    with pytest.raises(HTTPException) as refused:  # the whole completion fails, not one tool call
        await guardrail.apply_guardrail({"texts": ["ok"], "tool_calls": [call]}, dict(data), "response")
    assert REFUSAL in refused.value.detail["error"]
    bad = {**call, "function": {"name": "search", "arguments": '{"q": '}}  # invalid JSON: its own streak
    await guardrail.apply_guardrail({"tool_calls": [bad]}, dict(data), "response")


def test_missing_extra_names_the_install_line(monkeypatch: pytest.MonkeyPatch) -> None:
    names_its_extra_when_missing(monkeypatch, "litellm", "litellm", "litellm")


def test_importing_distbrake_leaves_litellm_alone() -> None:
    import_leaves_the_framework_alone("litellm")
