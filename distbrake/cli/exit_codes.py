"""The CLI's stable exit codes, and which one (with a one-line message) each error gets."""

from __future__ import annotations

import redis.exceptions

from ..errors import (
    BrakeUnavailableError,
    ConfigurationError,
    DistbrakeError,
    LoopBrakeError,
    UnsupportedArgumentsError,
)
from .backend_problems import backend_problem
from .run_state import current_run

EXIT_OK = 0
EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_DENIED = 3
EXIT_BACKEND = 4
EXIT_INTERNAL = 70
EXIT_CODES = {
    EXIT_OK: "ok (check: allowed)",
    EXIT_NOT_FOUND: "not found (inspect: no such session)",
    EXIT_USAGE: "usage error",
    EXIT_DENIED: "denied (check)",
    EXIT_BACKEND: "backend unreachable or misconfigured",
    EXIT_INTERNAL: "internal error (a bug)",
}


class CliError(Exception):
    """An error the CLI reports as one line with an exit code."""

    def __init__(self, message: str, code: int, kind: str = "error") -> None:
        super().__init__(message)
        self.code = code
        self.kind = kind


def as_cli_error(error: BaseException) -> CliError:
    if isinstance(error, CliError):
        return error
    if isinstance(error, LoopBrakeError):
        return CliError(str(error), EXIT_DENIED, "denied")
    if isinstance(error, BrakeUnavailableError):
        cause = error.__cause__
        if cause is not None:
            kind, what, fix = backend_problem(cause)
            return CliError(f"{what}; {fix}", EXIT_BACKEND, kind)
        return CliError(str(error), EXIT_BACKEND, "unavailable")
    if isinstance(error, ConfigurationError):
        return CliError(f"configuration error: {error}", EXIT_BACKEND, "configuration")
    if isinstance(error, UnsupportedArgumentsError):
        return CliError(str(error), EXIT_USAGE, "usage")
    if isinstance(error, DistbrakeError):  # ScriptReplyError and the like: the backend's side
        return CliError(f"backend {current_run.backend}: {error}", EXIT_BACKEND, "backend")
    if isinstance(error, (redis.exceptions.RedisError, redis.exceptions.RedisClusterException,
                          OSError, TimeoutError)):
        kind, what, fix = backend_problem(error)
        return CliError(f"{what}; {fix}", EXIT_BACKEND, kind)
    return CliError(
        f"internal error ({type(error).__name__}: {error}); please report it",
        EXIT_INTERNAL, "internal",
    )
