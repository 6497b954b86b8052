"""The built wheel carries the Lua script, py.typed and the console script."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_wheel_installs_and_finds_its_script(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(dist), str(ROOT)],
        check=True, capture_output=True, timeout=120,
    )
    (wheel,) = dist.glob("distbrake-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "distbrake/lua/brake.lua" in names
    assert "distbrake/py.typed" in names
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert not [n for n in names if n.startswith("tests/")]  # the team's benchmark suite stays in the clone
    assert [n for n in names if n.startswith("distbrake/cli/bench")] == ["distbrake/cli/bench.py"]
    assert zipfile.ZipFile(wheel).read("distbrake/lua/brake.lua") == (ROOT / "lua" / "brake.lua").read_bytes()

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True, capture_output=True, timeout=120,
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = (
        "import distbrake, distbrake.redis.wire as s; from importlib import resources;"
        "print(distbrake.__file__);"
        "print(resources.files('distbrake').joinpath('lua', 'brake.lua').is_file());"
        "b = distbrake.DistributedBrake.from_url('memory://wheel');"
        "print(b.check('t', 1).count, b.check('t', 1).count)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, check=True,
        capture_output=True, text=True, timeout=60,
    ).stdout.split("\n")
    assert out[0].startswith(str(site))
    assert out[1:3] == ["True", "1 2"]
    version = subprocess.run(
        [sys.executable, "-m", "distbrake", "--version"], cwd=tmp_path, env=env, check=True,
        capture_output=True, text=True, timeout=60,
    ).stdout
    assert "distbrake" in version and "0.1.0" in version


def test_import_loads_no_embedded_backend_until_memory_is_used() -> None:
    import subprocess
    import sys

    code = (
        "import sys, distbrake\n"
        "before = 'fakeredis' in sys.modules\n"
        "distbrake.DistributedBrake.from_url('memory://lazy').check('t', 1)\n"
        "print(before, 'fakeredis' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.split() == ["False", "True"]
