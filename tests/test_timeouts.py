"""No check and no CLI command waits longer than `timeout_seconds` (+10%) for Redis, whatever the fault.

Faults, all on this machine: a refused port; a listener whose accept queue is
full, so new SYNs are dropped and connect hangs; a server that accepts and
never answers (the fault proxy's black hole); a real redis-server paused with
SIGSTOP. Each is tried on a single node, a Cluster and a Sentinel URL, sync
and asyncio, and through the CLI. The bound is an upper bound, asserted
once per case, on the time measured less the time the waiting thread stood
ready to run while other processes had the cores (tests/waits.py): a loaded
machine adds that delay, the code does not; each test prints what it measured.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from distbrake import AsyncDistributedBrake, BrakeUnavailableError, DistributedBrake
from tests.fault_proxy import FaultProxy
from tests.servers import HOST, RedisServer, free_port
from tests.waits import measured

ROOT = Path(__file__).resolve().parent.parent

TIMEOUT = 1.0
BOUND = TIMEOUT * 1.1
# The CLI is timed inside its own process, from after its start-up (the interpreter, the imports) to
# its exit, less its run-queue delay: what it waited for Redis, whatever the machine's load did.
CLI_TIMEOUT = 2.5
CLI_BOUND = CLI_TIMEOUT * 1.1
CLI_TIMED = """
import sys
import redis, distbrake.cli, distbrake.cli.sessions, distbrake.redis.sync  # the start-up, not timed
from tests.waits import measured
try:
    with measured() as took:
        distbrake.cli.main(sys.argv[1:])
finally:
    print(f"took {took.seconds:.6f} (wall {took.wall:.6f})", file=sys.stderr)
"""
FAULTS = ["refused", "syn-dropped", "silent", "paused"]
SHAPES = ["redis", "redis+cluster", "redis+sentinel"]


@contextlib.contextmanager
def syn_hole() -> Iterator[int]:
    """A port whose accept queue is full: the kernel drops new SYNs, so a connect hangs."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind((HOST, 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):  # fill the queue (backlog 0 still queues one or two)
            filler = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect((HOST, port))
            fillers.append(filler)
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        probe.settimeout(0.2)
        with pytest.raises(OSError):  # the hole really drops: a fresh connect does not complete
            probe.connect((HOST, port))
        probe.close()
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


@contextlib.contextmanager
def faulty_port(fault: str) -> Iterator[int]:
    if fault == "refused":
        yield free_port()
    elif fault == "syn-dropped":
        with syn_hole() as port:
            yield port
    elif fault == "silent":
        with RedisServer(name="silent") as server, FaultProxy(server.address) as proxy:
            proxy.black_hole()
            yield proxy.port
    else:
        with RedisServer(name="paused") as server:
            server.pause()
            try:
                yield server.port
            finally:
                server.resume()


def url_for(shape: str, port: int) -> str:
    if shape == "redis+sentinel":
        return f"redis+sentinel://{HOST}:{port}/mymaster"
    return f"{shape}://{HOST}:{port}"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fault", FAULTS)
async def test_a_check_never_waits_longer_than_the_timeout(fault: str, shape: str) -> None:
    with faulty_port(fault) as port:
        url = url_for(shape, port)
        sync = DistributedBrake.from_url(url, timeout_seconds=TIMEOUT, on_backend_error="closed")
        aio = AsyncDistributedBrake.from_url(url, timeout_seconds=TIMEOUT, on_backend_error="closed")
        try:
            with measured() as sync_took, pytest.raises(BrakeUnavailableError):
                sync.check("t", {}, session_id="s")
            with measured() as async_took, pytest.raises(BrakeUnavailableError):
                await aio.check("t", {}, session_id="s")
        finally:
            sync.close()
            await aio.aclose()
    print(f"\n{fault:12} {shape:15} sync {sync_took.seconds:.3f}s (wall {sync_took.wall:.3f}s)  "
          f"async {async_took.seconds:.3f}s (wall {async_took.wall:.3f}s)  (timeout {TIMEOUT}s)")
    assert sync_took.seconds <= BOUND and async_took.seconds <= BOUND, (sync_took.seconds, async_took.seconds)


def cli_seconds(*args: str) -> tuple[float, int]:
    """How long the command ran in its own process, start-up excluded, and its exit code."""
    env = {**os.environ, "COLUMNS": "120"}
    result = subprocess.run(
        [sys.executable, "-c", CLI_TIMED, *args], capture_output=True, text=True, env=env, timeout=60, check=False,
        cwd=ROOT,
    )
    took = float(result.stderr.rsplit("took ", 1)[1].split()[0])
    return took, result.returncode


@pytest.mark.parametrize("fault", FAULTS)
def test_a_cli_command_never_waits_longer_than_the_timeout(fault: str) -> None:
    quick, code = cli_seconds("--url", "memory://", "inspect", "s")  # the command itself, no Redis
    assert code == 1
    with faulty_port(fault) as port:
        took, code = cli_seconds("--url", f"redis://{HOST}:{port}", "--timeout", str(CLI_TIMEOUT), "inspect", "s")
    print(f"\n{fault:12} distbrake inspect: {took:.3f}s after start-up (memory:// {quick:.3f}s) (exit {code})")
    assert code == 4
    assert took <= CLI_BOUND
