"""What a check does when Redis fails: the `on_backend_error` policy.

* `open`: allow the call and log a warning (the brake is off while Redis is);
* `closed`: raise `BrakeUnavailableError` (the tool does not run);
* `local` (default): an in-process `LoopBrake` carries the streaks of this
  process until Redis answers again (streaks are then per process, not per
  fleet).

`BackendHealth` is a small circuit breaker: after a failure Redis is known to
be down and checks go straight to the policy, paying no timeout, until a
pause has passed (`retry_after_seconds`, doubling up to 30 times that); then
one check probes Redis, and a success closes the breaker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from .core import BrakeCore, PreparedCall, Verdict
from .errors import BrakeUnavailableError
from .inprocess import LoopBrake

__all__ = ["BackendHealth", "FailureHandler"]

logger = logging.getLogger("distbrake")

MAX_PAUSE_FACTOR = 30


class BackendHealth:
    """Known up, or known down until a probe is due. Thread-safe; no I/O."""

    def __init__(self, first_pause: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._first_pause = first_pause
        self._max_pause = first_pause * MAX_PAUSE_FACTOR
        self._clock = clock
        self._lock = threading.Lock()
        self._down = False
        self._pause = first_pause
        self._probe_at = 0.0
        self._probing = False

    @property
    def down(self) -> bool:
        return self._down

    def may_try(self) -> bool:
        """True when Redis should be asked now (it is up, or this call is the probe)."""
        if not self._down:
            return True
        with self._lock:
            if self._probing or self._clock() < self._probe_at:
                return False
            self._probing = True
            return True

    def succeeded(self) -> None:
        if self._down:
            with self._lock:
                self._down, self._probing, self._pause = False, False, self._first_pause
            logger.warning("distbrake: Redis answers again; streaks are shared again")

    def abandoned(self) -> None:
        """A check gave up with no answer either way (cancelled): if it was the probe, the next check probes."""
        if self._down:
            with self._lock:
                self._probing = False

    def failed(self) -> bool:
        """Record a failure; True when this failure is news (Redis was thought up)."""
        with self._lock:
            news = not self._down
            if self._down:
                self._pause = min(self._pause * 2, self._max_pause)
            self._down, self._probing = True, False
            self._probe_at = self._clock() + self._pause
            return news


class FailureHandler:
    """Applies the configured policy to a call that Redis could not judge."""

    def __init__(self, brake: BrakeCore, backend: str) -> None:
        self._brake = brake
        self._backend = backend
        self.policy = brake.settings.on_backend_error
        self.local = LoopBrake(settings=brake.settings)
        self.health = BackendHealth(brake.settings.retry_after_seconds)

    def failed(self, error: BaseException | None) -> None:
        """Record a backend failure (once per outage in the log, without arguments)."""
        if self.health.failed() and error is not None:
            logger.warning(
                "distbrake: Redis at %s failed (%s); policy %r until it answers again",
                self._backend, type(error).__name__, self.policy,
            )

    def decide(self, call: PreparedCall, error: BaseException | None) -> Verdict:
        """The verdict without Redis: allow, raise `BrakeUnavailableError`, or brake locally."""
        if self.policy == "closed":
            cause = type(error).__name__ if error is not None else "known to be down"
            raise BrakeUnavailableError(
                f"loop brake backend {self._backend} is unavailable ({cause}); "
                f'tool "{call.tool_name}" was not run (on_backend_error="closed")'
            ) from error
        if self.policy == "open":
            return Verdict(
                0, call.max_repeats, call.hash_prefix, call.session_id, call.tool_name,
                decided_by="fail-open",
            )
        count, replayed = self.local.record(call)
        return self._brake.judge(call, count, replayed, "fallback")
