"""A `distbrake serve` process on a free port, for the tests (tests/test_serve.py, tests/test_agents_real.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.servers.process import free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent


class Server:
    def __init__(self, url: str, process: subprocess.Popen[bytes]) -> None:
        self.url, self.process = url, process

    def post(self, path: str, body: object, **options: object) -> httpx.Response:
        content = body if isinstance(body, (bytes, Iterator)) else json.dumps(body).encode()
        return httpx.post(self.url + path, content=content, timeout=10, **options)  # type: ignore[arg-type]


@contextlib.contextmanager
def start(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Server]:
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("DISTBRAKE_", "DSH_"))}
    environ.update(XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=str(ROOT), **(env or {}))
    log = tmp_path / f"serve-{port}.log"
    with log.open("wb") as output:
        process = subprocess.Popen([sys.executable, "-m", "distbrake", "serve", "--port", str(port), *args],
                                   env=environ, stdout=output, stderr=output, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: process.poll() is not None or httpx.get(url + "/healthz", timeout=2).status_code,
                   timeout=30, message="distbrake serve did not start")
        assert process.poll() is None, log.read_text()
        yield Server(url, process)
    finally:
        process.terminate()
        process.wait(timeout=30)
