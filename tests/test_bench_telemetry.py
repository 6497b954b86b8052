"""The team's benchmark suite (`python -m tests.benchmarks`) measures instrumentation side by side.

OpenTelemetry on (SDK + reader) against off.
"""

from __future__ import annotations

import subprocess
import sys

from tests.test_benchmarks import suite
from tests.test_cli import ROOT, as_json
from tests.test_no_extras import BLOCKED

FIGURES = ("otel_sync_check", "otel_async_check")


def test_both_figures_are_measured_in_one_run_and_a_missed_target_fails(redis_url: str) -> None:
    only = [arg for key in FIGURES for arg in ("--only", key)]
    result = suite("--url", redis_url, "--quick", *only, "--json")
    report = as_json(result)
    figures = {f["key"]: f for f in report["figures"]}
    assert set(figures) == set(FIGURES)
    for figure in figures.values():
        assert figure["unit"] == "µs" and figure["target"] == "<= 1.1x"
        assert figure["ours"] > 0 and figure["floor"] > 0
        assert abs(figure["ratio"] - figure["ours"] / figure["floor"]) < 1e-9
        assert figure["passed"] is (figure["ratio"] <= 1.1)
    assert result.returncode == (0 if report["passed"] else 5)

    missed = suite("--url", redis_url, "--quick", "--only", "otel_sync_check",
                 "--target", "otel_sync_check=0.000001")
    assert missed.returncode == 5
    assert "FAIL" in missed.stdout and "missed: otel_sync_check (exit 5)" in missed.stdout


def test_without_the_sdk_the_figures_are_skipped_not_failed(redis_url: str) -> None:
    code = BLOCKED + f"""
from distbrake import BrakeSettings
from tests.benchmarks.telemetry import otel_async_check, otel_sync_check
settings = BrakeSettings(url={redis_url!r})
for figure in (otel_sync_check(settings, rounds=1, block=5, warmup=1),
               otel_async_check(settings, per_task=2, rounds=1)):
    assert figure.passed is None and figure.note.startswith("skipped: pip install opentelemetry-sdk"), figure
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                            cwd=ROOT)  # where `tests.benchmarks` is importable
    assert result.returncode == 0, result.stderr
