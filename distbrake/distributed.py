"""The non-I/O half of the distributed brakes, shared by sync and asyncio.

`DistributedBase` builds the configuration, keeps the failure handler and
turns calls into script arguments and replies into verdicts. The subclasses
in `redis_brake.py` and `aio.py` only send and receive.
"""

from __future__ import annotations

import logging
from fnmatch import fnmatchcase
from typing import Any, Self

import redis.exceptions

from .base import BrakeBase, PreparedCall, SessionState, Verdict
from .policy import FailureHandler
from .settings import BrakeSettings, FailurePolicy, load_settings
from .slot import (
    FIELDS,
    decode_reply,
    decode_state,
    encode_call,
    key_pattern,
    redis_time,
    session_key,
)
from .urls import parse_url, redact_url
from .wrap import GuardMixin

logger = logging.getLogger("distbrake")

__all__ = ["BACKEND_ERRORS", "DistributedBase"]

# What counts as "Redis failed": connection, timeout, cluster, read-only
# replica, ACL refusal, script errors... every error the driver raises, and
# the OS and asyncio timeouts under it.
BACKEND_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.RedisError,
    redis.exceptions.RedisClusterException,  # not a RedisError: "no node reachable" and kin
    OSError,
    TimeoutError,
)


class DistributedBase(GuardMixin, BrakeBase):
    """Configuration, key layout, encoding and failure policy for a Redis-backed brake."""

    def __init__(
        self,
        client: Any,
        *,
        max_repeats: int | float | str | None = None,
        settings: BrakeSettings | None = None,
        ttl_seconds: float | None = None,
        key_prefix: str | None = None,
        on_backend_error: FailurePolicy | None = None,
        timeout_seconds: float | None = None,
        tool_max_repeats: dict[str, int] | None = None,
        exempt_tools: frozenset[str] | set[str] | None = None,
        url: str | None = None,
    ) -> None:
        super().__init__(
            load_settings(
                settings, max_repeats=max_repeats, ttl_seconds=ttl_seconds,
                key_prefix=key_prefix, on_backend_error=on_backend_error,
                timeout_seconds=timeout_seconds, tool_max_repeats=tool_max_repeats,
                exempt_tools=exempt_tools, url=url,
            )
        )
        self.client = client
        self.backend = redact_url(self.settings.url) if self.settings.url else repr_client(client)
        if self.settings.url is None and _without_timeout(client):
            logger.warning(
                "distbrake: the client given to %s has no socket_timeout: a Redis that accepts "
                "but never answers would hang checks; build it with socket_timeout (see README, "
                "Failure policy) or use from_url", type(self).__name__,
            )
        self.failures = FailureHandler(self, self.backend)
        self._ttl_ms = max(1, round(self.settings.ttl_seconds * 1000))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(backend={self.backend!r}, max_repeats={self.max_repeats}, "
            f"key_prefix={self.settings.key_prefix!r}, "
            f"on_backend_error={self.settings.on_backend_error!r})"
        )

    @staticmethod
    def connect(url: str, timeout: float) -> Any:
        """The client `from_url` builds: a sync or an asyncio redis-py client."""
        raise NotImplementedError

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        max_repeats: int | float | str | None = None,
        settings: BrakeSettings | None = None,
        ttl_seconds: float | None = None,
        key_prefix: str | None = None,
        on_backend_error: FailurePolicy | None = None,
        timeout_seconds: float | None = None,
        tool_max_repeats: dict[str, int] | None = None,
        exempt_tools: frozenset[str] | set[str] | None = None,
    ) -> Self:
        """A brake on `url` (else `DISTBRAKE_URL`, else `memory://`); see the README for schemes.

        Arguments > `settings` (or the environment) > defaults. The URL is parsed
        and every setting validated before any connection is made.
        """
        resolved = cls.settings_for_url(
            url, settings, max_repeats=max_repeats, ttl_seconds=ttl_seconds,
            key_prefix=key_prefix, on_backend_error=on_backend_error,
            timeout_seconds=timeout_seconds, tool_max_repeats=tool_max_repeats,
            exempt_tools=exempt_tools,
        )
        return cls(cls.connect(resolved.url or "memory://", resolved.timeout_seconds), settings=resolved)

    @staticmethod
    def settings_for_url(
        url: str | None, settings: BrakeSettings | None, **options: Any
    ) -> BrakeSettings:
        """The settings `from_url` uses: arguments > `settings` or environment > defaults.

        The URL is parsed here, so a bad one fails before any connection.
        """
        resolved = load_settings(settings, url=url, **options)
        if resolved.url is None:
            resolved = load_settings(resolved, url="memory://")
        parse_url(resolved.url or "memory://")
        return resolved

    def key(self, session_id: str) -> str:
        """The Redis key of `session_id`'s slot under this brake's prefix."""
        return session_key(session_id, self.settings.key_prefix)

    @property
    def key_pattern(self) -> str:
        return key_pattern(self.settings.key_prefix)

    def encode(self, call: PreparedCall) -> tuple[str, tuple[bytes | int, ...]]:
        return encode_call(call, self.settings.key_prefix, self._ttl_ms)

    @staticmethod
    def queue_state_reads(pipe: Any, keys: list[Any]) -> Any:
        """Queue the reads `decode_states` needs (HMGET + PTTL per key) on a pipeline."""
        for key in keys:
            pipe.hmget(key, FIELDS)
            pipe.pttl(key)
        return pipe

    @staticmethod
    def decode_states(replies: list[Any], time_reply: Any, match: str | None) -> list[SessionState]:
        """Replies of `queue_state_reads` (and of a TIME) as states, filtered by a session glob."""
        now = redis_time(time_reply)
        states = []
        for index in range(0, len(replies), 2):
            if isinstance(replies[index], Exception):  # not a hash: someone else's key, not a slot
                continue
            state = decode_state(replies[index], replies[index + 1], now)
            if state is not None and (match is None or fnmatchcase(state.session_id, match)):
                states.append(state)
        return states

    @staticmethod
    def queue_deletes(pipe: Any, keys: list[Any]) -> Any:
        for key in keys:
            pipe.delete(key)
        return pipe

    def verdict(self, call: PreparedCall, reply: object) -> Verdict:
        """The script's reply as a verdict (raises `LoopBrakeError` on denial)."""
        count, replayed = decode_reply(reply)
        self.failures.health.succeeded()
        return self.judge(call, count, replayed, "redis")

    def without_redis(self, call: PreparedCall, error: BaseException | None) -> Verdict:
        """Apply the failure policy; `error` is None when Redis is known down and was not asked."""
        if error is not None:
            self.failures.failed(error)
        return self.failures.decide(call, error)


def _without_timeout(client: Any) -> bool:
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    return isinstance(kwargs, dict) and "host" in kwargs and kwargs.get("socket_timeout") is None


def repr_client(client: Any) -> str:
    """A short, password-free name for a ready client."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if isinstance(kwargs, dict):
        if "path" in kwargs:
            return f"unix://{kwargs['path']}"
        if "host" in kwargs:
            return f"redis://{kwargs['host']}:{kwargs.get('port', 6379)}"
    return type(client).__name__
