"""`distbrake proxy` between real MCP clients and a real upstream MCP server process.

Every proxy here is a real `python -m distbrake proxy` process on a real
redis-server; the upstream is `tests.gateway_upstream` as its own process;
the clients are FastMCP's `Client` and the `mcp` SDK's `Client`.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp
from fastmcp import Client
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport
from mcp.client.stdio import StdioServerParameters

from distbrake import LoopBrakeError
from tests.gateway_processes import PROXY, ROOT, UPSTREAM, gateway_env, served
from tests.servers import free_port

REFUSAL = 'loop brake: tool "{tool}" called 3 times in a row with identical arguments'
TIMEOUT = 60.0


def stdio_proxy(redis_url: str, *options: str, log: Path | None = None, **env: str) -> StdioTransport:
    """FastMCP's stdio transport to a proxy process whose upstream is a stdio process."""
    return StdioTransport(PROXY[0], [*PROXY[1:], *options, "--", *UPSTREAM], env=gateway_env(redis_url, **env),
                          cwd=str(ROOT), keep_alive=False, log_file=log)


async def call(client: Client[Any], tool: str, arguments: Any, **meta: Any) -> tuple[bool, str]:
    result = await client.call_tool(tool, arguments, raise_on_error=False, meta=meta or None)
    return result.is_error, result.content[0].text if result.content else ""


async def three(client: Client[Any], tool: str = "search", arguments: Any = None, **meta: Any) -> list[bool]:
    outcomes = [await call(client, tool, arguments or {"q": "same"}, **meta) for _ in range(3)]
    assert REFUSAL.format(tool=tool) in outcomes[2][1], outcomes
    return [error for error, _ in outcomes]


# -- over stdio: both clients -------------------------------------------------------------


async def test_fastmcp_client_over_stdio_third_identical_call_refused(redis_url: str) -> None:
    async with Client(stdio_proxy(redis_url), timeout=TIMEOUT) as client:
        assert await three(client, session_id="a") == [False, False, True]
        assert await call(client, "search", {"q": "same"}, session_id="b") == (False, "found same (call 3)")


async def test_mcp_sdk_client_over_stdio_third_identical_call_refused(redis_url: str) -> None:
    params = StdioServerParameters(command=PROXY[0], args=[*PROXY[1:], "--", *UPSTREAM],
                                   env=gateway_env(redis_url), cwd=str(ROOT))
    async with mcp.Client(params, read_timeout_seconds=TIMEOUT) as client:
        texts = []
        for _ in range(3):
            result = await client.call_tool("search", {"q": "same"}, meta={"session_id": "sdk"})
            texts.append((result.is_error, result.content[0].text))  # type: ignore[union-attr]
    assert [error for error, _ in texts] == [False, False, True]
    assert REFUSAL.format(tool="search") in texts[2][1]


# -- over Streamable HTTP: two proxy processes, one Redis ------------------------------------


@contextmanager
def http_chain(redis_url: str, proxies: int = 1, *options: str, **extra: str) -> Iterator[tuple[Any, list[Any]]]:
    """An HTTP upstream process and `proxies` HTTP proxy processes in front of it (`extra`: their environment)."""
    env = gateway_env(redis_url, **extra)
    with served([*UPSTREAM, "--http"], env) as upstream:
        with contextlib_exit_stack() as stack:
            fronts = [stack.enter_context(served(
                [*PROXY, "--http", "127.0.0.1:0", "--upstream", upstream.url, *options], env))
                for _ in range(proxies)]
            yield upstream, fronts


@contextmanager
def contextlib_exit_stack() -> Iterator[Any]:
    from contextlib import ExitStack

    with ExitStack() as stack:
        yield stack


async def test_two_http_proxies_on_one_redis_share_a_session_streak(redis_url: str) -> None:
    with http_chain(redis_url, 2) as (_, (one, two)):
        async with Client(StreamableHttpTransport(one.url), timeout=TIMEOUT) as a, \
                Client(StreamableHttpTransport(two.url), timeout=TIMEOUT) as b:
            assert await call(a, "search", {"q": "x"}, session_id="fleet") == (False, "found x (call 1)")
            assert await call(b, "search", {"q": "x"}, session_id="fleet") == (False, "found x (call 2)")
            error, text = await call(a, "search", {"q": "x"}, session_id="fleet")
            assert error and REFUSAL.format(tool="search") in text
            error, text = await call(b, "search", {"q": "x"}, session_id="fleet")
            assert error and "called 4 times" in text
            assert await call(b, "search", {"q": "x"}, session_id="other") == (False, "found x (call 3)")


async def test_mcp_sdk_client_over_http(redis_url: str) -> None:
    with http_chain(redis_url) as (_, (front,)):
        async with mcp.Client(front.url, read_timeout_seconds=TIMEOUT) as client:
            errors = []
            for _ in range(3):
                result = await client.call_tool("search", {"q": "h"}, meta={"session_id": "http"})
                errors.append(result.is_error)
            assert errors == [False, False, True]
            assert REFUSAL.format(tool="search") in result.content[0].text  # type: ignore[union-attr]


async def test_a_halted_session_is_refused_by_every_proxy_on_the_redis(redis_url: str) -> None:
    """The ladder end to end: a client repeating one call through one proxy is halted at its fifth call
    (`DISTBRAKE_HALT_AT=5`), and a second proxy process on the same Redis refuses that session's next call
    of any tool with the halt; other sessions go on."""
    with http_chain(redis_url, 2, DISTBRAKE_MAX_REPEATS="3", DISTBRAKE_HALT_AT="5") as (_, (one, two)):
        async with Client(StreamableHttpTransport(one.url), timeout=TIMEOUT) as a, \
                Client(StreamableHttpTransport(two.url), timeout=TIMEOUT) as b:
            outcomes = [await call(a, "search", {"q": "loop"}, session_id="stuck") for _ in range(5)]
            assert [error for error, _ in outcomes] == [False, False, True, True, True]
            assert not any("is halted" in text for _, text in outcomes[:4])
            halted = outcomes[4][1]
            assert 'session "stuck" is halted' in halted and "called 5 times in a row" in halted
            assert "loop" not in halted.replace("loop brake", "")
            error, text = await call(b, "echo_meta", {}, session_id="stuck")
            assert error and 'session "stuck" is halted' in text
            assert await call(b, "search", {"q": "loop"}, session_id="free") == (False, "found loop (call 3)")


# -- everything else passes through unchanged -----------------------------------------------


async def observe(client: Client[Any]) -> dict[str, Any]:
    """What a client sees of the upstream: tools, resources, prompts, progress, _meta, errors."""
    progress: list[tuple[float, float | None, str | None]] = []

    async def on_progress(done: float, total: float | None, message: str | None) -> None:
        progress.append((done, total, message))

    tools = [tool.model_dump(exclude={"meta"}) for tool in await client.list_tools()]
    counted = await client.call_tool("count_progress", {"steps": 3}, progress_handler=on_progress,
                                     meta={"session_id": "p"})
    echoed = await client.call_tool("echo_meta", {}, meta={"session_id": "p", "trace": {"id": "t-1"}})
    failed = await client.call_tool("fail", {}, raise_on_error=False, meta={"session_id": "p"})
    resources = [str(r.uri) for r in await client.list_resources()]
    prompt = await client.get_prompt("greet", {"name": "Ada"})
    return {
        "tools": tools,
        "resources": resources,
        "resource": [c.model_dump() for c in await client.read_resource("data://greeting")],
        "prompts": [p.name for p in await client.list_prompts()],
        "prompt": [m.model_dump() for m in prompt.messages],
        "progress": progress,
        "counted": [c.model_dump() for c in counted.content],
        "meta": {k: v for k, v in echoed.structured_content["meta"].items()  # type: ignore[index]
                 if k in ("session_id", "trace")},
        "failed": (failed.is_error, [c.model_dump() for c in failed.content]),
    }


async def test_tools_resources_prompts_progress_meta_and_errors_pass_through_unchanged(redis_url: str) -> None:
    with http_chain(redis_url) as (upstream, (front,)):
        async with Client(StreamableHttpTransport(upstream.url), timeout=TIMEOUT) as direct:
            expected = await observe(direct)
        async with Client(StreamableHttpTransport(front.url), timeout=TIMEOUT) as proxied:
            seen = await observe(proxied)
    assert seen == expected
    assert seen["progress"] == [(1.0, 3.0, "step 1"), (2.0, 3.0, "step 2"), (3.0, 3.0, "step 3")]
    assert seen["meta"] == {"session_id": "p", "trace": {"id": "t-1"}}
    assert seen["failed"][0] is True and "upstream says no" in json.dumps(seen["failed"][1])


# -- what only a gateway sees: unknown tools, malformed calls ---------------------------------


async def test_unknown_tool_repeats_are_refused(redis_url: str) -> None:
    async with Client(stdio_proxy(redis_url), timeout=TIMEOUT) as client:
        outcomes = [await call(client, "serach", {"q": "typo"}, session_id="u") for _ in range(3)]
    assert [error for error, _ in outcomes] == [True, True, True]
    assert "Unknown tool" in outcomes[0][1] and "Unknown tool" in outcomes[1][1]
    assert REFUSAL.format(tool="serach") in outcomes[2][1]


class RawStdio:
    """A JSON-RPC conversation with a proxy process over its stdin/stdout (what no SDK client sends)."""

    def __init__(self, redis_url: str, *options: str) -> None:
        self.process = subprocess.Popen(
            [*PROXY, *options, "--", *UPSTREAM], env=gateway_env(redis_url), cwd=ROOT,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.next_id = 0
        self.buffer = b""
        self.stderr: list[bytes] = []
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()

    def _drain(self) -> None:
        assert self.process.stderr is not None
        self.stderr.extend(iter(self.process.stderr.readline, b""))

    def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message).encode() + b"\n")
        self.process.stdin.flush()

    def request(self, method: str, params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            message = self._read()
            if message.get("id") == self.next_id:
                return message

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        deadline = time.monotonic() + TIMEOUT
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            assert left > 0, "no answer from the proxy: " + b"".join(self.stderr).decode(errors="replace")
            ready, _, _ = select.select([self.process.stdout], [], [], left)
            if ready:
                chunk = os.read(self.process.stdout.fileno(), 65536)
                assert chunk, "the proxy exited: " + b"".join(self.stderr).decode(errors="replace")
                self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        found: dict[str, Any] = json.loads(line)
        return found

    def initialize(self) -> None:
        answer = self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                             "clientInfo": {"name": "raw", "version": "1"}})
        assert "result" in answer, answer
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def close(self) -> str:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=TIMEOUT)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        self.drain.join(timeout=TIMEOUT)
        assert self.process.stdout is not None and self.process.stderr is not None
        self.process.stdout.close()
        self.process.stderr.close()
        return b"".join(self.stderr).decode(errors="replace")


def refused_text(answer: dict[str, Any]) -> str | None:
    result = answer.get("result")
    if isinstance(result, dict) and result.get("isError"):
        text: str = result["content"][0]["text"]
        return text
    return None


def test_malformed_call_repeats_are_refused_with_their_own_identity(redis_url: str) -> None:
    raw = RawStdio(redis_url)
    secret = '{"q": "hunter2-not-json'
    try:
        raw.initialize()
        params = {"name": "search", "arguments": secret, "_meta": {"session_id": "m"}}
        answers = [raw.request("tools/call", params) for _ in range(3)]
        other = raw.request("tools/call", {**params, "arguments": ["a", "list"]})
        valid = raw.request("tools/call", {"name": "search", "arguments": {"q": "fine"}, "_meta": {"session_id": "m"}})
    finally:
        log = raw.close()
    assert [a.get("error", {}).get("code") for a in answers[:2]] == [-32602, -32602], answers
    text = refused_text(answers[2])
    assert text is not None and REFUSAL.format(tool="search") in text, answers[2]
    assert other.get("error", {}).get("code") == -32602  # another raw text: another streak
    assert valid["result"]["isError"] is False  # and a well-formed call is a third streak
    assert "hunter2" not in log and "hunter2" not in json.dumps(answers[2])


def test_a_call_with_no_session_warns_once_and_require_session_refuses(redis_url: str) -> None:
    raw = RawStdio(redis_url)
    try:
        raw.initialize()
        # stdio under 2025-11-25 is one connection: its transport session is the session (step 8)
        first = raw.request("tools/call", {"name": "search", "arguments": {"q": "a"}})
    finally:
        log = raw.close()
    assert first["result"]["isError"] is False
    assert "shared by every such call" not in log

    shared = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)  # noqa: SIM115
    shared.close()
    path = Path(shared.name)

    async def modern() -> list[tuple[bool, str]]:
        async with Client(stdio_proxy(redis_url, log=path), timeout=TIMEOUT) as client:
            return [await call(client, "search", {"q": "shared"}) for _ in range(3)]

    try:
        outcomes = anyio.run(modern)
        log = path.read_text()
    finally:
        path.unlink()
    assert [error for error, _ in outcomes] == [False, False, True]
    assert log.count('counts in the one session "default"') == 1, log

    async def required() -> tuple[bool, str]:
        async with Client(stdio_proxy(redis_url, "--require-session"), timeout=TIMEOUT) as client:
            assert await call(client, "search", {"q": "r"}, session_id="named") == (False, "found r (call 1)")
            return await call(client, "search", {"q": "r"})

    error, text = anyio.run(required)
    assert error and "requires a session" in text


async def test_session_from_names_the_session(redis_url: str) -> None:
    async with Client(stdio_proxy(redis_url, "--session-from", "agent.thread"), timeout=TIMEOUT) as client:
        outcomes = [await call(client, "search", {"q": "s"}, agent={"thread": f"t{n % 2}"}) for n in range(4)]
        assert [error for error, _ in outcomes] == [False] * 4  # two sessions, two calls each
        error, text = await call(client, "search", {"q": "s"}, agent={"thread": "t0"})
        assert error and REFUSAL.format(tool="search") in text


# -- a client that goes away mid-call -------------------------------------------------------


def open_for_writing(fifo: Path) -> Any:
    return open(fifo, "w", encoding="utf-8")


def release(fifo: Path, who: str) -> None:
    """Write one line to the named pipe (blocks until the upstream's `hold` opened it)."""
    with open(fifo, "w", encoding="utf-8") as pipe:
        pipe.write(who + "\n")


@asynccontextmanager
async def fifo_path() -> AsyncIterator[Path]:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "hold"
        os.mkfifo(path)
        yield path


async def test_a_client_that_disconnects_mid_call_loses_nothing(redis_url: str) -> None:
    with http_chain(redis_url) as (_, (front,)):
        async with fifo_path() as fifo:
            arguments = {"fifo": str(fifo)}
            async with anyio.create_task_group() as group:
                async def gone() -> None:
                    async with Client(StreamableHttpTransport(front.url), timeout=TIMEOUT) as client:
                        await client.call_tool("hold", arguments, meta={"session_id": "d"})

                group.start_soon(gone)
                # opening the pipe for writing returns once the upstream's hold opened it: the call arrived
                with anyio.fail_after(TIMEOUT):
                    pipe = await anyio.to_thread.run_sync(open_for_writing, fifo, abandon_on_cancel=True)
                group.cancel_scope.cancel()  # the client disconnects, mid-call
            with pipe:
                pipe.write("nobody\n")
            async with Client(StreamableHttpTransport(front.url), timeout=TIMEOUT) as client:
                async with anyio.create_task_group() as group:
                    group.start_soon(anyio.to_thread.run_sync, release, fifo, "second")
                    second = await call(client, "hold", arguments, session_id="d")
                third = await call(client, "hold", arguments, session_id="d")
                fresh = await call(client, "search", {"q": "after"}, session_id="d")
    assert second == (False, "released by second")  # the proxy and the upstream still serve
    assert third[0] and REFUSAL.format(tool="hold") in third[1]  # the call that went away was counted
    assert fresh == (False, "found after (call 1)")


def test_proxy_usage_errors(redis_url: str) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*PROXY, *args], check=False, env=gateway_env(redis_url), cwd=ROOT,
                              capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)

    neither = run()
    assert neither.returncode == 2 and "either as a command after --" in neither.stderr
    both = run("--upstream", "http://127.0.0.1:1/mcp", "--", "x")
    assert both.returncode == 2
    bad = run("--http", "nowhere", "--", sys.executable)
    assert bad.returncode == 2 and "HOST:PORT" in bad.stderr


# -- the brake's own failures and a halted session --------------------------------------------


def test_a_brake_failure_follows_the_failure_policy() -> None:
    """Redis gone: the default policy lets the call through; `closed` refuses it with the brake's own text."""
    nowhere = f"redis://:pw-secret-9@127.0.0.1:{free_port()}/0"

    async def through(policy: str) -> tuple[bool, str]:
        transport = stdio_proxy(nowhere, DISTBRAKE_ON_BACKEND_ERROR=policy, DISTBRAKE_TIMEOUT_SECONDS="0.2")
        async with Client(transport, timeout=TIMEOUT) as client:
            return await call(client, "search", {"q": "outage"}, session_id="o")

    assert anyio.run(through, "local") == (False, "found outage (call 1)")
    error, text = anyio.run(through, "closed")
    assert error and "pw-secret-9" not in text and "outage" not in text and text, text


class HaltingBrake:
    """A brake whose session is halted (what issue 24's LoopBrakeHalt raises: a LoopBrakeError of kind "halt")."""

    asynchronous = True

    async def check(self, tool: str, args: Any, **_: Any) -> Any:
        raise LoopBrakeError(tool, 1, 3, "0" * 12, "s", kind="halt")


async def test_a_halted_session_gets_an_error_result_saying_so() -> None:
    from fastmcp import FastMCP

    from distbrake.gateways.proxy import build_proxy

    upstream: FastMCP[Any] = FastMCP("up")

    @upstream.tool
    def search(q: str) -> str:
        return q

    async with Client(build_proxy(upstream, HaltingBrake()), timeout=TIMEOUT) as client:
        error, text = await call(client, "search", {"q": "x"}, session_id="s")
    assert error and "halted" in text
