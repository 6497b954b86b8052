"""A real upstream MCP server for the gateway tests: `python -m tests.gateway_upstream [--http]`.

Over stdio by default; with `--http` it serves Streamable HTTP on a free port of
127.0.0.1 and says `serving http://127.0.0.1:PORT/mcp` on stderr once it listens.
Tools: `search(q)`, `count_progress(steps)` (progress notifications),
`echo_meta()` (the `_meta` it received), `fail()` (an upstream tool error),
`hold(fifo)` (blocks until a line is written to the named pipe `fifo`, for
the disconnect test); a resource `data://greeting`; a prompt `greet(name)`.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

import anyio
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError

mcp: FastMCP[Any] = FastMCP("upstream")
calls = {"search": 0}


@mcp.tool
def search(q: str) -> str:
    """Search for q."""
    calls["search"] += 1
    return f"found {q} (call {calls['search']})"


@mcp.tool
async def count_progress(steps: int, ctx: Context) -> str:
    """Report `steps` progress notifications, then finish."""
    for step in range(1, steps + 1):
        await ctx.report_progress(step, steps, f"step {step}")
    return f"counted {steps}"


@mcp.tool
def echo_meta(ctx: Context) -> dict[str, Any]:
    """The _meta of this request, as the upstream received it."""
    request = ctx.request_context
    meta = request.meta if request is not None else None
    return {"meta": dict(meta or {})}


@mcp.tool
def fail() -> str:
    """Always fails with an upstream tool error."""
    raise ToolError("upstream says no")


@mcp.tool
async def hold(fifo: str) -> str:
    """Block until a line arrives on the named pipe `fifo` (opened for reading here)."""
    line = await anyio.to_thread.run_sync(_read_line, fifo)
    return f"released by {line.strip()}"


def _read_line(path: str) -> str:
    with open(path, encoding="utf-8") as pipe:
        return pipe.readline()


@mcp.resource("data://greeting")
def greeting() -> str:
    return "hello from upstream"


@mcp.prompt
def greet(name: str) -> str:
    """A greeting prompt."""
    return f"Hello {name}, from upstream"


def main() -> None:
    if "--http" not in sys.argv[1:]:
        mcp.run(show_banner=False, log_level="WARNING")
        return
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    print(f"serving http://127.0.0.1:{port}/mcp", file=sys.stderr, flush=True)
    anyio.run(lambda: mcp.run_http_async(show_banner=False, sockets=[listener], host="127.0.0.1", port=port,
                                         log_level="warning"))


if __name__ == "__main__":
    main()
