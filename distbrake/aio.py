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
from collections.abc import AsyncIterator
from typing import Any

import redis.exceptions

from .base import SessionState, Verdict
from .connect import async_client
from .distributed import BACKEND_ERRORS, DistributedBase
from .settings import BrakeSettings, FailurePolicy
from .slot import script_source

__all__ = ["AsyncDistributedBrake"]

SCAN_BATCH = 500
MAX_BATCH = 1024

_Pending = tuple[str, tuple[Any, ...], "asyncio.Future[Any]"]


class _Coalescer:
    """Sends queued script calls as pipelines, one pipeline in flight at a time."""

    def __init__(self, client: Any, source: str) -> None:
        self._client = client
        self._source = source
        self._sha: str | None = None
        self._queue: list[_Pending] = []
        self._sender: asyncio.Task[None] | None = None

    async def call(self, key: str, argv: tuple[Any, ...]) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append((key, argv, future))
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_all())
        return await asyncio.shield(future)

    async def _sha1(self) -> str:
        if self._sha is None:
            self._sha = await self._client.script_load(self._source)
        return self._sha

    async def _send_all(self) -> None:
        await asyncio.sleep(0)  # let the checks started in this tick join the first batch
        while self._queue:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            try:
                replies = await self._send(batch)
            except BaseException as error:
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                if isinstance(error, asyncio.CancelledError):
                    raise
                continue
            for (_, _, future), reply in zip(batch, replies, strict=True):
                if future.done():
                    continue
                if isinstance(reply, BaseException):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)

    async def _send(self, batch: list[_Pending]) -> list[Any]:
        sha = await self._sha1()
        replies = await self._pipeline(sha, batch)
        missing = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
        if missing:
            self._sha = None
            sha = await self._sha1()
            again = await self._pipeline(sha, [batch[i] for i in missing])
            for index, reply in zip(missing, again, strict=True):
                replies[index] = reply
        return replies

    async def _pipeline(self, sha: str, batch: list[_Pending]) -> list[Any]:
        if len(batch) == 1:
            key, argv, _ = batch[0]
            try:
                return [await self._client.evalsha(sha, 1, key, *argv)]
            except redis.exceptions.NoScriptError as error:
                return [error]
        pipe = self._client.pipeline(transaction=False)
        for key, argv, _ in batch:
            pipe.evalsha(sha, 1, key, *argv)
        return list(await pipe.execute(raise_on_error=False))


class AsyncDistributedBrake(DistributedBase):
    """The loop brake for asyncio code; `check` is a coroutine."""

    def __init__(self, client: Any, **options: Any) -> None:
        super().__init__(client, **options)
        self._coalescer = _Coalescer(client, script_source())
        self._loop: asyncio.AbstractEventLoop | None = None

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
    ) -> AsyncDistributedBrake:
        """A brake on `url` (else `DISTBRAKE_URL`, else `memory://`); no I/O until the first check."""
        resolved = cls.settings_for_url(
            url, settings, max_repeats=max_repeats, ttl_seconds=ttl_seconds,
            key_prefix=key_prefix, on_backend_error=on_backend_error,
            timeout_seconds=timeout_seconds, tool_max_repeats=tool_max_repeats,
            exempt_tools=exempt_tools,
        )
        client = async_client(resolved.url or "memory://", resolved.timeout_seconds)
        return cls(client, settings=resolved)

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
        if not self.failures.health.may_try():
            return self.without_redis(call, None)
        key, argv = self.encode(call)
        try:
            async with asyncio.timeout(self.settings.timeout_seconds):
                reply = await self._coalescer.call(key, argv)
        except BACKEND_ERRORS as error:
            return self.without_redis(call, error)
        return self.verdict(call, reply)

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
            self._coalescer = _Coalescer(self.client, script_source())
        self._loop = loop

    # -- operations -------------------------------------------------------------------

    async def inspect(self, session_id: str) -> SessionState | None:
        """The session's slot, or None when it has none (never seen, cleared or expired)."""
        pipe = self.queue_state_reads(self.client.pipeline(transaction=False), [self.key(session_id)])
        states = self.decode_states(await pipe.execute(), None)
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
            for state in self.decode_states(await pipe.execute(), match):
                yield state

    async def clear_all(self) -> int:
        """Forget every session under this prefix (and nothing else); returns how many."""
        cleared = 0
        for keys in [batch async for batch in self._key_batches()]:
            pipe = self.queue_deletes(self.client.pipeline(transaction=False), keys)
            cleared += sum(int(n) for n in await pipe.execute())
        return cleared

    async def ping(self) -> bool:
        return bool(await self.client.ping())

    async def aclose(self) -> None:
        close = getattr(self.client, "aclose", None) or getattr(self.client, "close", None)
        if callable(close):
            await close()

    async def __aenter__(self) -> AsyncDistributedBrake:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
