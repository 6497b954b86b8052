"""Without the otel and prometheus extras: `import distbrake` never imports them, and every brake works fully.

Each test runs in a fresh interpreter. The first hides opentelemetry and
prometheus_client behind a `sys.meta_path` finder that refuses them (as a
venv without the extras would), and uses every kind of brake: checks,
warnings, denials, callbacks, health, the fleet view. The second, with the
packages installed, shows that importing distbrake and checking with
OpenTelemetry off never loads them (beyond what redis-py itself loads).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

BLOCKED = """
import importlib.abc, sys
asked = []
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("opentelemetry", "prometheus_client"):
            asked.append(name)
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Refuse())
"""

USE_EVERY_BRAKE = """
import asyncio, distbrake
from distbrake import AsyncDistributedBrake, DistributedBrake, LoopBrake, LoopBrakeError, ConfigurationError
got = []
def use(brake):
    brake.check("t", 1, session_id="s")
    assert brake.check("t", 1, session_id="s").warning
    try:
        brake.check("t", 1, session_id="s")
    except LoopBrakeError:
        pass
    else:
        raise AssertionError("not denied")
    assert brake.health().state == "ok"
use(LoopBrake(warn_at=2, on_deny=got.append, on_warn=got.append))
use(DistributedBrake.from_url("memory://x", warn_at=2, on_deny=got.append, on_warn=got.append))
async def main():
    brake = AsyncDistributedBrake.from_url("memory://y", warn_at=2, on_deny=got.append)
    await brake.check("t", 1, session_id="s")
    await brake.check("t", 1, session_id="s")
    try:
        await brake.check("t", 1, session_id="s")
    except LoopBrakeError:
        pass
    await brake.aclose()
asyncio.run(main())
assert len(got) == 5, got
for wanted in ({"otel": True}, {"meter_provider": object()}, {"prometheus_registry": object()}):
    try:
        LoopBrake(**wanted)
    except ConfigurationError as error:
        assert "pip install 'distbrake[" in str(error), error
    else:
        raise AssertionError(f"{wanted} accepted without the extra")
"""

ABSENT = """
import sys
assert not [m for m in sys.modules if m.split(".")[0] in ("opentelemetry", "prometheus_client")], "imported"
"""


def run(code: str) -> None:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr


def test_every_brake_works_when_the_extras_cannot_be_imported() -> None:
    run(BLOCKED + USE_EVERY_BRAKE + ABSENT + "\nassert asked, 'distbrake never looked for OpenTelemetry'\n")


def test_import_and_a_check_without_otel_never_load_them() -> None:
    # redis-py 8 itself imports opentelemetry when it is installed (redis.observability): what the
    # drivers load first is the baseline; distbrake must add nothing to it.
    run("""
import sys
import fakeredis, redis, redis.asyncio, redis.cluster
def loaded():
    return {m for m in sys.modules if m.split(".")[0] in ("opentelemetry", "prometheus_client")}
before = loaded()
import distbrake
assert loaded() == before, sorted(loaded() - before)
from distbrake import DistributedBrake, LoopBrake
LoopBrake().check("t", 1)  # OpenTelemetry is opt-in
DistributedBrake.from_url("memory://", otel=False).check("t", 1)
assert loaded() == before, sorted(loaded() - before)
assert "distbrake.telemetry.otel" not in sys.modules and "distbrake.telemetry.prometheus" not in sys.modules
""")


def test_the_package_is_importable_and_the_extras_are_declared() -> None:
    from importlib.metadata import requires

    declared = requires("distbrake") or []
    assert any(r.startswith("opentelemetry-api") and "otel" in r.split("extra", 1)[-1] for r in declared)
    assert not any(r.startswith("opentelemetry-sdk") and "test" not in r.split("extra", 1)[-1] for r in declared)
    assert any(r.startswith("prometheus-client") and "prometheus" in r.split("extra", 1)[-1] for r in declared)


SERVER_BLOCKED = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("starlette", "uvicorn"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Refuse())
"""


def test_the_server_extra_is_imported_only_by_serve() -> None:
    """`import distbrake`, the CLI's help and a hook never load Starlette or uvicorn; without them, `serve` says
    which extra to install (exit 4)."""
    run("""
import io, sys, subprocess
import distbrake
from distbrake import LoopBrake
LoopBrake().check("t", 1, session_id="s")
from distbrake.cli import cli
from distbrake.hosts.run import run_hook
run_hook("claude-code", b"{}")
assert not [m for m in sys.modules if m.split(".")[0] in ("starlette", "uvicorn")], "imported"
""")
    result = subprocess.run(
        [sys.executable, "-c", SERVER_BLOCKED + "sys.argv = ['distbrake', 'serve']\nfrom distbrake.__main__ import main"
         "\nmain()"], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 4, result.stderr
    assert "pip install 'distbrake[server]'" in result.stderr


def test_the_server_extra_is_declared_and_in_all() -> None:
    import tomllib
    from pathlib import Path

    extras = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert {r.split(">")[0] for r in extras["server"]} >= {"starlette", "uvicorn", "prometheus-client"}
    assert "server" in extras["all"][0]
