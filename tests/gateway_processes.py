"""Real processes for the gateway tests: the upstream MCP server and `distbrake proxy`, over stdio or HTTP.

A served process says `serving http://...` on stderr once it listens; `served`
reads stderr up to that line (select with a deadline: no sleep), then keeps
draining it in a thread so the process never blocks on a full pipe; the lines
are kept for the test to read.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = [sys.executable, "-m", "tests.gateway_upstream"]
PROXY = [sys.executable, "-m", "distbrake", "proxy"]
START_SECONDS = 60.0
_SERVING = re.compile(r"serving (http://\S+)")


def gateway_env(url: str, **extra: str) -> dict[str, str]:
    """The environment of a gateway process: this worktree importable, the brake on `url`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTBRAKE_")}
    return {**env, "PYTHONPATH": str(ROOT), "DISTBRAKE_URL": url, **extra}


@dataclass
class Served:
    url: str
    process: subprocess.Popen[bytes]
    stderr: list[str] = field(default_factory=list)

    def log(self) -> str:
        return "".join(self.stderr)


def _read_until_serving(process: subprocess.Popen[bytes], lines: list[str], serving: re.Pattern[str]) -> str:
    assert process.stderr is not None
    deadline = time.monotonic() + START_SECONDS
    buffer = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no 'serving' line: " + "".join(lines) + buffer.decode(errors="replace"))
        ready, _, _ = select.select([process.stderr], [], [], left)
        if not ready:
            continue
        chunk = os.read(process.stderr.fileno(), 65536)
        if not chunk:
            raise RuntimeError(f"exited ({process.wait()}) before serving: " + "".join(lines) + buffer.decode())
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            text = line.decode(errors="replace") + "\n"
            lines.append(text)
            found = serving.search(text)
            if found:
                if buffer:
                    lines.append(buffer.decode(errors="replace"))
                return found.group(1)


def _drain(process: subprocess.Popen[bytes], lines: list[str]) -> None:
    assert process.stderr is not None
    for line in iter(process.stderr.readline, b""):
        lines.append(line.decode(errors="replace"))


@contextmanager
def served(argv: Sequence[str], env: dict[str, str], *, serving: re.Pattern[str] = _SERVING,
           cwd: Path = ROOT) -> Iterator[Served]:
    """Run `argv` (which serves HTTP) until the block ends; its URL (`serving`'s group 1 in a line of
    its stderr) and its stderr lines."""
    process = subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines: list[str] = []
    drain: threading.Thread | None = None
    try:
        url = _read_until_serving(process, lines, serving)
        drain = threading.Thread(target=_drain, args=(process, lines), daemon=True)
        drain.start()
        yield Served(url, process, lines)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if drain is not None:
            drain.join(timeout=15)
        if process.stderr is not None:
            process.stderr.close()
