"""OpenTelemetry: the brake's instruments on a meter, and denials as events on the host's current span.

Imported only when a brake is built with OpenTelemetry on (`opentelemetry-api`
installed, the `distbrake[otel]` extra); never by `import distbrake`.

A synchronous `add`/`record` of the SDK costs several microseconds, a tenth
of a check: so a check only tallies (under a lock, a fraction of a
microsecond). `distbrake.checks` is an observable counter that reports the
tallies when a reader collects, and its callback first hands the durations
taken since the last collection to the histogram (the SDK runs callbacks
before it reads the synchronous instruments, so they land in the same
collection). Without a collecting reader, the durations are handed over
every `MAX_PENDING` checks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation

from .recorder import DURATION_BUCKETS, MAX_SERIES, METRICS, OTHER_TOOL, Outcome, Recorder

__all__ = ["OtelRecorder"]

EVENT = "gen_ai.guardrail.result"
MAX_PENDING = 65_536  # durations kept for the next collection, at most (then the check hands them over)


class OtelRecorder(Recorder):
    """Counters and a histogram on `meter_provider` (None: the global one); span events on the current span."""

    def __init__(self, meter_provider: Any = None, version: str = "") -> None:
        provider = metrics.get_meter_provider() if meter_provider is None else meter_provider
        meter = provider.get_meter("distbrake", version)
        self._duration = meter.create_histogram(
            METRICS.duration.name, unit="s", description=METRICS.duration.description,
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        errors, fallback, loads = METRICS.backend_errors, METRICS.fallback, METRICS.script_loads
        self._errors = meter.create_counter(errors.name, unit="{error}", description=errors.description)
        self._fallback = meter.create_counter(fallback.name, unit="{check}", description=fallback.description)
        self._loads = meter.create_counter(loads.name, unit="{load}", description=loads.description)
        self._lock = threading.Lock()
        self._tallies: dict[tuple[str, str, str], int] = {}
        self._pending: list[tuple[str, float]] = []
        self._by: dict[str, dict[str, str]] = {}
        meter.create_observable_counter(
            METRICS.checks.name, callbacks=[self._observe], unit="{check}", description=METRICS.checks.description)

    def check(self, tool: str, outcome: Outcome, decided_by: str, seconds: float | None) -> None:
        key = (tool, outcome, decided_by)
        with self._lock:
            tallies = self._tallies
            try:
                tallies[key] += 1
            except KeyError:
                if len(tallies) >= MAX_SERIES:
                    key = (OTHER_TOOL, outcome, decided_by)
                tallies[key] = tallies.get(key, 0) + 1
            if seconds is None:
                return
            pending = self._pending
            pending.append((decided_by, seconds))
            if len(pending) < MAX_PENDING:
                return
        self._hand_over()

    def _hand_over(self) -> None:
        """Record the durations taken since the last hand-over in the histogram."""
        with self._lock:
            pending, self._pending = self._pending, []
        record, by = self._duration.record, self._by
        for decided_by, seconds in pending:
            attributes = by.get(decided_by)
            if attributes is None:
                attributes = by[decided_by] = {"decided_by": decided_by}
            record(seconds, attributes)

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        self._hand_over()
        with self._lock:
            tallies = list(self._tallies.items())
        return [
            Observation(count, {"tool": tool, "outcome": outcome, "decided_by": decided_by})
            for (tool, outcome, decided_by), count in tallies
        ]

    def backend_error(self, error_type: str) -> None:
        self._errors.add(1, {"error.type": error_type})

    def fallback(self, policy: str) -> None:
        self._fallback.add(1, {"policy": policy})

    def script_load(self) -> None:
        self._loads.add(1)

    def guardrail(self, result_type: str, reason: str, tool: str, call_id: str | None) -> None:
        span = trace.get_current_span()
        if not span.is_recording():
            return
        attributes = {
            "gen_ai.guardrail.component.name": "distbrake",
            "gen_ai.guardrail.source": "tool_input",
            "gen_ai.guardrail.result.type": result_type,
            "gen_ai.guardrail.result.reason": reason,
            "gen_ai.tool.name": tool,
        }
        if call_id is not None:
            attributes["gen_ai.tool.call.id"] = call_id[:128]
        span.add_event(EVENT, attributes)
