"""Names a caller controls (tool names) never grow memory or series without bound (issue 23.6).

Every place that keeps a tool name keeps at most a bounded number of them and
counts the rest under `_other`: the OpenTelemetry and Prometheus series (4,096
each), the fleet view's fields per minute (256 per brake), and `call_hash`'s
cache of tool-name heads (names up to 256 characters only).
"""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from distbrake import DistributedBrake, LoopBrake, LoopBrakeError, call_hash
from distbrake.telemetry.recorder import MAX_SERIES, OTHER_TOOL

TOOLS = MAX_SERIES + 500


def _deny_each(brake: LoopBrake | DistributedBrake, tools: int) -> None:
    for index in range(tools):
        with pytest.raises(LoopBrakeError):
            brake.check(f"tool-{index}", 1, session_id="s")


def test_prometheus_keeps_at_most_max_series_tools() -> None:
    registry = CollectorRegistry()
    _deny_each(LoopBrake(max_repeats=1, prometheus_registry=registry), TOOLS)
    samples = [s for metric in registry.collect() if metric.name == "distbrake_checks"
               for s in metric.samples if s.name == "distbrake_checks_total"]
    tools = {s.labels["tool"] for s in samples}
    assert len(samples) <= MAX_SERIES + 1 and OTHER_TOOL in tools
    assert sum(s.value for s in samples) == TOOLS  # nothing lost: the rest is counted under _other


def test_opentelemetry_keeps_at_most_max_series_tools() -> None:
    reader = InMemoryMetricReader()
    _deny_each(LoopBrake(max_repeats=1, meter_provider=MeterProvider(metric_readers=[reader])), TOOLS)
    data = reader.get_metrics_data()
    points = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              if m.name == "distbrake.checks" for p in m.data.data_points]
    assert len(points) <= MAX_SERIES + 1 and OTHER_TOOL in {p.attributes["tool"] for p in points}
    assert sum(p.value for p in points) == TOOLS


def test_the_fleet_view_keeps_a_bounded_number_of_tools_per_minute(redis_url: str) -> None:
    from distbrake.telemetry.fleet import FLEET_TOOLS, parse_minute

    brake = DistributedBrake.from_url(redis_url, max_repeats=1, otel=False, key_prefix="bounded")
    _deny_each(brake, 2_000)
    brake.close()
    client = brake.connect(brake.settings.parsed_url, 5.0)
    keys = [key for key in client.scan_iter(match="bounded:fleet:*") if parse_minute(key, "bounded")]
    fields = [field for key in keys for field in client.hkeys(key)]
    assert 0 < len(fields) <= FLEET_TOOLS * len(keys) + len(keys)
    counted = sum(int(client.hget(key, field)) for key in keys for field in client.hkeys(key))
    assert counted == 2_000  # nothing lost: the rest is counted under _other
    assert f"d:{OTHER_TOOL}".encode() in fields


def test_call_hash_keeps_no_long_tool_name_alive() -> None:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for index in range(40):
            call_hash(str(index) + "x" * 1_000_000, {"q": 1})  # forty different 1 MB tool names
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 4_000_000, kept  # was ~40 MB: every name stayed in the cache
