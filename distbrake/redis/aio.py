"""`AsyncDistributedBrake`: the asyncio Redis brake. It only sends and receives.

Concurrent checks are coalesced: while one pipeline of EVALSHAs is on the
wire, new checks queue, and all that queued go out together in the next
pipeline. One connection then carries a burst of hundreds of checks (no
"too many connections"), and throughput at high concurrency is several times
that of one round trip per check. A NOSCRIPT reply (flushed script cache,
restarted or failed-over server) loads the script and sends those checks
again.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from typing import Any, Unpack

import redis.asyncio.cluster
import redis.exceptions

from ..core import SessionState, Verdict
from ..policy import NO_TRY
from ..settings import BrakeOptions, BrakeSettings
from ..urls import ParsedURL
from .base import BACKEND_ERRORS, DistributedBase
from .connect import async_client
from .wire import CALL_HEAD, encode_run, resp_evalsha, run_replies, script_sha, script_source

__all__ = ["AsyncDistributedBrake"]

SCAN_BATCH = 500
MAX_BATCH = 1024
CLUSTER_CONCURRENCY = 32

MAX_RUN = 256  # identical checks of one session sent as one script call, at most

# (key, argv, the check's deadline on the loop clock, its future)
_Pending = tuple[str, tuple[Any, ...], float, "asyncio.Future[Any]"]
# What goes on the wire: (key, argv of the run, the run's earliest deadline, the run's futures)
_Run = tuple[str, tuple[Any, ...], float, "list[asyncio.Future[Any]]"]


class QueueTimeout(Exception):
    """A check spent its time waiting behind the brake's own earlier batches, not on Redis."""


class _Coalescer:
    """Sends queued checks as pipelines, one pipeline in flight at a time.

    Each check carries its deadline; a pipeline may take until the earliest
    deadline of its batch, so no check waits longer than its own timeout
    (one timer per pipeline, not one per check). Identical checks of one
    session that queue together go as one run (one script call, see
    lua/brake.lua), so a burst of one session takes one round trip. Time a
    check spends queued behind earlier batches is not Redis's: a check whose
    time ran out before it was sent, or whose batch was on the wire for less
    than half a timeout, fails with `QueueTimeout`, which the brake decides by
    its policy without marking Redis down.
    """

    def __init__(self, client: Any, timeout: float) -> None:
        self._client = client
        self._timeout = timeout
        # A plain redis.asyncio client (single node, or a Sentinel-managed master)
        # gets its batches, packed once, written straight to one pooled
        # connection; Cluster and the embedded backend use the client's pipeline.
        self._direct = (
            type(client) is redis.asyncio.Redis
            and type(client.connection_pool) in (redis.asyncio.ConnectionPool, redis.asyncio.BlockingConnectionPool)
        )
        self._cluster = isinstance(client, redis.asyncio.cluster.RedisCluster)
        self._queue: list[_Pending] = []
        self._sender: asyncio.Task[None] | None = None
        self._loaded = self._direct  # the direct path learns of a missing script from NOSCRIPT

    async def call(self, key: str, argv: tuple[Any, ...], deadline: float) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((key, argv, deadline, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_all())
        return await future

    async def _send_all(self) -> None:
        await asyncio.sleep(0)  # let the checks started in this tick join the first batch
        loop = asyncio.get_running_loop()
        while self._queue:
            batch = self._next_batch(loop.time())
            if not batch:
                continue
            sent_at = loop.time()
            try:
                async with asyncio.timeout_at(min(run[2] for run in batch)):
                    replies = await self._send(batch)
            except BaseException as error:
                failure: BaseException = error
                if isinstance(error, TimeoutError) and loop.time() - sent_at < self._timeout / 2:
                    failure = QueueTimeout()  # the batch never had a fair share of the timeout
                for *_, futures in batch:
                    _fail(futures, failure)
                if isinstance(error, asyncio.CancelledError):
                    raise
                continue
            for (*_, futures), reply in zip(batch, replies, strict=True):
                if isinstance(reply, BaseException):
                    _fail(futures, reply)
                    continue
                for future, one in zip(futures, run_replies(reply, len(futures)), strict=True):
                    if not future.done():
                        future.set_result(one)

    def _next_batch(self, now: float) -> list[_Run]:
        """Up to MAX_BATCH runs, at most one per key; the other checks wait for the next batch.

        A run is a check and the identical checks of its session queued right
        after it (same call hash, limit and ttl). A batch whose reply is lost
        is sent again (the retry): the script recognises a resent run by its
        last call id, which is the last of its session; so a key never has two
        runs in one batch, and a session's checks are never reordered (once
        one waits, every later check of that session waits too). A check whose
        deadline passed while it queued is not sent (`QueueTimeout`).
        """
        runs: dict[str, list[_Pending]] = {}
        waiting: set[str] = set()
        later: list[_Pending] = []
        for item in self._queue:
            key, argv, deadline, future = item
            if deadline <= now:
                _fail([future], QueueTimeout())
                continue
            run = runs.get(key)
            if key in waiting:
                later.append(item)
            elif run is None and len(runs) < MAX_BATCH:
                runs[key] = [item]
            elif run is not None and len(run) < MAX_RUN and _same_call(run[0][1], argv):
                run.append(item)
            else:
                waiting.add(key)
                later.append(item)
        self._queue = later
        return [
            (key, encode_run([item[1] for item in run]), min(item[2] for item in run),
             [item[3] for item in run])
            for key, run in runs.items()
        ]

    async def _send(self, batch: list[_Run]) -> list[Any]:
        if not self._loaded:  # load once up front rather than learn it from a burst of NOSCRIPTs
            await self._client.script_load(script_source())
            self._loaded = True
        replies = await self._pipeline(batch)
        missing = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
        if missing:  # a flushed or new server: load the script, send those checks again
            await self._client.script_load(script_source())
            again = await self._pipeline([batch[i] for i in missing])
            for index, reply in zip(missing, again, strict=True):
                replies[index] = reply
        return replies

    async def _pipeline(self, batch: list[_Run]) -> list[Any]:
        if self._direct:
            return await self._on_connection(batch)
        sha = script_sha()
        if self._cluster:  # redis-py's cluster pipeline refuses EVALSHA: one call per check,
            replies: list[Any] = []  # a bounded number at a time (the client's pools are bounded)
            for start in range(0, len(batch), CLUSTER_CONCURRENCY):
                replies.extend(await asyncio.gather(
                    *(self._client.evalsha(sha, 1, key, *argv)
                      for key, argv, *_ in batch[start:start + CLUSTER_CONCURRENCY]),
                    return_exceptions=True,
                ))
            return replies
        pipe = self._client.pipeline(transaction=False)
        for key, argv, *_ in batch:
            pipe.evalsha(sha, 1, key, *argv)
        return list(await pipe.execute(raise_on_error=False))

    async def _on_connection(self, batch: list[_Run]) -> list[Any]:
        """Write the batch in one send on one pooled connection; read every reply.

        A connection error or timeout is retried once on a fresh connection,
        as the client's `Retry(NoBackoff(), 1)` would: safe, because each check
        carries a call id and a replayed check is not counted twice.
        """
        pool = self._client.connection_pool
        connection = await pool.get_connection()
        packed = [resp_evalsha(key, argv) for key, argv, *_ in batch]
        try:
            for attempt in (1, 2):
                try:
                    await connection.send_packed_command(packed)
                    replies: list[Any] = []
                    for _ in batch:
                        try:
                            # No per-read timer: the batch's deadline bounds every read.
                            replies.append(await connection.read_response(timeout=math.inf))
                        except redis.exceptions.ResponseError as error:
                            replies.append(error)
                    return replies
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                    await connection.disconnect()
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")  # pragma: no cover  # noqa: TRY301
        except BaseException:
            # Cancelled (the batch's deadline) or failed half-way: never hand a
            # connection with unread replies back to the pool.
            await connection.disconnect(nowait=True)
            raise
        finally:
            await pool.release(connection)


def _same_call(first: tuple[Any, ...], argv: tuple[Any, ...]) -> bool:
    """Whether `argv` can join the run that starts with `first`: the same call, limit, ttl and window."""
    return bool(first[0][:CALL_HEAD] == argv[0][:CALL_HEAD] and first[1:] == argv[1:])


def _fail(futures: list[asyncio.Future[Any]], error: BaseException) -> None:
    for future in futures:
        if not future.done():
            future.set_exception(error)


class AsyncDistributedBrake(DistributedBase):
    """The loop brake for asyncio code; `check` is a coroutine."""

    def __init__(
        self, client: Any, *, settings: BrakeSettings | None = None, url: str | None = None,
        **options: Unpack[BrakeOptions],
    ) -> None:
        super().__init__(client, settings=settings, url=url, **options)
        self._coalescer = _Coalescer(client, self.settings.timeout_seconds)
        self._loop: asyncio.AbstractEventLoop | None = None

    @staticmethod
    def connect(url: ParsedURL, timeout: float) -> Any:
        """The client `from_url` builds for this brake."""
        return async_client(url, timeout)

    async def check(
        self,
        tool: str,
        args: Any,
        *,
        session_id: object = None,
        call_id: object = None,
        context: object = None,
    ) -> Verdict:
        """Count this call in Redis; raise `LoopBrakeError` if it is the Nth identical in a row."""
        call = self.prepare(tool, args, session_id, call_id, context)
        if isinstance(call, Verdict):
            return call
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._bind(loop)
        ticket = self.failures.health.attempt()
        if ticket == NO_TRY:
            return self.without_redis(call, None)
        key, argv = self.encode(call)
        try:
            reply = await self._coalescer.call(key, argv, loop.time() + self.settings.timeout_seconds)
        except QueueTimeout as error:  # queued behind the brake's own work: not Redis's failure
            self.failures.health.abandoned(ticket)
            return self.failures.decide(call, error)
        except BACKEND_ERRORS as error:
            return self.without_redis(call, error, ticket)
        except BaseException:  # cancelled by the host: a probe must not stay claimed forever
            self.failures.health.abandoned(ticket)
            raise
        return self.verdict(call, reply, ticket)

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._loop is not None and not self._loop.is_closed():
            raise RuntimeError(
                "this AsyncDistributedBrake is in use on another event loop; its Redis "
                "connections belong to that loop. Build one brake per event loop, or use "
                "DistributedBrake from code that starts a new loop per call (asyncio.run, run_sync)"
            )
        if self._loop is not None:
            # The old loop is closed: its connections are dead; start afresh on this one.
            reset = getattr(getattr(self.client, "connection_pool", None), "reset", None)
            if callable(reset):
                reset()
            self._coalescer = _Coalescer(self.client, self.settings.timeout_seconds)
        self._loop = loop

    # -- operations -------------------------------------------------------------------

    async def inspect(self, session_id: str) -> SessionState | None:
        """The session's record, or None when it has none (never seen, cleared or expired)."""
        pipe = self.queue_state_reads(self.client.pipeline(transaction=False), [self.key(session_id)])
        states = self.decode_states(await pipe.execute(), await self.client.time(), None)
        return states[0] if states else None

    async def clear(self, session_id: str) -> bool:
        """Forget the session's streak; True when there was one."""
        return bool(await self.client.delete(self.key(session_id)))

    async def _key_batches(self) -> AsyncIterator[list[Any]]:
        batch: list[Any] = []
        async for key in self.client.scan_iter(match=self.key_pattern, count=SCAN_BATCH):
            batch.append(key)
            if len(batch) >= SCAN_BATCH:
                yield batch
                batch = []
        if batch:
            yield batch

    async def sessions(self, match: str | None = None) -> AsyncIterator[SessionState]:
        """Every session under this prefix, filtered by a glob on the session id (SCAN, never KEYS)."""
        async for keys in self._key_batches():
            pipe = self.queue_state_reads(self.client.pipeline(transaction=False), keys)
            replies = await pipe.execute(raise_on_error=False)
            for state in self.decode_states(replies, await self.client.time(), match):
                yield state

    async def clear_all(self) -> int:
        """Forget every session under this prefix (and nothing else); returns how many."""
        cleared = 0
        for batch in [batch async for batch in self._key_batches()]:
            reads = self.queue_state_reads(self.client.pipeline(transaction=False), batch)
            keys = self.records_among(batch, await reads.execute(raise_on_error=False))
            if keys:
                pipe = self.queue_deletes(self.client.pipeline(transaction=False), keys)
                cleared += sum(int(n) for n in await pipe.execute())
        return cleared

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def aclose(self) -> None:
        close = getattr(self.client, "aclose", None) or getattr(self.client, "close", None)
        if callable(close):
            await close()
        # A Sentinel-managed master: its pool asks the sentinels through clients of their own.
        manager = getattr(getattr(self.client, "connection_pool", None), "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            await sentinel.aclose()

    async def __aenter__(self) -> AsyncDistributedBrake:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
