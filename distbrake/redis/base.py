"""The non-I/O half of the Redis brakes, shared by sync and asyncio.

`DistributedBase` builds the configuration, keeps the failure handler and
turns calls into script arguments and replies into verdicts. The subclasses
in `sync.py` and `aio.py` only send and receive.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import Any, Self, Unpack

from ..core import BrakeCore, PreparedCall, SessionState, Verdict
from ..errors import InvalidURLError
from ..killswitch import Stop, stop_of
from ..model import Halt
from ..operator import KillState, kill_key, ttl_ms
from ..policy import NO_TRY, FailureHandler
from ..redis_errors import REDIS_FAILURES, classify, is_pool_wait
from ..rules import call_failed, result_digest
from ..settings import DEFAULT_URL, BrakeOptions, BrakeSettings, load_settings
from ..telemetry.build import build_telemetry
from ..telemetry.health import Healthy
from ..telemetry.options import take_telemetry_options
from ..urls import ParsedURL
from ..wrap import GuardMixin
from .connect import script_variant
from .script import Script, script_for
from .wire import (
    FIELDS,
    CheckEncoder,
    Encoded,
    block_argv,
    decode_halt,
    decode_reply,
    decode_state,
    encode_call,
    encode_halt,
    key_pattern,
    redis_time,
    resp_evalsha,
    session_key,
    unblock_argv,
)

logger = logging.getLogger("distbrake")

__all__ = ["REDIS_FAILURES", "DistributedBase"]


class DistributedBase(Healthy, GuardMixin, BrakeCore):
    """Configuration, key layout, encoding and failure policy for a Redis-backed brake."""

    asynchronous = False  # True for the asyncio brake: its callbacks may be coroutine functions

    def __init__(
        self,
        client: Any,
        *,
        settings: BrakeSettings | None = None,
        url: str | None = None,
        **options: Unpack[BrakeOptions],
    ) -> None:
        telemetry = take_telemetry_options(options)  # type: ignore[arg-type]
        super().__init__(load_settings(settings, url=url, **options))
        self.client = client
        # The URL and timeout the brake built its client from, when it did (see `own_client`).
        self.built_from: tuple[ParsedURL, float] | None = None
        self.backend = self.settings.shown_url if self.settings.url is not None else repr_client(client)
        if self.settings.url is None and _without_timeout(client):
            logger.warning(
                "distbrake: the client given to %s has no socket_timeout: a Redis that accepts "
                "but never answers would hang checks; build it with socket_timeout (see README, "
                "Failure policy) or use from_url", type(self).__name__,
            )
        built = build_telemetry(
            telemetry, decided_by="redis", policy=self.settings.on_backend_error, backend=self.backend,
            asynchronous=self.asynchronous, client=lambda: self.client, key_prefix=self.settings.key_prefix,
        )
        self.watch, self.health_watch, self.recorder = built.watch, built.health, built.recorder
        self.failures = FailureHandler(self, self.backend, built.health, built.recorder)
        # The script's variant is the server's (see connect.CONNECTORS): chosen once, when the brake is built.
        variant = "redis"
        if self.settings.url is not None:
            with contextlib.suppress(InvalidURLError):  # a caller's client, named by a URL only shown
                variant = script_variant(self.settings.parsed_url)
        self.script: Script = script_for(variant, self.recorder.script_load)
        self._head = self.script.evalsha_head  # what every packed check of this brake starts with
        self._ttl_ms = max(1, round(self.settings.ttl_seconds * 1000))
        # A call id seen again within the timeout is a retry or a second seam; later, a new call.
        self._window_ms = max(1, round(self.settings.timeout_seconds * 1000))
        settings = self.settings
        self._cycles = (settings.max_cycle_period, settings.cycle_repeats) if settings.max_cycle_period else None
        self._cycle_halt = (settings.cycle_halt_repeats or 0) if self._cycles else 0
        self._encoder = CheckEncoder(settings.key_prefix, self._ttl_ms, self._window_ms, self._cycles, self._head,
                                     self._cycle_halt)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(backend={self.backend!r}, max_repeats={self.max_repeats}, "
            f"key_prefix={self.settings.key_prefix!r}, "
            f"on_backend_error={self.settings.on_backend_error!r})"
        )

    @staticmethod
    def connect(url: ParsedURL, timeout: float) -> Any:
        """The client `from_url` builds: a sync or an asyncio redis-py client."""
        raise NotImplementedError

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        settings: BrakeSettings | None = None,
        **options: Unpack[BrakeOptions],
    ) -> Self:
        """A brake on `url` (else `DISTBRAKE_URL`, else `memory://`); see the README for schemes.

        Arguments > `settings` (or the environment) > defaults. The URL is parsed
        and every setting validated before any connection is made.
        """
        telemetry = take_telemetry_options(options)  # type: ignore[arg-type]
        resolved = cls.settings_for_url(url, settings, **options)
        brake = cls(cls.connect(resolved.parsed_url, resolved.timeout_seconds), settings=resolved, **telemetry)
        brake.own_client(resolved.parsed_url, resolved.timeout_seconds)
        return brake

    def own_client(self, url: ParsedURL, timeout: float) -> None:
        """The brake's client is one it built from `url` with `timeout` (`connect`, as `from_url` does): the
        brake owns it (and may build it again: the asyncio brake does for each new event loop)."""
        self.built_from = (url, timeout)

    @staticmethod
    def settings_for_url(
        url: str | None, settings: BrakeSettings | None, **options: Unpack[BrakeOptions]
    ) -> BrakeSettings:
        """The settings `from_url` uses: arguments > `settings` or environment > defaults.

        The URL is parsed here, once, so a bad one fails before any connection.
        """
        resolved = load_settings(settings, url=url, **options)
        if resolved.url is None:  # the brake names its backend by URL: the default one
            resolved = load_settings(resolved, url=DEFAULT_URL)
        resolved.parsed_url  # noqa: B018  # parse now: a bad URL fails before any connection
        return resolved

    def key(self, session_id: str) -> str:
        """The Redis key of `session_id`'s record under this brake's prefix."""
        return session_key(session_id, self.settings.key_prefix)

    @property
    def key_pattern(self) -> str:
        return key_pattern(self.settings.key_prefix)

    def encode(self, call: PreparedCall) -> Encoded:
        """KEYS[1], ARGV and the packed EVALSHA of a check of `call` (see `wire.encode_call`)."""
        return self._encoder(call)

    def observations(self, verdict: Verdict, result: object, failed: bool | None = None) -> list[Encoded]:
        """KEYS[1], ARGV and packed EVALSHA of each observation of `verdict`'s result to send (none, one or two).

        Only the verdict of a progress-aware tool (its result's digest,
        MODE_OBSERVE) or of a tool with max_failures (whether it failed,
        MODE_FAILED; `failed` None: `result` is an exception) carries what an
        observation needs; a verdict of the fallback is observed in the
        fallback, one of the `open` policy nowhere (nothing was counted).
        """
        call = verdict.observe_token
        if not isinstance(call, PreparedCall):
            return []
        if verdict.decided_by != "redis":
            if verdict.decided_by == "fallback":
                self.failures.local.observe(verdict, result, failed)
            return []
        prefix, ttl, window, head = self.settings.key_prefix, self._ttl_ms, self._window_ms, self._head
        sent = []
        if call.rules.progress:
            sent.append(encode_call(call, prefix, ttl, window, result=result_digest(result), head=head))
        if call.rules.max_failures is not None:
            failure = call_failed(result, failed)
            sent.append(encode_call(call, prefix, ttl, window, head=head, failed=failure))
        return sent

    def block_request(self, key: str, halt: Halt, ttl_ms: int, session_id: str | None) -> Encoded:
        """The EVALSHA of an operator's block of the session at `key` (see `wire.block_argv`)."""
        argv = block_argv(halt, ttl_ms, session_id)
        return key, argv, resp_evalsha(key, argv, self._head)

    def unblock_request(self, key: str) -> Encoded:
        """The EVALSHA that lifts the halt of the session at `key` (deletes its record; 1, or 0: not halted)."""
        argv = unblock_argv()
        return key, argv, resp_evalsha(key, argv, self._head)

    def observation_failed(self, error: BaseException) -> None:
        """An observation Redis did not take: the streak goes on as if the result had not changed."""
        logger.warning(
            "distbrake: the result of a progress-aware call was not recorded (%s); its streak goes on",
            type(error).__name__,
        )

    @staticmethod
    def queue_state_reads(pipe: Any, keys: list[Any]) -> Any:
        """Queue the reads `decode_states` needs (HMGET + PTTL per key) on a pipeline."""
        for key in keys:
            pipe.hmget(key, FIELDS)
            pipe.pttl(key)
        return pipe

    @classmethod
    def decode_states(cls, replies: list[Any], time_reply: Any, match: str | None) -> list[SessionState]:
        """Replies of `queue_state_reads` (and of a TIME) as states, filtered by a session glob."""
        return [state for _, state in cls.keyed_states(range(len(replies) // 2), replies, time_reply, match)]

    @staticmethod
    def keyed_states(
        keys: Iterable[Any], replies: list[Any], time_reply: Any, match: str | None
    ) -> list[tuple[str, SessionState]]:
        """`decode_states` with each state's key (as a str): (key, state)."""
        now = redis_time(time_reply)
        states = []
        for key, index in zip(keys, range(0, len(replies), 2), strict=True):
            if isinstance(replies[index], Exception):  # not a hash: someone else's key, not a record
                continue
            state = decode_state(replies[index], replies[index + 1], now)
            if state is not None and (match is None or fnmatchcase(state.session_id, match)):
                states.append((key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else key, state))
        return states

    @staticmethod
    def records_among(keys: list[Any], replies: list[Any]) -> list[Any]:
        """The keys (of `queue_state_reads`' replies) that hold a streak record: never a foreign key."""
        return [
            key for key, index in zip(keys, range(0, len(replies), 2), strict=True)
            if not isinstance(replies[index], Exception)
            and decode_state(replies[index], replies[index + 1], 0.0) is not None
        ]

    # -- the kill switch (killswitch.py): one key, read by each brake's reader, set by `block_all` -----------

    @property
    def kill_key(self) -> str:
        return kill_key(self.settings.key_prefix)

    def queue_kill_read(self, pipe: Any) -> Any:
        """Queue the kill switch's read (GET and PTTL of its one key) on a pipeline."""
        return pipe.get(self.kill_key).pttl(self.kill_key)

    @staticmethod
    def kill_read(replies: list[Any]) -> Stop | None:
        """The replies of `queue_kill_read` as the switch: set (a `Stop`), or None."""
        value, left = replies
        return None if value is None else stop_of(decode_halt(value)._replace(kind="kill"), left)

    @staticmethod
    def kill_state(stop: Stop | None) -> KillState | None:
        return None if stop is None else KillState(stop.halt, stop.seconds_left)

    def kill_write(self, halt: Halt, ttl: float | None) -> tuple[str, bytes, int | None]:
        """The SET of `block_all` (key, value, PX) and, at once, this brake's own switch."""
        self.switch.set(stop_of(halt, None if ttl is None else ttl_ms(ttl)))
        return self.kill_key, encode_halt(halt), None if ttl is None else ttl_ms(ttl)

    @staticmethod
    def queue_deletes(pipe: Any, keys: list[Any]) -> Any:
        for key in keys:
            pipe.delete(key)
        return pipe

    def verdict(self, call: PreparedCall, reply: object, ticket: int) -> Verdict:
        """The script's reply to the check holding `ticket` as a verdict (raises `LoopBrakeError` on denial)."""
        counted = decode_reply(reply, self.settings.cycle_repeats)
        self.failures.succeeded(ticket)
        return self.judge(call, counted, "redis")

    def without_redis(self, call: PreparedCall, error: BaseException | None, ticket: int = NO_TRY) -> Verdict:
        """Apply the failure policy; `error` is None when Redis is known down and was not asked.

        An error about this session's key alone (it holds a foreign value) is
        that session's problem: the policy decides this check, and the
        backend's health is untouched.
        """
        if error is not None:
            if classify(error).meaning == "record":  # this session's key holds a value of another type
                return self.failures.decide(call, error, record_key=self.key(call.session_id))
            if is_pool_wait(error):  # every connection of a limited pool was busy: the brake's own delay
                self.failures.breaker.abandoned(ticket)
                return self.failures.decide(call, error, own_delay=True)
            self.failures.failed(error, ticket)
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
