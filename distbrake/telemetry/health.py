"""The backend's health as a brake sees it: `brake.health()`, the degraded/recovered log lines and callbacks.

`FailureHandler` (policy.py) reports each change once per outage: `degraded`
with the error that began it, `recovered` when Redis answers again. A wrong
password or a refused ACL is a configuration error, not an outage, and is
named so in the log line and in `last_error` (the meaning of an error is `redis_errors.py`'s to say).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Literal

from ..redis_errors import classify
from .callbacks import Callback, run_callback

__all__ = ["BrakeHealth", "HealthWatch", "Healthy", "configuration_problem", "error_name"]

logger = logging.getLogger("distbrake")

HealthState = Literal["ok", "degraded"]

# What the brake does while Redis is down, by policy (for the ERROR line).
_MEANING = {
    "local": "streaks are no longer shared across workers",
    "open": "checks are not braked (every call is allowed)",
    "closed": "braked tools are refused",
}


@dataclass(frozen=True, slots=True)
class BrakeHealth:
    """What `brake.health()` returns: the backend as this brake last saw it (never an error's text)."""

    state: HealthState  # "ok" or "degraded" (Redis failed; the failure policy decides checks)
    since: float  # Unix time of the last change of state (the brake's creation at first)
    last_error: str | None  # the class name of the error that began the outage, e.g. "ConnectionError"
    policy: str  # on_backend_error: what decides checks while degraded

    @property
    def ok(self) -> bool:
        return self.state == "ok"


def configuration_problem(error: BaseException) -> str | None:
    """"wrong password" or "ACL refusal" when `error` is a configuration error, not an outage."""
    return classify(error).problem


def error_name(error: BaseException) -> str:
    """The error's class name, with "(configuration: ...)" when it is not an outage."""
    return classify(error).name


class HealthWatch:
    """The state behind `brake.health()`, and what is said and called when it changes."""

    def __init__(
        self, policy: str, backend: str, on_degraded: Callback | None = None,
        on_recovered: Callback | None = None,
    ) -> None:
        self._policy = policy
        self._backend = backend
        self._on_degraded = on_degraded
        self._on_recovered = on_recovered
        self._lock = threading.Lock()
        self._health = BrakeHealth("ok", time.time(), None, policy)

    def health(self) -> BrakeHealth:
        return self._health

    def degraded(self, error: BaseException) -> None:
        """The first failure of an outage (called once per outage)."""
        classified = classify(error)
        name = classified.name
        with self._lock:
            self._health = BrakeHealth("degraded", time.time(), name, self._policy)
        problem = classified.problem
        cause = (
            f"Redis refused the brake ({name}): a configuration error, not an outage; fix the URL's "
            "credentials or the user's ACL" if problem else f"Redis unreachable ({name})"
        )
        logger.error(
            "distbrake: %s: %s; policy %s (backend %s)",
            _MEANING.get(self._policy, "checks fall to the failure policy"), cause, self._policy, self._backend,
        )
        if self._on_degraded is not None:
            run_callback("on_degraded", self._on_degraded, error)

    def recovered(self) -> None:
        """Redis answered again after an outage (called once per outage)."""
        with self._lock:
            self._health = BrakeHealth("ok", time.time(), self._health.last_error, self._policy)
        logger.info("distbrake: Redis at %s answers again; streaks are shared again", self._backend)
        if self._on_recovered is not None:
            run_callback("on_recovered", self._on_recovered)


class Healthy:
    """`health()` for a brake: the mixin every brake class has."""

    health_watch: HealthWatch

    def health(self) -> BrakeHealth:
        """The backend as this brake last saw it: `state` "ok" or "degraded", `since`, `last_error`, `policy`."""
        return self.health_watch.health()
