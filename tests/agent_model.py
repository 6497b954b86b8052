"""A scripted model server for the real coding agents: it asks for one shell command forever, until refused.

It speaks the two model APIs the agents take a base URL for, streaming as they
request: the Anthropic Messages API (`POST /v1/messages`, Claude Code via
`ANTHROPIC_BASE_URL`) and the OpenAI Responses API (`POST /v1/responses`, Codex
via a `model_providers` entry with `wire_api = "responses"`). Every turn of the
scripted agent asks for the same tool call (`COMMAND`, which appends a line to a
file, so the test counts how often it really ran) until the last tool result
it was sent carries the brake's refusal ("loop brake"); then it answers
`FINAL` and the turn ends. Requests that offer no shell tool (title or summary
side calls) get a short text. Every request body is kept for the assertions.

Run as a process: `python -m tests.agent_model PORT_FILE COMMAND`; it writes its port to PORT_FILE.
"""

from __future__ import annotations

import json
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FINAL = "The loop brake refused the repeated command, so I stopped."
REFUSAL = "loop brake"


def _text_of(value: Any) -> str:
    """Every string inside a JSON value, joined (to look for the refusal in a tool result)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return " ".join(_text_of(v) for v in value.values())
    if isinstance(value, list):
        return " ".join(_text_of(v) for v in value)
    return ""


class Script:
    """`limit`: how many tool calls one conversation asks for at most (None: until refused)."""

    def __init__(self, command: str, limit: int | None = None) -> None:
        self.command = command
        self.limit = limit
        self.lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self.refusals_seen: list[str] = []

    # -- Anthropic Messages API -------------------------------------------------
    def anthropic(self, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        tools = [tool.get("name") for tool in body.get("tools") or []]
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        results = [part for part in last.get("content") or [] if isinstance(part, dict)
                   and part.get("type") == "tool_result"] if isinstance(last.get("content"), list) else []
        refused = [r for r in results if REFUSAL in _text_of(r.get("content"))]
        if refused:
            with self.lock:
                self.refusals_seen.append(_text_of(refused[-1].get("content")))
        done = sum(1 for m in messages if isinstance(m.get("content"), list) for part in m["content"]
                   if isinstance(part, dict) and part.get("type") == "tool_result")
        if "Bash" not in tools or refused or (self.limit is not None and done >= self.limit):
            return _anthropic_text(body, FINAL if refused else "ok")
        return _anthropic_tool(body, "Bash", {"command": self.command, "description": "Append a line"})

    # -- OpenAI Responses API ---------------------------------------------------
    def responses(self, body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        items = body.get("input") or []
        outputs = [item for item in items if isinstance(item, dict) and item.get("type") == "function_call_output"]
        last_output = outputs[-1] if outputs else None
        # only the outputs after the last user message belong to this turn
        refused = last_output is not None and REFUSAL in _text_of(last_output.get("output"))
        if refused and last_output is not None:
            with self.lock:
                self.refusals_seen.append(_text_of(last_output.get("output")))
        names = {tool.get("name") for tool in body.get("tools") or [] if isinstance(tool, dict)}
        over = self.limit is not None and len(outputs) >= self.limit
        if refused or over or not names & {"shell", "exec_command", "shell_command"}:
            return _responses_text(body, FINAL if refused else "ok")
        if "shell_command" in names:
            return _responses_call(body, "shell_command", {"command": self.command})
        if "exec_command" in names:
            return _responses_call(body, "exec_command", {"cmd": self.command})
        return _responses_call(body, "shell", {"command": ["bash", "-lc", self.command]})


def _anthropic_text(body: dict[str, Any], text: str) -> list[tuple[str, dict[str, Any]]]:
    message = _anthropic_start(body)
    return [
        ("message_start", {"type": "message_start", "message": message}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "text_delta", "text": text}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": 5}}),
        ("message_stop", {"type": "message_stop"}),
    ]


def _anthropic_tool(body: dict[str, Any], name: str, arguments: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    message = _anthropic_start(body)
    return [
        ("message_start", {"type": "message_start", "message": message}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {
            "type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:24]}", "name": name, "input": {}}}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0,
                                 "delta": {"type": "input_json_delta", "partial_json": json.dumps(arguments)}}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                           "usage": {"output_tokens": 20}}),
        ("message_stop", {"type": "message_stop"}),
    ]


def _anthropic_start(body: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant", "content": [],
        "model": body.get("model", "claude-test"), "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 1, "cache_creation_input_tokens": 0,
                  "cache_read_input_tokens": 0},
    }


def _responses_envelope(body: dict[str, Any], output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": f"resp_{uuid.uuid4().hex[:24]}", "object": "response", "created_at": 0, "status": "completed",
        "model": body.get("model", "gpt-test"), "output": output,
        "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15},
    }


def _responses_text(body: dict[str, Any], text: str) -> list[tuple[str, dict[str, Any]]]:
    item = {"type": "message", "id": f"msg_{uuid.uuid4().hex[:16]}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}
    return _responses_stream(body, item)


def _responses_call(body: dict[str, Any], name: str, arguments: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    item = {"type": "function_call", "id": f"fc_{uuid.uuid4().hex[:16]}", "call_id": f"call_{uuid.uuid4().hex[:16]}",
            "name": name, "arguments": json.dumps(arguments), "status": "completed"}
    return _responses_stream(body, item)


def _responses_stream(body: dict[str, Any], item: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    started = _responses_envelope(body, [])
    started["status"] = "in_progress"
    return [
        ("response.created", {"type": "response.created", "response": started}),
        ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0, "item": item}),
        ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
        ("response.completed", {"type": "response.completed", "response": _responses_envelope(body, [item])}),
    ]


def serve(command: str, port: int = 0, limit: int | None = None) -> tuple[ThreadingHTTPServer, Script]:
    script = Script(command, limit)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # models lists and the like: an empty, valid answer
            self._json(200, {"data": [], "object": "list", "models": []})

        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if self.headers.get("Content-Encoding") == "zstd":
                self._json(415, {"error": "zstd"})
                return
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                self._json(400, {"error": "bad json"})
                return
            with script.lock:
                script.requests.append({"path": self.path, "body": body})
            path = self.path.split("?")[0]
            if path.endswith("/messages/count_tokens"):
                self._json(200, {"input_tokens": 10})
            elif path.endswith("/messages"):
                self._events(script.anthropic(body), body.get("stream", False), anthropic=True)
            elif path.endswith("/responses"):
                self._events(script.responses(body), True, anthropic=False)
            else:
                self._json(404, {"error": "unknown path"})

        def _json(self, status: int, value: Any) -> None:
            data = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _events(self, events: list[tuple[str, dict[str, Any]]], stream: bool, anthropic: bool) -> None:
            if not stream and anthropic:
                self._json(200, _collapse(events))
                return
            data = b"".join(f"event: {name}\ndata: {json.dumps(event)}\n\n".encode() for name, event in events)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    return server, script


def _collapse(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """A streamed Anthropic answer as one non-streamed message."""
    message = dict(events[0][1]["message"])
    block = dict(events[1][1]["content_block"])
    delta = events[2][1]["delta"]
    if block["type"] == "text":
        block["text"] = delta["text"]
    else:
        block["input"] = json.loads(delta["partial_json"])
    message["content"] = [block]
    message["stop_reason"] = events[4][1]["delta"]["stop_reason"]
    return message


if __name__ == "__main__":
    server, script = serve(sys.argv[2])
    with open(sys.argv[1] + ".tmp", "w") as handle:
        handle.write(str(server.server_address[1]))
    import os

    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    server.serve_forever()
