"""What a check does when Redis fails: the `on_backend_error` policy, and the circuit breaker.

* `open`: allow the call and log a warning (the brake is off while Redis is);
* `closed`: raise `BrakeUnavailableError` (the tool does not run);
* `local` (default): an in-process `LoopBrake` carries the streaks of this
  process until Redis answers again (streaks are then per process, not per
  fleet); they are forgotten when Redis answers again, so a streak from one
  outage never reaches into the next.

`Breaker` is a small circuit breaker: after a failure Redis is known to
be down and checks go straight to the policy, paying no timeout, until a
pause has passed (`retry_after_seconds`); then one check probes Redis: a
success closes the breaker, a failure doubles the pause (up to 30 times the
first). One outage moves the pause one step, however many checks were in
flight when it began: each check carries a ticket naming the breaker's state
it started in, and a failure (or success) from a state that has since
changed is old news. What an error means (an outage, a configuration error,
one session's foreign key) is `redis_errors.classify`'s to say.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable

from .core import BrakeCore, PreparedCall, Verdict, printable
from .errors import BrakeUnavailableError, LoopBrakeError
from .inprocess import LoopBrake
from .model import Counted
from .redis_errors import classify
from .telemetry.health import HealthWatch
from .telemetry.recorder import Recorder
from .telemetry.watch import mark_decided_by

__all__ = ["Breaker", "FailureHandler"]

logger = logging.getLogger("distbrake")

MAX_PAUSE_FACTOR = 30
FOREIGN_KEYS_LOGGED = 1024  # keys remembered as already logged (then the memory starts over)


#: How the RuntimeWarning of a brake's first check decided by the failure policy begins (filter on it).
WARNING_START = "distbrake: a check fell to the failure policy:"

NO_TRY = -1  # the ticket of a check that must not ask Redis (known down, no probe due)


class Breaker:
    """Known up, or known down until a probe is due. Thread-safe; no I/O.

    `attempt()` gives each check a ticket: `NO_TRY`, or the breaker's epoch
    times two, plus one when the check is the probe. The epoch moves on every
    change of state (up -> down, down -> up), so `failed` and `succeeded` act
    only on news: an even ticket's success never is (given while up, that epoch
    is either still up or over), only the probe's may be.
    """

    def __init__(self, first_pause: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._first_pause = first_pause
        self._max_pause = first_pause * MAX_PAUSE_FACTOR
        self._clock = clock
        self._lock = threading.Lock()
        self._down = False
        self._epoch = 0
        self._pause = first_pause
        self._probe_at = 0.0
        self._probing = False

    @property
    def down(self) -> bool:
        return self._down

    @property
    def pause(self) -> float:
        """The pause before the next probe while down (the first pause while up)."""
        return self._pause

    def attempt(self) -> int:
        """A ticket for this check: `NO_TRY`, or it may ask Redis (it is up, or this check is the probe)."""
        if not self._down:
            return self._epoch << 1
        with self._lock:  # read again under the lock: a probe may have ended the outage meanwhile
            if self._down and (self._probing or self._clock() < self._probe_at):
                return NO_TRY
            probe = self._down
            self._probing = probe
            return (self._epoch << 1) | probe

    def succeeded(self, ticket: int) -> bool:
        """Redis answered the check holding `ticket`; True when that is news (the probe: Redis is back)."""
        if not self._down:
            return False
        with self._lock:
            if not self._down or ticket >> 1 != self._epoch:
                return False  # an answer to a check sent before the outage was known: not the probe's
            self._down, self._probing, self._pause = False, False, self._first_pause
            self._epoch += 1
        return True

    def abandoned(self, ticket: int) -> None:
        """The check holding `ticket` gave up with no answer (cancelled): if it was the probe, the next check probes."""
        if ticket & 1 and self._down:
            with self._lock:
                if ticket >> 1 == self._epoch:
                    self._probing = False

    def failed(self, ticket: int) -> bool:
        """Redis failed the check holding `ticket`; True when this is news (Redis was thought up).

        The first failure of an outage opens the breaker with the first
        pause; a failed probe doubles it; a failure of a check that was in
        flight when the outage began (an older epoch) changes nothing.
        """
        with self._lock:
            if ticket >> 1 != self._epoch:
                return False
            if not self._down:
                self._down, self._pause = True, self._first_pause
                self._epoch += 1
                news = True
            elif ticket & 1:
                self._pause = min(self._pause * 2, self._max_pause)
                news = False
            else:
                return False  # pragma: no cover - only the probe holds a ticket of a down epoch
            self._probing = False
            self._probe_at = self._clock() + self._pause
            return news


class FailureHandler:
    """Applies the configured policy to a call that Redis could not judge."""

    def __init__(
        self, brake: BrakeCore, backend: str, health_watch: HealthWatch | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self._brake = brake
        self._backend = backend
        self.policy = brake.settings.on_backend_error
        self.local = LoopBrake(settings=brake.settings, otel=False)
        # `brake.health()`'s state: said and called once per outage (telemetry/health.py).
        self.health_watch = health_watch or HealthWatch(self.policy, backend)
        self.recorder = recorder or Recorder()  # each failure counted by class
        # Known up, or down until a probe is due: what spares checks the timeout during an outage.
        self.breaker = Breaker(brake.settings.retry_after_seconds)
        self._lock = threading.Lock()
        self._foreign_keys: set[str] = set()
        self._warned = False  # the RuntimeWarning of the first check decided by the policy (once per brake)

    def failed(self, error: BaseException, ticket: int) -> None:
        """Record a backend failure (once per outage in the log and callbacks, without arguments)."""
        if self.breaker.failed(ticket):
            self.health_watch.degraded(error)

    def _foreign_key(self, key: str, call: PreparedCall) -> None:
        """Log, once per key (a bounded memory), that a session's key is not a streak record."""
        with self._lock:
            if key in self._foreign_keys:
                return
            if len(self._foreign_keys) >= FOREIGN_KEYS_LOGGED:
                self._foreign_keys.clear()
            self._foreign_keys.add(key)
        logger.warning(
            "distbrake: the key %s of session %r holds a value that is not a streak record (WRONGTYPE); "
            "policy %r decides its checks until the key is deleted",
            key, call.session_id[:128], self.policy,
        )

    def _warn(self, cause: str) -> None:
        """Say, once per brake, that checks fall to the policy, where the log's ERROR reaches no one (logging
        not configured: the library's `NullHandler` would swallow it)."""
        with self._lock:
            if self._warned:
                return
            self._warned = True
        if _errors_are_shown():
            return
        warnings.warn(
            f"{WARNING_START} on_backend_error={self.policy!r} decides checks that Redis ({self._backend}) "
            f"does not ({cause}); the 'distbrake' logger says when Redis fails and recovers "
            "(this warning is given once per brake)",
            RuntimeWarning, stacklevel=2,
        )

    def succeeded(self, ticket: int) -> None:
        """Redis answered: when that ends an outage, the fallback's streaks are forgotten."""
        if ticket & 1 and self.breaker.succeeded(ticket):  # only the probe's answer can be news (see `Breaker`)
            self.local.reset()
            self.health_watch.recovered()

    def decide(
        self, call: PreparedCall, error: BaseException | None, *, record_key: str | None = None,
        own_delay: bool = False,
    ) -> Verdict:
        """The verdict without Redis: allow, raise `BrakeUnavailableError`, or brake locally.

        `record_key` names the session's key when Redis refused that key alone
        (it holds a foreign value): the same policy, for this check only.
        `own_delay`: the check ran out of time in the brake's own machinery (its
        queue, a late event loop, a full pool), not on Redis: the same policy,
        but while Redis is up `local` judges it as a fresh call and keeps no
        streak of it (a fallback streak is only kept during an outage, and
        forgotten when it ends).
        """
        cause = type(error).__name__ if error is not None else "known to be down"
        if not self._warned:
            self._warn(cause)
        if error is not None:
            self.recorder.backend_error(classify(error).error_type)
        if record_key is not None:
            self._foreign_key(record_key, call)
        if self.policy == "closed":
            if record_key is not None:
                raise BrakeUnavailableError(
                    f"loop brake: the key {record_key} of session {call.session_id[:128]!r} holds a value "
                    f'that is not a streak record ({cause}: WRONGTYPE); tool "{_shown(call.tool_name)}" was not '
                    'run (on_backend_error="closed"). Delete the key, e.g. distbrake clear SESSION'
                ) from error
            raise BrakeUnavailableError(
                f"loop brake backend {self._backend} is unavailable ({cause}); "
                f'tool "{_shown(call.tool_name)}" was not run (on_backend_error="closed")'
            ) from error
        if self.policy == "open":
            return Verdict(
                0, call.max_repeats, call.hash_prefix, call.session_id, call.tool_name,
                decided_by="fail-open",
            )
        # Redis is up (the brake's own delay): leave nothing behind in the fallback
        counted = Counted(1) if own_delay and not self.breaker.down else self.local.record(call)
        try:
            return self._brake.judge(call, counted, "fallback")
        except LoopBrakeError as denial:
            mark_decided_by(denial, "fallback")
            raise


def _errors_are_shown() -> bool:
    """Whether an ERROR of the `distbrake` logger reaches a handler that is not a `NullHandler`."""
    if not logger.isEnabledFor(logging.ERROR):
        return False
    current: logging.Logger | None = logger
    found = False
    while current is not None:
        for handler in current.handlers:
            found = True
            if not isinstance(handler, logging.NullHandler) and handler.level <= logging.ERROR:
                return True
        if not current.propagate:
            break
        current = current.parent
    return not found and logging.lastResort is not None  # no handler at all: logging's last resort prints it


def _shown(tool: str) -> str:
    """A tool name as an error message shows it (as `LoopBrakeError`): its first 64 characters, escaped."""
    return printable(tool[:64]) + ("\u2026" if len(tool) > 64 else "")
