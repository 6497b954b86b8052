"""The observability options every brake (and `from_url`) takes: objects and callables, never env settings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict

__all__ = ["TELEMETRY_OPTIONS", "TelemetryOptions", "take_telemetry_options"]


class TelemetryOptions(TypedDict, total=False):
    """Observability keyword options (validated when the brake is built).

    * `otel`: True for OpenTelemetry metrics and span events on the global `MeterProvider`
      (`distbrake[otel]`); off by default;
    * `meter_provider`: the OpenTelemetry `MeterProvider` to use (turns OpenTelemetry on);
    * `prometheus_registry`: a prometheus-client `CollectorRegistry` to register the metrics on;
    * `on_deny(error)`, `on_warn(verdict)`, `on_degraded(error)`, `on_recovered()`: callbacks
      (async brakes also take coroutine functions, run as background tasks);
    * `fleet_stats`: write denials and warnings per tool per minute to Redis for
      `distbrake stats` / `top` (default True; Redis brakes only).
    """

    otel: bool | None
    meter_provider: Any
    prometheus_registry: Any
    on_deny: Callable[..., Any] | None
    on_warn: Callable[..., Any] | None
    on_degraded: Callable[..., Any] | None
    on_recovered: Callable[..., Any] | None
    fleet_stats: bool | None


TELEMETRY_OPTIONS = frozenset(TelemetryOptions.__annotations__)


def take_telemetry_options(options: dict[str, Any]) -> TelemetryOptions:
    """Remove the observability options from `options` (the rest are settings) and return them."""
    taken = TelemetryOptions()
    for name in TELEMETRY_OPTIONS & options.keys():
        taken[name] = options.pop(name)  # type: ignore[literal-required]
    return taken
