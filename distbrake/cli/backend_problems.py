"""What went wrong with the backend and how to fix it, in words, from the exception it raised."""

from __future__ import annotations

import redis.exceptions

from ..errors import BrakeUnavailableError
from .acl_requirements import needed_rules
from .run_state import current_run


def backend_problem(error: BaseException) -> tuple[str, str, str]:
    """(kind, what happened, the fix) for a backend failure, password-free."""
    backend, timeout = current_run.backend, current_run.timeout
    if isinstance(error, BrakeUnavailableError) and error.__cause__ is not None:
        error = error.__cause__
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, redis.exceptions.AuthenticationError):
        return (
            "auth",
            f"backend {backend} refused the credentials ({text})",
            "fix the user name and password (the user:password@ part of --url or DISTBRAKE_URL)",
        )
    if isinstance(error, redis.exceptions.NoPermissionError) or (
        isinstance(error, redis.exceptions.ResponseError)
        and ("can't run this command" in text or "no permissions" in text.lower())
    ):
        return (
            "permission",
            f"backend {backend} denied a command to this user, permission missing ({text})",
            "grant the brake's user what it needs, e.g. "
            f"ACL SETUSER <user> {needed_rules()} ~<key_prefix>:*",
        )
    if isinstance(error, redis.exceptions.ReadOnlyError):
        return (
            "read-only",
            f"backend {backend} is a read-only replica ({text})",
            "point --url at the primary (or use redis+sentinel:// to follow it)",
        )
    if isinstance(error, (redis.exceptions.TimeoutError, TimeoutError)):
        return (
            "timeout",
            f"backend {backend} did not answer within {timeout:g} s ({text})",
            "check that it is a Redis server (TLS needs rediss://) that is up and not paused, "
            "or raise --timeout on a slow network",
        )
    if isinstance(error, redis.exceptions.ResponseError) and text.startswith(("MOVED", "ASK")):
        return (
            "cluster",
            f"backend {backend} is a Redis Cluster node ({text})",
            "use redis+cluster://host:port[,host:port...]",
        )
    if isinstance(error, (redis.exceptions.ConnectionError, ConnectionError, OSError)):
        return (
            "unreachable",
            f"backend {backend} is unreachable ({text})",
            "start Redis there, or point --url / DISTBRAKE_URL at a running server",
        )
    if isinstance(error, redis.exceptions.RedisClusterException):
        return (
            "cluster",
            f"Redis Cluster at {backend} is unusable ({text})",
            "check that the nodes in the URL are up and that the cluster is healthy "
            "(CLUSTER INFO: cluster_state:ok)",
        )
    return (
        "backend",
        f"backend {backend} failed: {type(error).__name__}: {text}",
        "run `distbrake doctor` for a diagnosis",
    )
