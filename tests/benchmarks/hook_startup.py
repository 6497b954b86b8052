"""Hook start-up: `distbrake hook claude-code` on a small event / `python -c "import click"`, wall time.

The hook runs before every tool call of a coding agent, so its start-up is part
of every call's latency (issue 25: within 1.5x `python -c "import click"` on the
same machine). Both are measured in this one run, interleaved, each a fresh
process of this interpreter; the figure is the ratio of medians. The hook runs its
default path (no DISTBRAKE_URL: the local streak file, in a temporary cache dir)
with a fresh tool-use id each time, so every run counts a call and writes the file.
Also printed, for information: the same hook with a DISTBRAKE_* setting (the full
path: pydantic settings and the library's FileBrake).

    python -m tests.benchmarks.hook_startup [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
TARGET = 1.5


def event(index: int) -> bytes:
    return json.dumps({
        "session_id": "bench", "transcript_path": "/tmp/t.jsonl", "cwd": "/tmp", "permission_mode": "default",
        "hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": f"ls {index % 2}"},
        "tool_use_id": f"toolu_{index}", "prompt_id": "p1",
    }).encode()


def timed(command: list[str], data: bytes, env: dict[str, str]) -> tuple[float, float]:
    """(wall time, CPU time) of one run: the CPU time (user + system, from wait4) moves less on a busy machine."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdin=subprocess.PIPE, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    assert process.stdin is not None
    process.stdin.write(data)
    process.stdin.close()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise RuntimeError(f"{command} exited {process.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    rounds = parser.parse_args(argv).rounds
    with tempfile.TemporaryDirectory() as cache:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTBRAKE_", "DSH_"))}
        env.update(XDG_CACHE_HOME=cache, PYTHONPATH=str(ROOT))
        full_env = {**env, "DISTBRAKE_MAX_REPEATS": "1000000"}
        click: list[tuple[float, float]] = []
        hook: list[tuple[float, float]] = []
        full: list[tuple[float, float]] = []
        hook_command = [sys.executable, "-m", "distbrake", "hook", "claude-code"]
        for index in range(-3, rounds):  # three rounds of warm-up (disk cache, the streak file's creation)
            c = timed([sys.executable, "-c", "import click"], b"", env)
            h = timed(hook_command, event(index), env)
            f = timed(hook_command, event(index), full_env)
            if index >= 0:
                click.append(c)
                hook.append(h)
                full.append(f)
    cw, hw, fw = (statistics.median(run[0] for run in runs) for runs in (click, hook, full))
    cc, hc = (statistics.median(run[1] for run in runs) for runs in (click, hook))
    ratio = hw / cw
    print(f"python -c 'import click'             wall {cw * 1000:6.1f} ms, CPU {cc * 1000:6.1f} ms "
          f"(medians of {rounds})")
    print(f"distbrake hook claude-code (default)  wall {hw * 1000:6.1f} ms, CPU {hc * 1000:6.1f} ms -> "
          f"{ratio:.2f}x wall (target <= {TARGET}x), {hc / cc:.2f}x CPU")
    print(f"  with a DISTBRAKE_* setting (full)    wall {fw * 1000:6.1f} ms -> {fw / cw:.2f}x (for information)")
    print("PASS" if ratio <= TARGET else "FAIL")
    return 0 if ratio <= TARGET else 5


if __name__ == "__main__":
    sys.exit(main())
