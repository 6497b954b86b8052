"""What `distbrake proxy` adds to a tool call: latency per call as a ratio to the same FastMCP proxy, no brake.

    python -m tests.benchmarks.proxy_latency [--calls N]

One run, real processes: a redis-server, the upstream MCP server
(`tests.gateway_upstream`), and two proxies of it: FastMCP's own
`create_proxy(upstream)` (this module, internally) and `distbrake proxy` on
that Redis; first all over stdio, then all over Streamable HTTP. One FastMCP client
calls `search` through each, alternating call by call (so load drifts hit
both alike), every call with new arguments (nothing is denied), each in a
named session. Prints, per transport, the median and p90 per call of each, the
added median latency, and the ratio of the medians (target <= 1.2x); exits 1
when a ratio is above the target.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from contextlib import ExitStack
from typing import Any

import anyio

TARGET = 1.2


def serve_plain_stdio() -> None:
    """FastMCP's own proxy of the upstream over stdio, no brake, served over stdio."""
    import os

    from fastmcp.client.transports import StdioTransport
    from fastmcp.server import create_proxy

    from tests.gateway_processes import UPSTREAM

    upstream = StdioTransport(UPSTREAM[0], UPSTREAM[1:], env=dict(os.environ), cwd=os.getcwd())
    anyio.run(lambda: create_proxy(upstream, name="plain-proxy").run_stdio_async(show_banner=False,
                                                                                log_level="WARNING"))


def serve_plain(upstream: str) -> None:
    """FastMCP's own proxy of `upstream`, no brake, on a free port (said on stderr)."""
    from fastmcp.server import create_proxy

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port = listener.getsockname()[1]
    print(f"serving http://127.0.0.1:{port}/mcp", file=sys.stderr, flush=True)
    proxy = create_proxy(upstream, name="plain-proxy")
    anyio.run(lambda: proxy.run_http_async(show_banner=False, sockets=[listener], host="127.0.0.1", port=port,
                                           log_level="warning"))


async def measure(plain: Any, braked: Any, calls: int, warmup: int) -> dict[str, list[float]]:
    from fastmcp import Client

    timings: dict[str, list[float]] = {"plain": [], "braked": []}
    async with Client(plain, timeout=60) as to_plain, Client(braked, timeout=60) as to_braked:
        clients: dict[str, Any] = {"plain": to_plain, "braked": to_braked}
        for n in range(warmup + calls):
            order = ("plain", "braked") if n % 2 == 0 else ("braked", "plain")
            for name in order:
                start = time.perf_counter()
                result = await clients[name].call_tool("search", {"q": f"query {n}"}, meta={"session_id": "bench"})
                elapsed = time.perf_counter() - start
                assert not result.is_error, result
                if n >= warmup:
                    timings[name].append(elapsed)
    return timings


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.proxy_latency",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--calls", type=int, default=300, help="measured calls through each proxy (default 300)")
    parser.add_argument("--warmup", type=int, default=30, help="calls before measuring (default 30)")
    parser.add_argument("--plain", metavar="URL", help=argparse.SUPPRESS)  # internal: serve the plain proxy
    parser.add_argument("--plain-stdio", action="store_true", help=argparse.SUPPRESS)  # internal: same, stdio
    options = parser.parse_args(argv)
    if options.plain:
        serve_plain(options.plain)
        return 0
    if options.plain_stdio:
        serve_plain_stdio()
        return 0

    from fastmcp.client.transports import StdioTransport, StreamableHttpTransport

    from tests.gateway_processes import PROXY, ROOT, UPSTREAM, gateway_env, served
    from tests.servers import RedisServer

    ratios = []
    with ExitStack() as stack:
        redis = stack.enter_context(RedisServer(name="proxy-bench"))
        env = gateway_env(redis.url)
        this = [sys.executable, "-m", "tests.benchmarks.proxy_latency"]
        stdio = (StdioTransport(this[0], [*this[1:], "--plain-stdio"], env=env, cwd=str(ROOT)),
                 StdioTransport(PROXY[0], [*PROXY[1:], "--", *UPSTREAM], env=env, cwd=str(ROOT)))
        ratios.append(report("stdio", anyio.run(measure, *stdio, options.calls, options.warmup)))
        upstream = stack.enter_context(served([*UPSTREAM, "--http"], env))
        plain = stack.enter_context(served([*this, "--plain", upstream.url], env))
        braked = stack.enter_context(served([*PROXY, "--http", "127.0.0.1:0", "--upstream", upstream.url], env))
        http = (StreamableHttpTransport(plain.url), StreamableHttpTransport(braked.url))
        ratios.append(report("Streamable HTTP", anyio.run(measure, *http, options.calls, options.warmup)))
    return 0 if max(ratios) <= TARGET else 1


def report(transport: str, timings: dict[str, list[float]]) -> float:
    """Print one transport's figures; the ratio of the medians."""
    plain_median = statistics.median(timings["plain"])
    braked_median = statistics.median(timings["braked"])
    ratio = braked_median / plain_median
    print(f"over {transport} (client -> proxy -> upstream, each a process):")
    for name in ("plain", "braked"):
        label = "FastMCP proxy" if name == "plain" else "distbrake proxy"
        print(f"  {label:16} median {statistics.median(timings[name]) * 1000:7.2f} ms   "
              f"p90 {p90(timings[name]) * 1000:7.2f} ms   ({len(timings[name])} calls)")
    print(f"  added per call   median {(braked_median - plain_median) * 1000:+7.2f} ms")
    print(f"  ratio            {ratio:.3f}x (target <= {TARGET}x): {'ok' if ratio <= TARGET else 'MISSED'}")
    return ratio


if __name__ == "__main__":
    sys.exit(main())
