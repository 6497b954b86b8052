"""`distbrake serve`: a real server process on a free port, real HTTP (httpx), the hosts' documented events."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests import hook_events
from tests.serve_process import ROOT, Server, start

SECRET = "sk-live-NEVER-ECHOED-777"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with start(tmp_path) as running:
        yield running


def test_claude_code_http_hook_denies_the_third_identical_call(server: Server) -> None:
    answers = [server.post("/v1/hooks/claude-code", hook_events.claude_pre(call=f"toolu_{i}")) for i in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.json() for a in answers[:2]] == [{}, {}]
    specific = answers[2].json()["hookSpecificOutput"]
    assert specific["permissionDecision"] == "deny" and specific["hookEventName"] == "PreToolUse"
    assert specific["permissionDecisionReason"].startswith('loop brake: tool "Bash" called 3 times in a row')


@pytest.mark.parametrize("name", ["codex", "gemini", "cursor"])
def test_other_hosts_have_their_endpoints(server: Server, name: str) -> None:
    answers = [server.post(f"/v1/hooks/{name}", {**hook_events.PRE[name](), **(
        {"tool_use_id": f"c{i}"} if "tool_use_id" in hook_events.PRE[name]() else {})}) for i in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert "deny" in answers[2].text and "deny" not in answers[1].text


def test_check_api_gives_the_verdict_and_the_refusal_with_its_kind(server: Server) -> None:
    call = {"tool": "search", "args": {"q": SECRET}, "session": "s-1"}
    first, second, third = (server.post("/v1/check", {**call, "call_id": f"c{i}"}).json() for i in range(3))
    assert first == {"allowed": True, "count": 1, "max_repeats": 3, "hash_prefix": first["hash_prefix"],
                     "session": "s-1", "tool": "search", "warning": None, "would_deny": False, "replayed": False,
                     "exempt": False, "decided_by": "in-process"}
    assert second["count"] == 2 and len(first["hash_prefix"]) == 12
    assert third["allowed"] is False
    error = third["error"]
    assert (error["code"], error["kind"], error["count"], error["session"]) == ("LOOP_BRAKE", "repeat", 3, "s-1")
    assert error["message"].startswith('loop brake: tool "search" called 3 times in a row')
    assert SECRET not in json.dumps(third)
    again = server.post("/v1/check", {**call, "call_id": "c2"}).json()  # a retry of the third call: same answer
    assert again["allowed"] is False and again["error"]["count"] == 3


def test_observe_needs_a_call_id_and_ignores_tools_without_progress(server: Server) -> None:
    assert server.post("/v1/observe", {"tool": "t", "args": {}, "session": "s"}).status_code == 400
    answer = server.post("/v1/observe", {"tool": "t", "args": {}, "session": "s", "call_id": "c", "result": 1})
    assert answer.status_code == 200 and answer.json() == {"observed": False}


@pytest.mark.parametrize(("path", "body", "said"), [
    ("/v1/check", b"{not json " + SECRET.encode(), "the body is not JSON"),
    ("/v1/check", json.dumps([SECRET]).encode(), "the body is a JSON list, not an object"),
    ("/v1/check", json.dumps({"tool": "t", "args": {"k": SECRET}}).encode(), "'session' must be a non-empty string"),
    ("/v1/check", json.dumps({"tool": 5, "session": SECRET}).encode(), "'tool' must be a non-empty string"),
    ("/v1/hooks/claude-code", json.dumps({"hook_event_name": "Stop", "session_id": SECRET}).encode(),
     "'Stop' is not a tool event"),
    ("/v1/hooks/claude-code", json.dumps({"hook_event_name": "PreToolUse", "tool_input": {"k": SECRET}}).encode(),
     "no 'session_id' field"),
])
def test_bad_bodies_get_400_naming_the_problem_never_the_values(server: Server, path: str, body: bytes,
                                                                said: str) -> None:
    answer = server.post(path, body)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "BAD_REQUEST" and said in answer.json()["error"]["message"]
    assert SECRET not in answer.text


def test_bodies_over_the_cap_get_413(tmp_path: Path) -> None:
    with start(tmp_path, "--max-body", "2048") as server:
        big = {"tool": "t", "session": "s", "args": {"blob": "x" * 4096}}
        assert server.post("/v1/check", big).status_code == 413
        chunked = server.post("/v1/check", iter([json.dumps(big).encode()]))  # no Content-Length
        assert chunked.status_code == 413
        assert server.post("/v1/check", {"tool": "t", "session": "s"}).status_code == 200


def test_metrics_count_requests_by_endpoint_and_outcome(server: Server) -> None:
    for i in range(3):
        server.post("/v1/check", {"tool": "t", "session": "m", "call_id": str(i)})
    text = httpx.get(server.url + "/metrics", timeout=10).text
    assert 'distbrake_serve_requests_total{endpoint="check",outcome="allowed"} 2.0' in text
    assert 'distbrake_serve_requests_total{endpoint="check",outcome="denied"} 1.0' in text


def test_a_token_is_required_on_any_other_address(tmp_path: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("DISTBRAKE_")}
    refused = subprocess.run([sys.executable, "-m", "distbrake", "serve", "--host", "0.0.0.0", "--port", "1"],
                             env={**environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60,
                             check=False)
    assert refused.returncode == 2
    assert "not a loopback address: a token is required" in refused.stderr


def test_with_a_token_every_endpoint_but_healthz_needs_it(tmp_path: Path) -> None:
    with start(tmp_path, env={"DISTBRAKE_SERVE_TOKEN": "t0ken-123"}) as server:
        body = {"tool": "t", "session": "s"}
        assert server.post("/v1/check", body).status_code == 401
        assert server.post("/v1/check", body, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert server.post("/v1/check", body, headers={"Authorization": "Bearer t0ken-123"}).status_code == 200
        assert httpx.get(server.url + "/metrics", timeout=10).status_code == 401
        assert httpx.get(server.url + "/healthz", timeout=10).json()["status"] == "ok"


def test_redis_backend_shares_streaks_with_hooks_and_health_says_when_it_is_down(
    tmp_path: Path, redis_url: str
) -> None:
    with start(tmp_path, "--url", redis_url) as server:
        assert httpx.get(server.url + "/healthz", timeout=10).json()["status"] == "ok"
        for i in range(2):
            event = hook_events.claude_pre(session="team", call=f"h{i}")
            assert server.post("/v1/hooks/claude-code", event).json() == {}
        environ = {k: v for k, v in os.environ.items() if not k.startswith("DISTBRAKE_")}
        hook = subprocess.run([sys.executable, "-m", "distbrake", "hook", "claude-code"],
                              input=json.dumps(hook_events.claude_pre(session="team", call="h3")),
                              env={**environ, "PYTHONPATH": str(ROOT), "DISTBRAKE_URL": redis_url},
                              capture_output=True, text=True, timeout=60, check=True)
        assert "called 3 times in a row" in hook.stdout  # the command hook saw the server's two calls
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    with start(tmp_path, "--url", f"redis://127.0.0.1:{dead_port}", "--timeout", "0.2") as server:
        health = httpx.get(server.url + "/healthz", timeout=10)
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        began = time.perf_counter()
        answer = server.post("/v1/check", {"tool": "t", "session": "s"})
        assert time.perf_counter() - began < 2.0  # the brake's timeout (0.2 s) bounds the answer
        assert answer.status_code == 200 and answer.json()["decided_by"] == "fallback"  # the default policy


def test_concurrent_checks_of_one_session_are_counted_exactly(tmp_path: Path) -> None:
    """200 concurrent checks of one call in one session (batched into shared transactions): counts 1..200, once each."""
    import asyncio

    async def burst(url: str) -> list[int]:
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
            answers = await asyncio.gather(*(
                client.post("/v1/check", json={"tool": "t", "args": {"a": 1}, "session": "busy", "call_id": f"c{i}"})
                for i in range(200)))
        return sorted(answer.json()["count"] for answer in answers)

    with start(tmp_path, "--max-repeats", "1000") as server:
        assert asyncio.run(burst(server.url)) == list(range(1, 201))
        rows = httpx.post(server.url + "/v1/check", json={"tool": "t", "args": {"a": 1}, "session": "busy"}).json()
        assert rows["count"] == 201


def test_the_docker_mcp_gateway_interceptor_is_mounted(server: Server) -> None:
    # docker/mcp-gateway's `before:http:<url>` posts its CallToolRequest and reads a non-empty answer as the
    # CallToolResult that replaces the call; an empty 200 lets the call through (tests/test_gateway_docker.py
    # pins the shapes). The answer is always 200: the gateway reads any body as a result.
    from tests.test_gateway_docker import as_go_result, go_request

    request = go_request(arguments={"q": "weather"}, meta={"sessionId": "docker-1"})
    answers = [server.post("/docker/before", request) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.content for a in answers[:2]] == [b"", b""]
    refused = as_go_result(answers[2].content)
    assert refused["isError"] is True and "called 3 times in a row" in refused["content"][0]["text"]
    after = server.post("/docker/after", b'{"content":[],"isError":false}')
    assert (after.status_code, after.content) == (200, b"")
