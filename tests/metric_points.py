"""Every data point a brake recorded, from the OTel SDK's in-memory reader or a Prometheus registry, in one shape.

`points()` gives {(instrument, frozenset(attributes)): value}: a counter's
value, a histogram's count. OTel names (`distbrake.checks`) and attribute
names (`error.type`) are used for both, so one scripted test reads either.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from prometheus_client import CollectorRegistry

Points = dict[tuple[str, frozenset[tuple[str, str]]], float]

PROMETHEUS_NAMES = {
    "distbrake_checks": "distbrake.checks",
    "distbrake_check_duration_seconds": "distbrake.check.duration",
    "distbrake_backend_errors": "distbrake.backend.errors",
    "distbrake_fallback_checks": "distbrake.fallback.checks",
    "distbrake_script_loads": "distbrake.script.loads",
}


class OtelMetrics:
    """A MeterProvider with an in-memory reader; `options` for a brake."""

    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.provider = MeterProvider(metric_readers=[self.reader])
        self.options: dict[str, Any] = {"meter_provider": self.provider}

    def points(self) -> Points:
        found: Points = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        value = point.count if isinstance(point, HistogramDataPoint) else point.value
                        attributes = frozenset((k, str(v)) for k, v in (point.attributes or {}).items())
                        found[(metric.name, attributes)] = value
        return found

    def raw_attributes(self) -> list[dict[str, Any]]:
        """The attributes of every data point, as recorded."""
        data = self.reader.get_metrics_data()
        return [
            dict(point.attributes or {})
            for resource in (data.resource_metrics if data else ())
            for scope in resource.scope_metrics
            for metric in scope.metrics
            for point in metric.data.data_points
        ]


class PrometheusMetrics:
    """A fresh CollectorRegistry; `options` for a brake."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.options: dict[str, Any] = {"prometheus_registry": self.registry, "otel": False}

    def points(self) -> Points:
        found: Points = {}
        for family in self.registry.collect():
            name = PROMETHEUS_NAMES[family.name]
            for sample in family.samples:
                if sample.name.endswith(("_created", "_bucket", "_sum")):
                    continue
                labels = {("error.type" if k == "error_type" else k): v for k, v in sample.labels.items()}
                found[(name, frozenset(labels.items()))] = sample.value
        return {key: value for key, value in found.items() if value}

    def raw_attributes(self) -> list[dict[str, Any]]:
        return [dict(sample.labels) for family in self.registry.collect() for sample in family.samples]


def readers() -> dict[str, type[OtelMetrics] | type[PrometheusMetrics]]:
    return {"otel": OtelMetrics, "prometheus": PrometheusMetrics}


def key(name: str, **attributes: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset((k.replace("_", ".") if k == "error_type" else k, v) for k, v in attributes.items())


def checks(tool: str, outcome: str, decided_by: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return key("distbrake.checks", tool=tool, outcome=outcome, decided_by=decided_by)


def meter_provider_shutdown(metrics: Any) -> None:
    provider = getattr(metrics, "provider", None)
    if isinstance(provider, MeterProvider):
        provider.shutdown()
