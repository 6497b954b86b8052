"""Prometheus: the brake's instruments as prometheus-client metrics on the caller's `CollectorRegistry`.

Imported only when a brake is given `prometheus_registry=` (the
`distbrake[prometheus]` extra); never by `import distbrake`. The metrics are
registered on that registry alone (never the global one); two brakes given
the same registry share its metrics.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from .recorder import DURATION_BUCKETS, MAX_SERIES, METRICS, OTHER_TOOL, Metric, Outcome, Recorder

__all__ = ["PrometheusRecorder"]

_lock = threading.Lock()
# The metrics registered on each registry (a registry refuses a name twice).
_registered: weakref.WeakKeyDictionary[CollectorRegistry, tuple[Any, ...]] = weakref.WeakKeyDictionary()


def _named(metric: Metric) -> tuple[str, str]:
    """A metric's Prometheus name and help text."""
    return metric.name.replace(".", "_"), metric.description


def _metrics(registry: CollectorRegistry) -> tuple[Any, ...]:
    with _lock:
        found = _registered.get(registry)
        if found is None:
            found = (
                Counter(*_named(METRICS.checks), ("tool", "outcome", "decided_by"), registry=registry),
                Histogram(_named(METRICS.duration)[0] + "_seconds", METRICS.duration.description, ("decided_by",),
                          buckets=(*DURATION_BUCKETS, float("inf")), registry=registry),
                Counter(*_named(METRICS.backend_errors), ("error_type",), registry=registry),
                Counter(*_named(METRICS.fallback), ("policy",), registry=registry),
                Counter(*_named(METRICS.script_loads), registry=registry),
                set(),  # the (tool, outcome, decided_by) series made on this registry, at most MAX_SERIES
            )
            _registered[registry] = found
        return found


class PrometheusRecorder(Recorder):
    """`distbrake_checks_total`, `distbrake_check_duration_seconds`, ... on `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._checks, self._duration, self._errors, self._fallback, self._loads, self._series = _metrics(registry)
        self._children: dict[tuple[str, str, str], Any] = {}
        self._timers: dict[str, Any] = {}

    def _child(self, key: tuple[str, str, str]) -> Any:
        """The counter of a series, or of its OTHER_TOOL series once the registry holds MAX_SERIES."""
        with _lock:
            series = self._series
            if key not in series:
                if len(series) >= MAX_SERIES:
                    key = (OTHER_TOOL, *key[1:])
                series.add(key)
        if len(self._children) >= MAX_SERIES:
            self._children.clear()  # a cache of counters only: the registry keeps the series
        return self._checks.labels(*key)

    def check(self, tool: str, outcome: Outcome, decided_by: str, seconds: float | None) -> None:
        key = (tool, outcome, decided_by)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self._child(key)
        child.inc()
        if seconds is not None:
            timer = self._timers.get(decided_by)
            if timer is None:
                timer = self._timers[decided_by] = self._duration.labels(decided_by)
            timer.observe(seconds)

    def backend_error(self, error_type: str) -> None:
        self._errors.labels(error_type).inc()

    def fallback(self, policy: str) -> None:
        self._fallback.labels(policy).inc()

    def script_load(self) -> None:
        self._loads.inc()
