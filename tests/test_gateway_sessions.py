"""The gateway session rule (`distbrake.gateways.sessions`): what each client sends, first match wins."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

import pytest

from distbrake import ConfigurationError, MissingSessionError
from distbrake.gateways.sessions import GatewaySessions, client_session

CODEX = {"x-codex-turn-metadata": {"session_id": "cx", "turn_id": "turn-7"}}
VSCODE = {"vscode": {"conversationId": "vs"}}
OPENCODE = {"sessionID": "oc"}
BAGGAGE = {"baggage": "user.id=u1, session.id=bg%2F1;prop=1,other=x"}


@pytest.mark.parametrize(("meta", "expected"), [
    ({"session_id": "s"}, ("s", None, "meta")),
    ({"session_id": 42, "run_id": "r"}, ("42", "r", "meta")),
    ({"run_id": "r"}, (None, "r", "meta")),
    (CODEX, ("cx", "turn-7", "codex")),
    ({"x-codex-turn-metadata": json.dumps(CODEX["x-codex-turn-metadata"])}, ("cx", "turn-7", "codex")),
    (VSCODE, ("vs", None, "vscode")),
    (OPENCODE, ("oc", None, "opencode")),
    (BAGGAGE, ("bg/1", None, "baggage")),
    ({"session_id": "s", **CODEX, **VSCODE, **OPENCODE, **BAGGAGE}, ("s", None, "meta")),
    ({**CODEX, **VSCODE, **OPENCODE, **BAGGAGE}, ("cx", "turn-7", "codex")),
    ({**VSCODE, **OPENCODE, **BAGGAGE}, ("vs", None, "vscode")),
    ({**OPENCODE, **BAGGAGE}, ("oc", None, "opencode")),
    ({}, None),
    (None, None),
])
def test_each_client_and_the_order(meta: Any, expected: Any) -> None:
    assert client_session(meta) == expected


@pytest.mark.parametrize("meta", [
    {"session_id": ""}, {"session_id": True}, {"session_id": 1.5}, {"session_id": "x" * 257},
    {"session_id": {"nested": 1}}, {"x-codex-turn-metadata": "{not json"}, {"x-codex-turn-metadata": 3},
    {"vscode": "vs"}, {"baggage": "session.id="}, {"baggage": ["session.id=x"]},
    {"baggage": "x" * 9000 + ",session.id=late"},
])
def test_unusable_ids_are_no_session(meta: dict[str, Any]) -> None:
    assert client_session(meta) is None


def test_session_from_is_checked_first() -> None:
    meta = {"session_id": "s", "agent": {"thread": "t-1"}}
    assert client_session(meta, session_from="agent.thread") == ("t-1", None, "session-from")
    assert client_session({"session_id": "s"}, session_from="agent.thread") == ("s", None, "meta")
    with pytest.raises(ConfigurationError):
        GatewaySessions(session_from="agent..thread")


def test_resolve_scopes_by_principal_and_run() -> None:
    rule = GatewaySessions()
    assert rule.resolve({"session_id": "s", "run_id": "r"}) == "s/run/r"
    assert rule.resolve(CODEX) == "cx/run/turn-7"
    assert rule.resolve(CODEX, "principal:::alice") == "principal:::alice/cx/run/turn-7"
    assert rule.resolve({"run_id": "r"}) == "run/r"
    assert rule.resolve({}, "principal:::alice", lambda: "mcp-session:1") == "principal:::alice"
    assert rule.resolve({}, None, lambda: "mcp-session:1") == "mcp-session:1"
    conversation = GatewaySessions(scope="conversation")
    assert conversation.resolve(CODEX) == "cx"
    assert conversation.resolve({"run_id": "r"}, None, lambda: "mcp-session:1") == "mcp-session:1"


def test_shared_session_warns_once_and_require_session_refuses(caplog: pytest.LogCaptureFixture) -> None:
    rule = GatewaySessions()
    with caplog.at_level(logging.WARNING, logger="distbrake"):
        assert [rule.resolve({}), rule.resolve(None), rule.resolve({"session_id": ""})] == ["default"] * 3
    assert len(caplog.records) == 1 and 'one session "default"' in caplog.text
    with pytest.raises(MissingSessionError, match="requires a session"):
        GatewaySessions(require_session=True).resolve({})
    assert GatewaySessions(require_session=True).resolve(VSCODE) == "vs"


def test_the_framework_free_gateway_modules_import_no_framework() -> None:
    code = ("import asyncio, json, sys, distbrake, distbrake.gateways.sessions, distbrake.gateways.calls\n"
            "from distbrake.gateways.docker import DockerInterceptor\n"
            "body = json.dumps({'Params': {'name': 't', 'arguments': {}}, 'Extra': {'TokenInfo': {'UserID': 'u'}}})\n"
            "asyncio.run(DockerInterceptor(distbrake.AsyncDistributedBrake.from_url('memory://')).before(body.encode()))\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'fastmcp', 'mcp', 'litellm', 'fastapi'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "[]"
