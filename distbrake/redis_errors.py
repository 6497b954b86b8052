"""What a Redis error means to this library: the one place that decides it.

Every error the driver raises while the brake talks to Redis is one of
`REDIS_FAILURES`; `classify` says what it means:

* `configuration`: Redis refused the brake, and will again until someone
  changes the URL or the server: a wrong or missing password (`auth`), an
  ACL that does not grant a command, outside or inside the script (`permission`);
* `record`: one session's key holds a value of another type (WRONGTYPE): that
  session's problem, not the backend's;
* `script`: the script is not the one the brake expects (NOSCRIPT, an
  unexpected reply);
* `outage`: everything else: unreachable, timed out, a read-only replica, a
  Cluster that is down or redirects a single-node URL.

The breaker (`redis/base.py`'s `without_redis`), the health log line and
`last_error` (telemetry/health.py), the metrics' `error_type` label
(policy.py) and the CLI's error kinds and exit codes (cli/output.py,
cli/doctor.py) all read it from here. It imports nothing of distbrake: a
leaf every layer may use (it sits beside urls.py and errors.py, below
telemetry/ and policy.py, so neither imports the Redis backend for it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import redis.exceptions

__all__ = [
    "REDIS_FAILURES", "Classified", "Meaning", "classify", "is_pool_wait", "is_refusal", "is_unknown_command",
]

#: What counts as "Redis failed": connection, timeout, cluster, read-only replica, ACL refusal, script
#: errors... every error the driver raises, and the OS and asyncio timeouts under it.
REDIS_FAILURES: tuple[type[BaseException], ...] = (
    redis.exceptions.RedisError,
    redis.exceptions.RedisClusterException,  # not a RedisError: "no node reachable" and kin
    OSError,
    TimeoutError,
)

Meaning = Literal["outage", "configuration", "record", "script"]
# The finer cause: auth, permission | wrong-type | noscript, reply | read-only, timeout, redirect, cluster,
# unreachable, other.
Cause = Literal[
    "auth", "permission", "wrong-type", "noscript", "reply", "read-only", "timeout", "redirect", "cluster",
    "unreachable", "other",
]

#: What `problem` says of a configuration error, by cause (the health line and `last_error` show it).
_PROBLEMS = {"auth": "wrong password", "permission": "ACL refusal"}
# Redis's words for an ACL refusal: NOPERM replies, and a command refused inside a script ("The user
# executing the script can't run this command or subcommand"), which comes as a plain ResponseError.
_REFUSED = ("can't run this command", "no permissions")


@dataclass(frozen=True, slots=True)
class Classified:
    """What an error means (`meaning`), its finer `cause`, and its `error_type` (the class name: the
    metrics' label and the health's `last_error`)."""

    meaning: Meaning
    cause: Cause
    error_type: str

    #: An `auth` error that asked for a password when none was sent (NOAUTH, "HELLO must be called with the
    #: client already authenticated"), rather than refusing the one given (WRONGPASS).
    missing_password: bool = False

    @property
    def problem(self) -> str | None:
        """"wrong password", "password required, none given" or "ACL refusal" for a configuration error,
        else None."""
        if self.missing_password:
            return "password required, none given"
        return _PROBLEMS.get(self.cause)

    @property
    def name(self) -> str:
        """The class name, with "(configuration: ...)" when it is not an outage (health's `last_error`)."""
        problem = self.problem
        return self.error_type if problem is None else f"{self.error_type} (configuration: {problem})"


def _cause(error: BaseException) -> Cause:
    text = " ".join(str(error).split())
    if isinstance(error, redis.exceptions.AuthenticationError) or text.startswith(("NOAUTH", "WRONGPASS")):
        return "auth"
    if isinstance(error, redis.exceptions.NoPermissionError) or text.startswith("NOPERM") or (
        isinstance(error, redis.exceptions.ResponseError) and any(word in text.lower() for word in _REFUSED)
    ):
        return "permission"
    if isinstance(error, redis.exceptions.NoScriptError):
        return "noscript"
    if isinstance(error, redis.exceptions.ReadOnlyError):
        return "read-only"
    if isinstance(error, (redis.exceptions.TimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(error, redis.exceptions.ResponseError):
        if text.startswith("WRONGTYPE"):
            return "wrong-type"
        if text.startswith(("MOVED", "ASK")):
            return "redirect"
    if isinstance(error, (redis.exceptions.ConnectionError, ConnectionError, OSError)):
        return "unreachable"
    if isinstance(error, redis.exceptions.RedisClusterException):
        return "cluster"
    if type(error).__name__ == "ScriptReplyError":  # distbrake.errors' (not imported: this module is a leaf)
        return "reply"
    return "other"


_MEANINGS: dict[Cause, Meaning] = {
    "auth": "configuration", "permission": "configuration", "wrong-type": "record", "noscript": "script",
    "reply": "script",
}


def classify(error: BaseException) -> Classified:
    """What `error` (raised while talking to Redis) means to the brake."""
    cause = _cause(error)
    missing = cause == "auth" and _asks_for_password(error)
    return Classified(_MEANINGS.get(cause, "outage"), cause, type(error).__name__, missing)


def _asks_for_password(error: BaseException) -> bool:
    """Whether an authentication error says a password is required (none was sent), not that it is wrong."""
    text = " ".join(str(error).split()).lower()
    return text.startswith("noauth") or "authentication required" in text or "already authenticated" in text


def is_refusal(error: BaseException) -> bool:
    """True when Redis refused a command to this user (an ACL refusal)."""
    return _cause(error) == "permission"


def is_unknown_command(error: BaseException) -> bool:
    """True when the server does not know a command (or subcommand): an older or another server."""
    text = str(error).lower()
    return isinstance(error, redis.exceptions.ResponseError) and (
        "unknown command" in text or "unknown subcommand" in text or "not found" in text
    )


def is_pool_wait(error: BaseException) -> bool:
    """True when the check waited its time out for a connection of a limited pool (`?max_connections=N`): the
    brake's own delay (every connection busy with its other checks), not Redis failing."""
    return isinstance(error, redis.exceptions.ConnectionError) and str(error) == "No connection available."
