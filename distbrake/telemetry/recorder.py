"""The instrument-neutral recorder interface: what a check reports, to OpenTelemetry, Prometheus or nothing.

A `Recorder` gets low-cardinality facts only: the tool name (cut to
`TOOL_CHARS`), the outcome, who decided, an error's class name, the policy.
Never a session id, an argument, a result or a hash.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

__all__ = [
    "DURATION_BUCKETS", "MAX_SERIES", "METRICS", "OTHER_TOOL", "OUTCOMES", "TOOL_CHARS",
    "Metric", "Metrics", "Outcome", "Recorder",
]

# "halted": refused with LoopBrakeHalt (the session is halted or blocked, or the kill switch is set)
Outcome = Literal["allowed", "warned", "denied", "halted", "would_deny", "exempt", "replayed"]
OUTCOMES: tuple[Outcome, ...] = ("allowed", "warned", "denied", "halted", "would_deny", "exempt", "replayed")
TOOL_CHARS = 64  # a tool name is cut to this many characters in every attribute
# Tool names are the caller's: each metrics backend keeps at most MAX_SERIES distinct series of the
# checks counter, and counts checks of further tools under OTHER_TOOL (nothing is lost, memory is bounded).
MAX_SERIES = 4096
OTHER_TOOL = "_other"

# Check duration buckets, seconds: 10 µs to 1 s, roughly logarithmic (1-2.5-5 per decade).
DURATION_BUCKETS: tuple[float, ...] = (
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)

class Metric(NamedTuple):
    """An instrument's name (OpenTelemetry's; Prometheus writes it with underscores) and description."""

    name: str
    description: str


class Metrics(NamedTuple):
    """The instruments every recorder keeps."""

    checks: Metric
    duration: Metric
    backend_errors: Metric
    fallback: Metric
    script_loads: Metric


METRICS = Metrics(
    checks=Metric("distbrake.checks", "Checks, by tool, outcome and decided_by."),
    duration=Metric("distbrake.check.duration", "Duration of a check (exempt checks are not timed), by decided_by."),
    backend_errors=Metric("distbrake.backend.errors", "Backend failures seen by checks, by error.type."),
    fallback=Metric("distbrake.fallback.checks", "Checks decided by the failure policy, by policy."),
    script_loads=Metric("distbrake.script.loads", "Script loads after a NOSCRIPT reply."),
)


class Recorder:
    """Records nothing: the base every recorder overrides (and the no-op one)."""

    def check(self, tool: str, outcome: Outcome, decided_by: str, seconds: float | None) -> None:
        """One check: counted by (tool, outcome, decided_by); timed unless `seconds` is None (exempt)."""

    def backend_error(self, error_type: str) -> None:
        """A backend failure a check saw (`error_type`: the exception's class name)."""

    def fallback(self, policy: str) -> None:
        """A check the failure policy decided."""

    def script_load(self) -> None:
        """The script was loaded again after a NOSCRIPT reply."""

    def guardrail(self, result_type: str, reason: str, tool: str, call_id: str | None) -> None:
        """A denied, halted, warned or would-deny check, for the host's current span (OpenTelemetry only)."""
