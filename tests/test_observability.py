"""Metrics, span events, callbacks and health, against a real redis-server that is killed and comes back.

One scripted sequence (allowed, warned, denied, exempt, replayed, an outage
and its recovery) on the sync and the async brake, read back from the OTel
SDK's in-memory reader and from a Prometheus CollectorRegistry: exactly the
expected counts, and no attribute ever holds the session id, an argument or
the call's hash.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from distbrake import AsyncDistributedBrake, DistributedBrake, LoopBrake, LoopBrakeError, Verdict
from tests.backends import Checker
from tests.faults import RECOVERY_DEADLINE
from tests.metric_points import OtelMetrics, PrometheusMetrics, checks, key
from tests.servers import RedisServer

SECRET = "sk-live-7Qx9SECRETtoken"
SESSION = "session-of-user-ada@example.com"


def build(flavour: str, url: str, **options: Any) -> Checker:
    kind = DistributedBrake if flavour == "sync" else AsyncDistributedBrake
    return Checker(kind.from_url(url, **options))


async def outcome(brake: Checker, tool: str, args: Any, **kw: Any) -> tuple[str, str]:
    """(outcome, decided_by) of one check as the metrics should count it."""
    try:
        verdict = await brake.check(tool, args, **kw)
    except LoopBrakeError:
        return "denied", "redis" if brake.brake.health().ok else "fallback"
    if verdict.exempt:
        return "exempt", "exempt"
    if verdict.replayed:
        return "replayed", verdict.decided_by
    if verdict.warning is not None:
        return "warned", verdict.decided_by
    return "allowed", verdict.decided_by


def assert_no_secret(metrics: OtelMetrics | PrometheusMetrics, hashes: set[str]) -> None:
    attributes = metrics.raw_attributes()
    assert attributes, "no data point recorded"
    for point in attributes:
        for value in map(str, point.values()):
            assert SECRET not in value and SESSION not in value and "session" not in value
            assert not any(h in value for h in hashes), point


@pytest.mark.parametrize("exporter", ["otel", "prometheus"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_scripted_sequence_yields_exactly_its_counts(
    flavour: str, exporter: str, server: RedisServer, caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = OtelMetrics() if exporter == "otel" else PrometheusMetrics()
    called: list[str] = []
    brake = build(
        flavour, server.url, warn_at=2, exempt_tools=["clock"], timeout_seconds=5.0, retry_after_seconds=0.05,
        on_degraded=lambda error: called.append(f"degraded:{type(error).__name__}"),
        on_recovered=lambda: called.append("recovered"), **metrics.options,
    )
    caplog.set_level(logging.INFO, logger="distbrake")
    seen: Counter[tuple[str, str, str]] = Counter()
    hashes: set[str] = set()

    async def step(tool: str, args: Any, **kw: Any) -> tuple[str, str]:
        result = await outcome(brake, tool, args, session_id=SESSION, **kw)
        seen[(tool, *result)] += 1
        return result

    assert brake.brake.health().state == "ok"
    args = {"query": SECRET}
    assert [await step("search", args) for _ in range(3)] == [
        ("allowed", "redis"), ("warned", "redis"), ("denied", "redis")]
    hashes.add((await brake.inspect(SESSION)).hash_prefix)  # type: ignore[union-attr]
    assert await step("clock", args) == ("exempt", "exempt")
    assert [await step("fetch", {"url": SECRET}, call_id="call-1") for _ in range(2)] == [
        ("allowed", "redis"), ("replayed", "redis")]
    hashes.add((await brake.inspect(SESSION)).hash_prefix)  # type: ignore[union-attr]

    server.kill()
    assert await step("fetch", {"n": 1}) == ("allowed", "fallback")
    health = brake.brake.health()
    assert (health.state, health.last_error, health.policy) == ("degraded", "ConnectionError", "local")
    assert health.since <= time.time()
    for n in range(2, 5):
        assert await step("fetch", {"n": n}) == ("allowed", "fallback")
    server.start()
    end = time.monotonic() + RECOVERY_DEADLINE
    attempt = 0
    while time.monotonic() < end:
        attempt += 1
        if await step("probe", {"attempt": attempt}) == ("allowed", "redis"):
            break
    assert brake.brake.health().state == "ok"
    assert called == ["degraded:ConnectionError", "recovered"]  # once per outage, however many checks failed
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "streaks are no longer shared across workers: Redis unreachable (ConnectionError)" \
        in errors[0].getMessage() and "policy local" in errors[0].getMessage()
    assert sum("streaks are shared again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO) == 1
    await brake.close()

    points = metrics.points()
    expected = {checks(tool, result, by): n for (tool, result, by), n in seen.items()}
    assert {k: v for k, v in points.items() if k[0] == "distbrake.checks"} == expected
    fallback = sum(n for (_, _, by), n in seen.items() if by == "fallback")
    assert points[key("distbrake.fallback.checks", policy="local")] == fallback >= 4
    assert {k for k in points if k[0] == "distbrake.backend.errors"} == {
        key("distbrake.backend.errors", **{"error.type": "ConnectionError"})}
    assert 1 <= points[key("distbrake.backend.errors", **{"error.type": "ConnectionError"})] <= fallback
    timed = Counter[str]()
    for (_, result, by), n in seen.items():
        if result != "exempt":
            timed[by] += n
    assert {k: v for k, v in points.items() if k[0] == "distbrake.check.duration"} == {
        key("distbrake.check.duration", decided_by=by): n for by, n in timed.items()}
    # A restarted server has no script: the first check after the outage loaded it again.
    assert points[key("distbrake.script.loads")] >= 1
    assert_no_secret(metrics, hashes)


def test_the_duration_histogram_resolves_a_50_microsecond_check() -> None:
    metrics = OtelMetrics()
    brake = LoopBrake(**metrics.options)
    brake.check("t", {"a": 1})
    data = metrics.reader.get_metrics_data()
    histogram = next(m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                     if m.name == "distbrake.check.duration")
    bounds = histogram.data.data_points[0].explicit_bounds
    assert bounds[0] <= 0.00001 and any(0.00004 <= b <= 0.0001 for b in bounds) and bounds[-1] >= 1.0
    assert histogram.unit == "s"


def span_events(exporter: InMemorySpanExporter) -> list[tuple[str, str, dict[str, Any]]]:
    return [(span.name, event.name, dict(event.attributes or {}))
            for span in exporter.get_finished_spans() for event in span.events]


@pytest.mark.parametrize("flavour", ["loop", "sync", "async"])
async def test_denials_warnings_and_shadow_denials_are_events_on_the_recording_span(
    flavour: str, redis_url: str,
) -> None:
    exporter = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(exporter))
    silent = TracerProvider(sampler=ALWAYS_OFF)
    metrics = OtelMetrics()

    def make(**options: Any) -> Checker:
        if flavour == "loop":
            return Checker(LoopBrake(**options, **metrics.options))
        return build(flavour, redis_url, **options, **metrics.options)

    brake, shadow = make(warn_at=2), make(enforce=False, key_prefix="shadow")
    args = {"path": SECRET}
    with tracer.get_tracer("host").start_as_current_span("agent-step"):
        await brake.check("read", args, session_id=SESSION, call_id="call-7")
        await brake.check("read", args, session_id=SESSION, call_id="call-8")
        with pytest.raises(LoopBrakeError):
            await brake.check("read", args, session_id=SESSION, call_id="call-9")
        for _ in range(3):
            await shadow.check("read", args, session_id=SESSION)
    # Outside any span, and inside a span that does not record: nothing is added anywhere.
    with pytest.raises(LoopBrakeError):
        await brake.check("read", args, session_id=SESSION)
    with silent.get_tracer("host").start_as_current_span("unsampled") as span:
        assert not span.is_recording()
        with pytest.raises(LoopBrakeError):
            await brake.check("read", args, session_id=SESSION)
    await brake.close()
    await shadow.close()

    events = span_events(exporter)
    assert [(span, name, a["gen_ai.guardrail.result.type"], a.get("gen_ai.tool.call.id"))
            for span, name, a in events] == [
        ("agent-step", "gen_ai.guardrail.result", "warned", "call-8"),
        ("agent-step", "gen_ai.guardrail.result", "denied", "call-9"),
        ("agent-step", "gen_ai.guardrail.result", "would_deny", None),
    ]
    for _, _, attributes in events:
        assert attributes["gen_ai.guardrail.component.name"] == "distbrake"
        assert attributes["gen_ai.guardrail.source"] == "tool_input"
        assert attributes["gen_ai.tool.name"] == "read"
        assert attributes["gen_ai.guardrail.result.reason"].startswith("loop brake: tool \"read\"")
        assert all(SECRET not in str(v) and SESSION not in str(v) for v in attributes.values())
    assert trace.get_current_span().is_recording() is False


@pytest.mark.parametrize("flavour", ["loop", "sync", "async"])
async def test_callbacks_get_the_denial_and_the_warning_and_a_raising_one_changes_nothing(
    flavour: str, redis_url: str, caplog: pytest.LogCaptureFixture,
) -> None:
    got: list[Any] = []

    def boom(_: object) -> None:
        raise RuntimeError(SECRET)

    def make(**options: Any) -> Checker:
        if flavour == "loop":
            return Checker(LoopBrake(**options))
        return build(flavour, redis_url, **options)

    brake = make(warn_at=2, on_deny=got.append, on_warn=got.append)
    raising = make(warn_at=2, on_deny=boom, on_warn=boom, key_prefix="raising")
    for each in (brake, raising):
        await each.check("t", {"a": 1}, session_id="s")
        assert (await each.check("t", {"a": 1}, session_id="s")).warning is not None
        with pytest.raises(LoopBrakeError):
            await each.check("t", {"a": 1}, session_id="s")
    assert [type(g).__name__ for g in got] == ["Verdict", "LoopBrakeError"]
    assert isinstance(got[0], Verdict) and got[0].count == 2 and got[1].count == 3
    failures = [r.getMessage() for r in caplog.records if "callback raised" in r.getMessage()]
    assert failures == ["distbrake: the on_warn callback raised RuntimeError; the check is unaffected",
                        "distbrake: the on_deny callback raised RuntimeError; the check is unaffected"]
    assert SECRET not in caplog.text
    await brake.close()
    await raising.close()


async def test_async_brakes_run_coroutine_callbacks_as_background_tasks(redis_url: str) -> None:
    release = asyncio.Event()
    started: list[str] = []
    finished: list[str] = []

    async def on_deny(error: LoopBrakeError) -> None:
        started.append(error.tool_name)
        await release.wait()  # the check returned long before this ends
        finished.append(error.tool_name)

    async def failing(verdict: Verdict) -> None:
        raise RuntimeError("callback bug")

    brake = AsyncDistributedBrake.from_url(redis_url, warn_at=2, on_deny=on_deny, on_warn=failing)
    await brake.check("t", 1, session_id="s")
    await brake.check("t", 1, session_id="s")
    with pytest.raises(LoopBrakeError):
        await brake.check("t", 1, session_id="s")
    assert finished == []
    await asyncio.sleep(0)
    assert started == ["t"] and finished == []
    release.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert finished == ["t"]
    await brake.aclose()


def test_callback_and_provider_options_are_validated_when_the_brake_is_built() -> None:
    from distbrake import ConfigurationError

    async def coroutine_function(error: object) -> None:
        return None

    with pytest.raises(ConfigurationError, match="on_deny: expected a callable, not int"):
        LoopBrake(on_deny=1)
    with pytest.raises(ConfigurationError, match="on_warn: a coroutine function needs an async brake"):
        DistributedBrake.from_url("memory://", on_warn=coroutine_function)
    with pytest.raises(ConfigurationError, match="invalid meter_provider: expected an OpenTelemetry MeterProvider"):
        LoopBrake(meter_provider=object())
    with pytest.raises(ConfigurationError, match="invalid prometheus_registry: expected a prometheus_client"):
        AsyncDistributedBrake.from_url("memory://", prometheus_registry={})
    with pytest.raises(ConfigurationError, match="fleet_stats"):
        DistributedBrake.from_url("memory://", fleet_stats="yes")


def test_exempt_checks_are_counted_but_not_timed() -> None:
    metrics = OtelMetrics()
    brake = LoopBrake(exempt_tools=["clock"], **metrics.options)
    for _ in range(5):
        brake.check("clock", {})
    points = metrics.points()
    assert points == {checks("clock", "exempt", "exempt"): 5}


def test_failure_policy_closed_is_counted_as_a_fallback_check() -> None:
    from distbrake import BrakeUnavailableError
    from tests.servers import free_port

    metrics = OtelMetrics()
    brake = DistributedBrake.from_url(f"redis://127.0.0.1:{free_port()}", on_backend_error="closed",
                                      timeout_seconds=0.2, **metrics.options)
    with pytest.raises(BrakeUnavailableError):
        brake.check("t", 1)
    points = metrics.points()
    assert points[key("distbrake.fallback.checks", policy="closed")] == 1
    assert points[key("distbrake.backend.errors", **{"error.type": "ConnectionError"})] == 1
    assert not any(k[0] == "distbrake.checks" for k in points)
    assert brake.health().state == "degraded"
    brake.close()


def test_otel_true_uses_the_global_meter_provider_and_the_default_is_off() -> None:
    import subprocess
    import sys

    code = """
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from distbrake import LoopBrake
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
assert LoopBrake().watch is None  # opt-in: a brake nobody observes pays one attribute test per check
LoopBrake().check("quiet", 1)
LoopBrake(otel=True).check("loud", 1)
data = reader.get_metrics_data()
tools = {dict(p.attributes).get("tool") for rm in data.resource_metrics for sm in rm.scope_metrics
         for m in sm.metrics for p in m.data.data_points}
assert tools == {"loud", None}, tools
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr


def test_brakes_sharing_a_meter_provider_or_registry_share_its_instruments() -> None:
    otel, prometheus = OtelMetrics(), PrometheusMetrics()
    first = LoopBrake(meter_provider=otel.provider, prometheus_registry=prometheus.registry)
    second = DistributedBrake.from_url("memory://", meter_provider=otel.provider,
                                       prometheus_registry=prometheus.registry)
    for brake in (first, second, first):
        brake.check("t", {"n": 1}, session_id="a")
    second.close()
    for metrics in (otel, prometheus):
        points = metrics.points()
        assert {k: v for k, v in points.items() if k[0] == "distbrake.checks"} == {
            checks("t", "allowed", "in-process"): 2, checks("t", "allowed", "redis"): 1}
