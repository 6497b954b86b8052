"""Choosing a brake's observers once, when it is built: recorders, callbacks, health, the fleet view."""

from __future__ import annotations

import importlib.util
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import ConfigurationError
from .callbacks import check_callback
from .health import HealthWatch
from .options import TelemetryOptions
from .recorder import Recorder
from .watch import Fanout, Watch

__all__ = ["Telemetry", "build_telemetry"]

_lock = threading.Lock()
_otel_recorders: weakref.WeakKeyDictionary[Any, Recorder] = weakref.WeakKeyDictionary()


class Telemetry:
    """What `build_telemetry` chose: the check's `Watch` (None: nothing to report), the recorder, health."""

    def __init__(self, watch: Watch | None, recorder: Recorder, health: HealthWatch) -> None:
        self.watch = watch
        self.recorder = recorder
        self.health = health


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing (or refused)
        return False


def _otel(options: TelemetryOptions) -> Recorder | None:
    wanted = options.get("otel")
    provider = options.get("meter_provider")
    if wanted is not None and not isinstance(wanted, bool):
        raise ConfigurationError(f"invalid otel: expected True or False, not {type(wanted).__name__}")
    if wanted is False:
        if provider is not None:
            raise ConfigurationError("invalid meter_provider: given with otel=False")
        return None
    if wanted is None and provider is None:
        return None  # opt-in: an uninstrumented check pays nothing
    if not _installed("opentelemetry.metrics"):
        raise ConfigurationError(
            "OpenTelemetry is not installed: pip install 'distbrake[otel]' (or leave otel and meter_provider unset)")
    if provider is not None and not callable(getattr(provider, "get_meter", None)):
        raise ConfigurationError(
            f"invalid meter_provider: expected an OpenTelemetry MeterProvider, not {type(provider).__name__}")
    from importlib.metadata import version

    from .otel import OtelRecorder

    if provider is None:
        from opentelemetry import metrics

        provider = metrics.get_meter_provider()
    with _lock:
        try:
            recorder = _otel_recorders.get(provider)
        except TypeError:  # a provider that takes no weak reference: instruments of its own per brake
            return OtelRecorder(provider, version("distbrake"))
        if recorder is None:  # one set of instruments per provider, shared by its brakes
            recorder = _otel_recorders[provider] = OtelRecorder(provider, version("distbrake"))
    return recorder


def _prometheus(options: TelemetryOptions) -> Recorder | None:
    registry = options.get("prometheus_registry")
    if registry is None:
        return None
    if not _installed("prometheus_client"):
        raise ConfigurationError("prometheus-client is not installed: pip install 'distbrake[prometheus]'")
    from prometheus_client import CollectorRegistry

    if not isinstance(registry, CollectorRegistry):
        raise ConfigurationError(
            "invalid prometheus_registry: expected a prometheus_client CollectorRegistry, "
            f"not {type(registry).__name__}")
    from .prometheus import PrometheusRecorder

    return PrometheusRecorder(registry)


def build_telemetry(
    options: TelemetryOptions, *, decided_by: str, policy: str, backend: str, asynchronous: bool,
    client: Callable[[], Any] | None = None, key_prefix: str = "distbrake",
) -> Telemetry:
    """The observers of a brake whose own backend decides as `decided_by` (`client`: its Redis, for the fleet view)."""
    unknown = set(options) - set(TelemetryOptions.__annotations__)
    if unknown:  # pragma: no cover - take_telemetry_options only takes known names
        raise TypeError(f"unknown option(s): {', '.join(sorted(unknown))}")
    callbacks = {
        name: check_callback(name, options.get(name), asynchronous=asynchronous)
        for name in ("on_deny", "on_warn", "on_degraded", "on_recovered")
    }
    recorders = [r for r in (_otel(options), _prometheus(options)) if r is not None]
    recorder = recorders[0] if len(recorders) == 1 else Fanout(recorders) if recorders else Recorder()
    fleet_stats = options.get("fleet_stats")
    if fleet_stats is not None and not isinstance(fleet_stats, bool):
        raise ConfigurationError(f"invalid fleet_stats: expected True or False, not {type(fleet_stats).__name__}")
    fleet: Any = None
    if client is not None and fleet_stats is not False:
        from .fleet import AsyncFleetWriter, FleetWriter

        fleet = (AsyncFleetWriter if asynchronous else FleetWriter)(client, key_prefix)
    watch = None
    if recorders or fleet is not None or callbacks["on_deny"] or callbacks["on_warn"]:
        watch = Watch(recorder=recorder, decided_by=decided_by, policy=policy, on_deny=callbacks["on_deny"],
                      on_warn=callbacks["on_warn"], fleet=fleet)
    health = HealthWatch(policy, backend, callbacks["on_degraded"], callbacks["on_recovered"])
    return Telemetry(watch, recorder, health)
