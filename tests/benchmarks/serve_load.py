"""`distbrake serve` under load: `POST /v1/check` throughput / the same server stack answering a constant JSON body.

Issue 25's target: >= 0.5x, and the p99 latency. Both servers are uvicorn +
Starlette processes on loopback, started here; the floor answers every POST with
a constant JSON body of the same shape (no brake). The load is C concurrent
keep-alive HTTP/1.1 clients (asyncio streams, one connection each) in this
process for D seconds per round, the two servers alternating over R rounds; the
figure is the ratio of median throughputs. Each client checks its own session
with changing arguments, so every check is counted and allowed (the common case).
Backend: the local streak file (no URL), or `--url redis://...`.

    python -m tests.benchmarks.serve_load [--clients 16] [--seconds 2] [--rounds 5] [--url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
TARGET = 0.5

CONSTANT_SERVER = """
import sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
BODY = {"allowed": True, "count": 1, "max_repeats": 3, "hash_prefix": "0123456789ab", "session": "bench-0",
        "tool": "search", "warning": None, "would_deny": False, "replayed": False, "exempt": False,
        "decided_by": "in-process"}
async def check(request):
    await request.body()
    return JSONResponse(BODY)
async def healthz(request):
    return JSONResponse({"status": "ok"})
app = Starlette(routes=[Route("/v1/check", check, methods=["POST"]), Route("/healthz", healthz)])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", access_log=False, server_header=False)
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def server(command: list[str], port: int, env: dict[str, str]) -> Iterator[None]:
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"{command[2:4]} did not start") from None
                time.sleep(0.05)
        yield
    finally:
        process.terminate()
        process.wait(timeout=30)


async def client(port: int, index: int, stop_at: float, latencies: list[float]) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    done = 0
    try:
        while time.perf_counter() < stop_at:
            body = json.dumps({"tool": "search", "args": {"q": "weather", "n": done}, "session": f"bench-{index}"})
            request = (f"POST /v1/check HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n{body}").encode()
            start = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length"))
            answer = await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
            if not head.startswith(b"HTTP/1.1 200") or b'"allowed":true' not in answer:
                raise RuntimeError(f"unexpected answer: {head[:40]!r} {answer[:80]!r}")
            done += 1
    finally:
        writer.close()
    return done


async def load(port: int, clients: int, seconds: float) -> tuple[float, list[float]]:
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds
    start = time.perf_counter()
    counts = await asyncio.gather(*(client(port, i, stop_at, latencies) for i in range(clients)))
    return sum(counts) / (time.perf_counter() - start), latencies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", default=None, help="the brake's backend (default: the local streak file)")
    options = parser.parse_args(argv)
    ours_port, floor_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTBRAKE_", "DSH_"))}
        env.update(XDG_CACHE_HOME=cache, PYTHONPATH=str(ROOT))
        ours = [sys.executable, "-m", "distbrake", "serve", "--port", str(ours_port)]
        if options.url:
            ours += ["--url", options.url]
        floor = [sys.executable, "-c", CONSTANT_SERVER, str(floor_port)]
        rates: dict[str, list[float]] = {"ours": [], "floor": []}
        tails: dict[str, list[float]] = {"ours": [], "floor": []}
        with server(ours, ours_port, env), server(floor, floor_port, env):
            asyncio.run(load(ours_port, options.clients, 0.5))  # warm-up
            asyncio.run(load(floor_port, options.clients, 0.5))
            for _ in range(options.rounds):
                for name, port in (("ours", ours_port), ("floor", floor_port)):
                    rate, latencies = asyncio.run(load(port, options.clients, options.seconds))
                    rates[name].append(rate)
                    tails[name].append(statistics.quantiles(latencies, n=100)[98])
    ours_rate, floor_rate = statistics.median(rates["ours"]), statistics.median(rates["floor"])
    ratio = ours_rate / floor_rate
    backend = options.url or "the local streak file"
    floor_p99, ours_p99 = statistics.median(tails["floor"]) * 1000, statistics.median(tails["ours"]) * 1000
    print(f"constant JSON (uvicorn + Starlette)  {floor_rate:8.0f} req/s, p99 {floor_p99:6.2f} ms")
    print(f"distbrake serve /v1/check ({backend}) {ours_rate:8.0f} req/s, p99 {ours_p99:6.2f} ms -> {ratio:.2f}x "
          f"(target >= {TARGET}x)")
    print(f"({options.clients} keep-alive clients on loopback, {options.rounds} rounds of {options.seconds} s, "
          "medians)")
    print("PASS" if ratio >= TARGET else "FAIL")
    return 0 if ratio >= TARGET else 5


if __name__ == "__main__":
    sys.exit(main())
