"""docker-compose.yml, proven without a container engine: every service's own commands, run on loopback.

CI has no Docker engine, so the file's commands run here as they are
written, with only what a container gives them replaced: each fixed port
(6379, 7001-7003) by a free one, the service name `redis` by 127.0.0.1,
compose's `$$` by `$`, and each server's /data by a scratch directory. The
server flags, the healthchecks, the `redis-cli --cluster create` script of
`cluster-init` and the `distbrake ... demo` lines of `demo` are the file's,
word for word (the demo's `pip install -q /src` is the one step left out:
the suite runs in an environment where the repo is installed). The servers
get `--bind 127.0.0.1` on top, so nothing listens beyond loopback.

What is proved: the cluster is created and healthy, and a second run of
`cluster-init` (a restarted stack) succeeds without creating it again; a
failure is not swallowed (against nodes that are not there, `cluster-init`
exits non-zero); the nodes announce 127.0.0.1, so a client on the host
follows the cluster's redirects through the published ports (a
`distbrake list` over the cluster URL works); both demo lines pass.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.servers import free_ports

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
SERVICES: dict[str, Any] = COMPOSE["services"]
README = (ROOT / "README.md").read_text(encoding="utf-8")
FIXED_PORTS = (6379, 7001, 7002, 7003)
NODES = ("redis-node-1", "redis-node-2", "redis-node-3")
INSTALL = "pip install -q /src && "
SHARED_NETWORK = "service:redis-node-1"


# -- the file itself ------------------------------------------------------------------


def test_the_file_has_the_services_the_readme_documents() -> None:
    assert set(SERVICES) == {"redis", *NODES, "cluster-init", "demo"}
    assert "docker compose up demo" in README
    for name in ("redis-node-1", "6379", "7001", "network_mode", "127.0.0.1"):
        assert name in README


def test_no_failure_is_swallowed() -> None:
    commands = " ".join(" ".join(service.get("command", [])) for service in SERVICES.values())
    assert "||" not in commands  # `|| true` hid a failed cluster creation
    script = SERVICES["cluster-init"]["command"]
    assert script[:2] == ["sh", "-ec"]  # -e: the first failing command fails the service
    demo = SERVICES["demo"]
    assert demo["command"][:2] == ["sh", "-ec"]
    assert demo["depends_on"]["cluster-init"] == {"condition": "service_completed_successfully"}
    assert demo["depends_on"]["redis"] == {"condition": "service_healthy"}
    for node in NODES:
        assert SERVICES["cluster-init"]["depends_on"][node] == {"condition": "service_healthy"}


def test_cluster_nodes_announce_an_address_the_host_reaches() -> None:
    """Shared namespace + 127.0.0.1 announced + every node's port published with the same number."""
    published = SERVICES["redis-node-1"]["ports"]
    for service in ("redis-node-2", "redis-node-3", "cluster-init", "demo"):
        assert SERVICES[service]["network_mode"] == SHARED_NETWORK
    for node in NODES:
        command = SERVICES[node]["command"]
        assert flag(command, "--cluster-announce-ip") == "127.0.0.1"
        assert flag(command, "--cluster-enabled") == "yes"
        port = flag(command, "--port")
        assert f"127.0.0.1:{port}:{port}" in published  # same number outside as inside
    assert SERVICES["redis"]["ports"] == ["127.0.0.1:6379:6379"]
    assert flag(SERVICES["redis"]["command"], "--appendonly") == "yes"


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


# -- the file's commands, run for real ---------------------------------------------------


class Stack:
    """The compose services as local processes: fixed ports mapped to free ones."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.ports = dict(zip(FIXED_PORTS, free_ports(len(FIXED_PORTS)), strict=True))
        self.processes: list[subprocess.Popen[bytes]] = []

    def local(self, text: str) -> str:
        """A command of the file as it runs here: free ports, loopback for `redis`, `$$` unescaped."""
        text = re.sub(r"\b(6379|7001|7002|7003)\b", lambda m: str(self.ports[int(m.group(1))]), text)
        return text.replace("redis://redis:", "redis://127.0.0.1:").replace("$$", "$")

    def env(self, service: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTBRAKE_", "REDISCLI_"))}
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        env.update({k: str(v) for k, v in (SERVICES[service].get("environment") or {}).items()})
        return env

    def start_server(self, service: str) -> None:
        data = self.workdir / service  # the container's /data, its working directory
        data.mkdir()
        command = [self.local(word) for word in SERVICES[service]["command"]]
        assert command[0] == "redis-server"
        with (data / "server.log").open("wb") as log:  # the child keeps its own descriptor
            self.processes.append(
                subprocess.Popen(
                    [*command, "--bind", "127.0.0.1", "--daemonize", "no"],
                    cwd=data, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                )
            )

    def healthy(self, service: str, timeout: float = 20.0) -> None:
        """Run the service's healthcheck until it passes, as compose would."""
        test = SERVICES[service]["healthcheck"]["test"]
        assert test[0] == "CMD"
        command = [self.local(word) for word in test[1:]]
        deadline = time.monotonic() + timeout
        while True:
            done = subprocess.run(command, capture_output=True, text=True, check=False, env=self.env(service))
            if done.returncode == 0 and "PONG" in done.stdout:
                return
            assert time.monotonic() < deadline, f"{service}: healthcheck never passed: {done.stdout}{done.stderr}"
            time.sleep(0.05)

    def run(self, service: str, *, drop_prefix: str = "", timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
        command = [self.local(word) for word in SERVICES[service]["command"]]
        assert command[:2] == ["sh", "-ec"]
        script = command[2]
        if drop_prefix:
            assert script.startswith(drop_prefix), script
            script = script[len(drop_prefix):]
        return subprocess.run(
            ["sh", "-ec", script], capture_output=True, text=True, timeout=timeout, check=False,
            env=self.env(service), cwd=self.workdir, stdin=subprocess.DEVNULL,
        )

    def close(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    assert shutil.which("redis-server") and shutil.which("redis-cli"), "redis-server and redis-cli must be on PATH"
    made = Stack(tmp_path)
    try:
        yield made
    finally:
        made.close()


def output(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n{done.stdout}{done.stderr}"


def test_every_service_runs_its_own_commands(stack: Stack) -> None:
    for service in ("redis", *NODES):
        stack.start_server(service)
    for service in ("redis", *NODES):
        stack.healthy(service)

    created = stack.run("cluster-init")
    assert created.returncode == 0, output(created)
    assert "[OK] All 16384 slots covered" in created.stdout
    assert "cluster_state:ok on every node" in created.stdout

    again = stack.run("cluster-init")  # `docker compose up` on a stack that already made its cluster
    assert again.returncode == 0, output(again)
    assert "already exists" in again.stdout

    nodes = subprocess.run(
        ["redis-cli", "-p", str(stack.ports[7001]), "cluster", "nodes"],
        capture_output=True, text=True, check=True,
    ).stdout
    announced = {line.split()[1].split("@")[0] for line in nodes.splitlines() if line.strip()}
    assert announced == {f"127.0.0.1:{stack.ports[p]}" for p in (7001, 7002, 7003)}

    host_client = subprocess.run(
        ["distbrake", "--url", f"redis+cluster://127.0.0.1:{stack.ports[7001]}", "list"],
        capture_output=True, text=True, check=False, env=stack.env("demo"), timeout=60,
    )
    assert host_client.returncode == 0, output(host_client)

    demo = stack.run("demo", drop_prefix=INSTALL)
    assert demo.returncode == 0, output(demo)
    assert demo.stdout.count("shared streak:") == 2, demo.stdout
    assert "worker processes on redis://127.0.0.1:" in demo.stdout
    assert "worker processes on redis+cluster://127.0.0.1:" in demo.stdout


def test_cluster_init_fails_when_the_cluster_cannot_be_made(stack: Stack) -> None:
    """Nothing listens on the (free) node ports: the script must fail, not pass as `|| true` let it."""
    failed = stack.run("cluster-init", timeout=60)
    assert failed.returncode != 0, output(failed)
