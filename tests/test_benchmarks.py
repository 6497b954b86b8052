"""The team's benchmark suite, `python -m tests.benchmarks`, run for real in a subprocess.

Its figures are ratios to their floors, judged against the team's targets
(exit 5 on a miss): these tests check that each figure is measured, named,
judged and cleaned up as the suite says, not the figures themselves (a
loaded machine may miss a target, and then the exit code must say so).
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from distbrake import DistributedBrake
from tests.test_cli import ROOT, _env, as_json, one_line_error

# What the tests read back after a run: a busy machine (the full suite on 4 workers) must not turn a slow first
# connect or Cluster client build (0.5 s by default) into a failure of what they assert.
READ_TIMEOUT = 5.0


def suite(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m tests.benchmarks ARGS` from the repository's root, as `tests.test_cli.run` starts the CLI."""
    return subprocess.run(
        [sys.executable, "-m", "tests.benchmarks", *args], capture_output=True, text=True, cwd=ROOT,
        env=_env(), timeout=120, check=False,
    )


def test_bench_memory_figure_on_real_redis_and_skipped_on_memory(redis_url: str) -> None:
    # 2,000 sessions (~430 KB): an idle client of the shared server gives back 16-32 KB of buffers at any moment
    result = suite("--url", redis_url, "--quick", "--sessions", "2000", "--json",
                 "--only", "memory_per_session", "--only", "sync_check_latency")
    report = as_json(result)
    # A loaded machine may miss a target: then the exit code says so (5), never 0.
    assert result.returncode == (0 if report["passed"] else 5), result.stderr
    figures = {f["key"]: f for f in report["figures"]}
    assert set(figures) == {"memory_per_session", "sync_check_latency"}
    memory = figures["memory_per_session"]
    assert memory["unit"] == "bytes" and 50 < memory["ours"] < 2000 and memory["samples"] == 2000
    assert memory["ratio"] is None and memory["target"] == "<= 240 B"
    latency = figures["sync_check_latency"]
    assert latency["ours"] > 0 and latency["floor"] > 0
    assert latency["ratio"] == pytest.approx(latency["ours"] / latency["floor"])
    assert set(latency) == {"key", "name", "unit", "ours", "floor", "ratio", "target", "passed",
                            "note", "samples"}
    with DistributedBrake.from_url(redis_url, timeout_seconds=READ_TIMEOUT) as brake:
        assert brake.client.dbsize() == 0  # everything the benchmark wrote is gone

    skipped = suite("--quick", "--only", "memory_per_session")
    assert skipped.returncode == 0, skipped.stderr
    assert "skip" in skipped.stdout and "memory:// has no used_memory" in skipped.stdout


def test_bench_prices_the_rules_against_the_same_check_with_rules_off(redis_url: str) -> None:
    result = suite("--url", redis_url, "--quick", "--json",
                 "--only", "rules_warn_shadow", "--only", "rules_cycles", "--only", "rules_progress",
                 "--only", "rules_ladder")
    report = as_json(result)
    assert result.returncode == (0 if report["passed"] else 5), result.stderr
    figures = {f["key"]: f for f in report["figures"]}
    assert [figures[key]["target"] for key in ("rules_warn_shadow", "rules_cycles", "rules_progress",
                                               "rules_ladder")] == ["<= 1.1x", "<= 1.2x", "<= 2.2x", "<= 1.1x"]
    for figure in figures.values():
        assert figure["ours"] > 0 and figure["floor"] > 0 and figure["samples"] == 600
        assert figure["passed"] == (figure["ratio"] <= float(figure["target"][3:-1]))
    # the ladder's figure: a once-only tool's new calls in sessions of 8, and in its note, from the same run, the
    # same in one session (the list at its bound) and another tool's checks
    assert re.fullmatch(r"sessions of 8 once-only calls; in the same run, one session \(its once-only calls at their "
                        r"bound, 64\): \d+\.\d\dx; a check of a tool that is not once-only: \d+\.\d\dx",
                        figures["rules_ladder"]["note"])
    with DistributedBrake.from_url(redis_url, timeout_seconds=READ_TIMEOUT) as brake:
        assert brake.client.dbsize() == 0  # everything the benchmark wrote is gone


def test_bench_prices_the_physical_floors_and_the_cluster(redis_url: str, cluster_url: str) -> None:
    """The raw-socket, pipelined and realistic-path floors on a single node, the Cluster figures against it."""
    floors = ("sync_check_raw", "sync_check_wire", "async_pipelined", "async_one_task", "async_load", "server_cost",
              "server_record")
    clustered = ("cluster_async", "cluster_sync", "cluster_memory")
    only = [arg for key in (*floors, *clustered) for arg in ("--only", key)]
    # 2,000 sessions for cluster_memory: over 300, the idle query buffers other clients of the shared Cluster give
    # back move used_memory by about as much as the records (see test_bench_on_a_cluster_sums_its_masters)
    result = suite("--url", redis_url, "--quick", "--json", "--pin-cpu", "--sessions", "2000",
                 "--cluster-url", cluster_url, *only)
    report = as_json(result)
    assert result.returncode == (0 if report["passed"] else 5), result.stderr
    figures = {f["key"]: f for f in report["figures"]}
    assert set(figures) == {*floors, *clustered}
    targets = {"sync_check_raw": "<= 1.6x", "sync_check_wire": "<= 1.3x", "async_pipelined": ">= 1x",
               "async_one_task": ">= 1x", "async_load": ">= 0.9x", "server_cost": ">= 0.3x", "server_record": ">= 0.8x",
               "cluster_async": ">= 0.9x", "cluster_sync": ">= 0.9x", "cluster_memory": "<= 265 B"}
    assert {key: f["target"] for key, f in figures.items()} == targets
    for key, figure in figures.items():
        if key == "cluster_memory":
            assert 50 < figure["ours"] < 2000 and figure["passed"] == (figure["ours"] <= 265)
            continue
        assert figure["ours"] > 0 and figure["floor"] > 0, key
        assert figure["ratio"] == pytest.approx(figure["ours"] / figure["floor"])
        bound, ratio = float(figure["target"][3:-1]), figure["ratio"]
        assert figure["passed"] == (ratio <= bound if figure["target"][0] == "<" else ratio >= bound)
    assert all("pinned to CPU" in figures[key]["note"] for key in ("sync_check_raw", "sync_check_wire"))
    assert "fresh call id" in figures["server_cost"]["note"]
    # beside the wire figure, in the same run: the least a Python client does (hash and pack, raw socket)
    assert re.search(r"sent by the raw socket, .*: [\d.]+ / [\d.]+ µs, \d+\.\d\dx$", figures["sync_check_wire"]["note"])
    # the two server figures read the same rounds: ours against return 1 per second of server CPU (all in), and
    # against the bare record script per second of script time (INFO commandstats), its all-in ratio in its note
    server, record = figures["server_cost"], figures["server_record"]
    assert re.search(r"the bare record script: \d+\.\d\dx", server["note"])
    assert re.search(r"^per second of script time \(INFO commandstats\).*script time per check: ours [\d.]+ µs, bare "
                     r"[\d.]+ µs, bare writing h alone [\d.]+ µs, return 1 [\d.]+ µs; per second of server CPU, all in "
                     r"\(INFO used_cpu_\*\): \d+\.\d\dx \(ours ([\d.]+) µs, bare [\d.]+ µs\)$", record["note"])
    all_in = re.search(r"all in \(INFO used_cpu_\*\): [\d.]+x \(ours ([\d.]+) µs", record["note"])
    assert all_in is not None and float(all_in[1]) == pytest.approx(1e6 / server["ours"], abs=0.006)
    with DistributedBrake.from_url(redis_url, timeout_seconds=READ_TIMEOUT) as brake:
        assert brake.client.dbsize() == 0  # everything the benchmark wrote is gone
    with DistributedBrake.from_url(cluster_url, timeout_seconds=READ_TIMEOUT) as brake:
        assert list(brake.sessions()) == []

    skipped = as_json(suite("--url", redis_url, "--quick", "--json", "--only", "cluster_async"))
    assert skipped["figures"][0]["passed"] is None and "--cluster-url" in skipped["figures"][0]["note"]
    wrong = suite("--url", redis_url, "--quick", "--cluster-url", redis_url, "--only", "cluster_async")
    assert wrong.returncode == 2 and "redis+cluster://" in wrong.stderr


def test_the_wire_figure_loads_the_script_its_raw_socket_sends(redis_url: str) -> None:
    """sync_check_wire's floor is the brake's own EVALSHAs sent by a raw socket, which does not load a script on
    NOSCRIPT: on a server whose script cache is empty (a restart, SCRIPT FLUSH) the figure still measures."""
    with DistributedBrake.from_url(redis_url, timeout_seconds=READ_TIMEOUT) as brake:
        brake.client.script_flush()
    figure = as_json(suite("--url", redis_url, "--quick", "--json", "--pin-cpu", "--only", "sync_check_wire"))
    measured = figure["figures"][0]
    assert measured["ours"] > 0 and measured["floor"] > 0, measured["note"]


def test_bench_prices_start_up_against_the_dependencies_own() -> None:
    result = suite("--quick", "--json", "--only", "import_time", "--only", "cli_startup")
    report = as_json(result)
    assert result.returncode == (0 if report["passed"] else 5), result.stderr
    figures = {f["key"]: f for f in report["figures"]}
    assert (figures["import_time"]["target"], figures["cli_startup"]["target"]) == ("<= 1.1x", "<= 2x")
    for figure in figures.values():
        assert figure["unit"] == "ms" and figure["ours"] > 0 and figure["floor"] > 0 and figure["samples"] == 5
        assert figure["passed"] == (figure["ratio"] <= float(figure["target"][3:-1]))


def test_bench_exits_5_when_a_figure_misses_its_target() -> None:
    impossible = ("--quick", "--only", "inprocess_check",
                  "--target", "inprocess_check=0.000001")
    failed = suite(*impossible)
    assert failed.returncode == 5, failed.stdout + failed.stderr
    assert "FAIL" in failed.stdout and "missed: inprocess_check (exit 5)" in failed.stdout
    as_data = suite(*impossible, "--json")
    assert as_data.returncode == 5
    report = as_json(as_data)
    assert report["passed"] is False
    assert report["figures"][0]["target"] == "<= 1e-06x" and report["figures"][0]["passed"] is False

    generous = suite("--quick", "--only", "inprocess_check", "--target",
                   "inprocess_check=1000000", "--json")
    assert generous.returncode == 0, generous.stderr
    assert as_json(generous)["passed"] is True

    skipped = suite("--quick", "--only", "memory_per_session", "--target",
                  "memory_per_session=1")  # skipped on memory://: no target to miss
    assert skipped.returncode == 0 and "skip" in skipped.stdout

    for bad in ("nosuch=1", "inprocess_check", "inprocess_check=fast", "inprocess_check=-1"):
        wrong = suite("--target", bad)
        assert wrong.returncode == 2, bad
        assert "--target" in one_line_error(wrong)
