"""What every framework adapter's tests check the same way: options refused at build time, the install hint
when its extra is missing, and `import distbrake` never importing the framework."""

from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Callable, Iterable

import pytest

from distbrake import ConfigurationError, LoopBrake


def refuses_bad_options(build: Callable[..., object], *, session_id: bool = True) -> None:
    """`build(brake, **options)` refuses an unknown on_deny or scope, a non-callable session_id and a brake
    without check."""
    with pytest.raises(ConfigurationError, match="on_deny"):
        build(LoopBrake(), on_deny="retry")
    with pytest.raises(ConfigurationError, match="scope"):
        build(LoopBrake(), scope="thread")
    if session_id:
        with pytest.raises(TypeError, match="session_id"):
            build(LoopBrake(), session_id="fixed")
    with pytest.raises(TypeError, match="check"):
        build(object())


def names_its_extra_when_missing(
    monkeypatch: pytest.MonkeyPatch, adapter: str, blocked: Iterable[str], extra: str
) -> None:
    """Importing `distbrake.integrations.<adapter>` with `blocked` modules absent says
    `pip install "distbrake[extra]"`."""
    for name in blocked:
        monkeypatch.setitem(sys.modules, name, None)  # as if the framework were not installed
    monkeypatch.delitem(sys.modules, f"distbrake.integrations.{adapter}")
    with pytest.raises(ImportError, match=rf'pip install "distbrake\[{extra}\]"'):
        importlib.import_module(f"distbrake.integrations.{adapter}")


def import_leaves_the_framework_alone(prefix: str) -> None:
    """A fresh `import distbrake, distbrake.integrations` loads no module of the framework named `prefix`."""
    code = "import sys, distbrake, distbrake.integrations\n"
    code += f"print([m for m in sys.modules if m.startswith({prefix!r})])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "[]"
