"""`AsyncDistributedBrake`: the asyncio Redis brake. It only sends and receives.

Concurrent checks are coalesced into pipelines by its batcher (`batcher.py`,
the Cluster path in `aio_cluster.py`); this module is the brake's I/O shell:
the check, the observation, the event loop it is bound to, the operations.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any, Unpack

import redis.asyncio.cluster
import redis.exceptions

from ..core import SessionState, Verdict
from ..errors import BrakeUnavailableError, EventLoopError, LoopBrakeError
from ..killswitch import AsyncReader, Stop
from ..model import Halt
from ..operator import AsyncOperatorMixin, KillState, ttl_ms
from ..policy import NO_TRY
from ..redis_errors import REDIS_FAILURES
from ..settings import BrakeOptions, BrakeSettings
from ..urls import ParsedURL
from .base import DistributedBase
from .batcher import Batcher, QueueTimeout
from .connect import async_client

__all__ = ["AsyncDistributedBrake"]

logger = logging.getLogger("distbrake")

SCAN_BATCH = 500


class AsyncDistributedBrake(AsyncOperatorMixin, DistributedBase):
    """The loop brake for asyncio code; `check` is a coroutine."""

    asynchronous = True
    switch: AsyncReader

    def __init__(
        self, client: Any, *, settings: BrakeSettings | None = None, url: str | None = None,
        **options: Unpack[BrakeOptions],
    ) -> None:
        super().__init__(client, settings=settings, url=url, **options)
        self._batcher = self._new_batcher()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_end: Any = None  # closes the connections when `_loop` ends (see `_bind`)
        self.switch = AsyncReader("redis", self._read_kill)  # the kill switch, read by a task of the loop

    def _new_batcher(self) -> Batcher:
        """The batcher of the brake's current client (a new one for each event loop, see `_bind`)."""
        own = self.built_from is not None
        return Batcher(self.client, self.settings.timeout_seconds, self.script, own=own,
                       count_late=self.settings.on_backend_error != "closed")

    @staticmethod
    def connect(url: ParsedURL, timeout: float) -> Any:
        """The client `from_url` builds for this brake (a brake owns it: a new loop gets a new one)."""
        return async_client(url, timeout)

    def own_client(self, url: ParsedURL, timeout: float) -> None:
        """The brake built its client from `url` (`from_url`): it owns it, and gives each new event loop a
        fresh one (see `_bind`); its batcher keeps connections of its own."""
        super().own_client(url, timeout)
        self._batcher = self._new_batcher()

    async def check(
        self,
        tool: str,
        args: Any,
        *,
        session_id: object = None,
        call_id: object = None,
        context: object = None,
    ) -> Verdict:
        """Count this call in Redis; raise `LoopBrakeError` if it is the Nth identical in a row.

        One coroutine per queued check, the whole way to the reply (the watch's
        steps are plain calls; the batcher hands back the check's future): under
        a load of thousands of checks at once, each object a check keeps alive
        costs the garbage collector. (A check sent alone, with nothing else
        queued, goes from its own task: a second coroutine, no sender's.)
        """
        watch = self.watch
        start = 0.0 if watch is None else watch.start()
        try:
            call = self.prepare(tool, args, session_id, call_id, context)
            if self.switch.pending is not None:
                if self._loop is not asyncio.get_running_loop():
                    self._bind(asyncio.get_running_loop())
                self.switch.consult(call)
            if isinstance(call, Verdict):
                verdict = call
            else:
                loop = asyncio.get_running_loop()
                if self._loop is not loop:
                    self._bind(loop)
                key, argv, packed = self.encode(call)  # before a probe may be claimed (see the sync brake)
                ticket = self.failures.breaker.attempt()
                if ticket == NO_TRY:
                    verdict = self.without_redis(call, None)
                else:
                    try:
                        reply = await self._batcher.call(
                            key, argv, packed, loop.time() + self.settings.timeout_seconds)
                    except QueueTimeout as error:  # queued behind the brake's own work: not Redis's failure
                        self.failures.breaker.abandoned(ticket)
                        verdict = self.failures.decide(call, error, own_delay=True)
                    except REDIS_FAILURES as error:
                        verdict = self.without_redis(call, error, ticket)
                    except BaseException:  # cancelled by the host: a probe must not stay claimed forever
                        self.failures.breaker.abandoned(ticket)
                        raise
                    else:
                        verdict = self.verdict(call, reply, ticket)
        except (LoopBrakeError, BrakeUnavailableError) as error:
            if watch is not None:
                watch.raised(error, start, call_id, context)
            raise
        if watch is not None:
            watch.done(verdict, start, call_id, context)
        return verdict

    async def observe(self, verdict: Verdict, result: object, failed: bool | None = None) -> None:
        """After the tool ran: its result (or raised exception), for a progress-aware tool's streak and a
        tool's failures in a row (max_failures). `failed`: the call failed (default: `result` is an
        exception; an MCP result with isError, or a framework's tool error, is a failure too: pass True).

        One more round trip for each, for those tools only; a no-op otherwise.
        """
        for key, argv, packed in self.observations(verdict, result, failed):
            try:
                await self._send(key, argv, packed)
            except QueueTimeout as error:
                self.observation_failed(error)
            except REDIS_FAILURES as error:
                self.observation_failed(error)

    async def _send(self, key: str, argv: tuple[bytes | int, ...], packed: bytes) -> Any:
        """One EVALSHA of the script through the batcher (binding the brake to the running loop first)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # the first call on a new loop: its own connections and timer
            self._bind(loop)
        return await self._batcher.call(key, argv, packed, loop.time() + self.settings.timeout_seconds)

    async def block_key(self, key: str, halt: Halt, ttl_ms: int, session_id: str | None = None) -> None:
        """Halt the session whose record is `key` (see `DistributedBrake.block_key`)."""
        await self._send(*self.block_request(key, halt, ttl_ms, session_id))

    async def unblock_key(self, key: str) -> bool:
        """Lift the halt of the session whose record is `key` (the record is deleted); False: not halted."""
        return bool(await self._send(*self.unblock_request(key)))

    def _bind(self, loop: asyncio.AbstractEventLoop, *, forgiving: bool = False) -> bool:
        """Make `loop` (the running one) the loop the brake's connections belong to.

        A brake moves to a new loop by itself once its old loop is closed (a
        script or a test calling `asyncio.run` again and again): a client the
        brake built is replaced by a fresh one, a caller's client has its
        pools emptied; the old loop's connections are dropped, never awaited
        (a closed loop cannot close them). `asyncio.run` closes them itself
        while its loop still runs (see `_close_at_loop_end`), so they are
        normally closed already. `EventLoopError` when the brake cannot move:
        its loop is still open (it may run again, and its connections with
        it), or a Redis Cluster client the caller built still holds a closed
        loop's connections (with `forgiving`, the caller drops those
        asynchronously instead: True is returned and it awaits
        `_drop_cluster_connections`).
        """
        old = self._loop
        if old is loop:
            return False
        if old is not None and not old.is_closed():
            where = "which is running (in another thread)" if old.is_running() else "which is still open"
            raise EventLoopError(
                f"this AsyncDistributedBrake is in use on another event loop, {where}; its Redis "
                "connections belong to that loop. Close that loop first (asyncio.run and "
                "asyncio.Runner close theirs; by hand: loop.run_until_complete(loop.shutdown_asyncgens()), "
                "then loop.close()), or build one brake per event loop (DistributedBrake serves threads)"
            )
        drop_nodes = False
        built = self.built_from
        if built is not None and self._loop_end is not None:
            # A client of our own was used on an earlier loop: a fresh one for this loop, so
            # nothing of the old loop (connections, locks, a cluster's nodes) comes along.
            self.client = self.connect(*built)
        elif old is not None:
            pool = getattr(self.client, "connection_pool", None)
            manager = getattr(pool, "sentinel_manager", None)
            for each in (pool, *(getattr(s, "connection_pool", None) for s in getattr(manager, "sentinels", ()))):
                reset = getattr(each, "reset", None)
                if callable(reset):
                    reset()  # forget the old loop's connections: the next command opens new ones
            if isinstance(self.client, redis.asyncio.cluster.RedisCluster):
                if not forgiving:
                    raise EventLoopError(
                        "this AsyncDistributedBrake's Redis Cluster client still holds connections of an "
                        "earlier event loop, closed without loop.shutdown_asyncgens(); "
                        "they cannot be used from this loop. End each loop with asyncio.run or "
                        "asyncio.Runner (they close the brake's connections), await brake.aclose() "
                        "before leaving a loop, or build the brake with AsyncDistributedBrake.from_url, "
                        "which makes a fresh client for each loop"
                    )
                drop_nodes = True
        self._batcher = self._new_batcher()
        self._loop = loop
        self.switch.moved()  # its reader was a task of the old loop
        self._close_at_loop_end(loop)
        return drop_nodes

    def _close_at_loop_end(self, loop: asyncio.AbstractEventLoop) -> None:
        """Close the brake's connections when `loop` ends, while it still runs.

        `asyncio.run` (and `asyncio.Runner`) end a loop by closing the async
        generators still open on it (`loop.shutdown_asyncgens`) before closing
        the loop. The brake keeps one such generator per loop it is bound to:
        started here, inside the loop (which registers it there), it waits at
        its `yield`, and its `finally` closes the brake's connections. A loop
        closed without that step leaves them to be dropped by `_bind`.
        """
        async def at_end() -> AsyncIterator[None]:
            try:
                yield
            finally:
                if self._loop is loop:  # still this loop's brake
                    self._loop = None
                    try:
                        await self._close_connections()
                    except Exception as error:  # closing at the loop's end is best effort
                        logger.debug("distbrake: closing connections at the loop's end failed (%s)",
                                     type(error).__name__)

        self._loop_end = at_end()
        step = self._loop_end.asend(None)  # the first step, run now: it registers with the loop
        try:
            step.send(None)
        except StopIteration:
            pass

    async def _enter(self) -> None:
        """What every operation does first: bind to the running loop (moving from an ended one)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop and self._bind(loop, forgiving=True):
            await self._drop_cluster_connections()

    async def _drop_cluster_connections(self) -> None:
        """Drop a caller's cluster client's connections of an earlier loop (never raises on them)."""
        manager = getattr(self.client, "nodes_manager", None)
        # Both maps: a startup node and the node of the same name in the cache may be two objects.
        nodes = {id(node): node for name in ("startup_nodes", "nodes_cache")
                 for node in getattr(manager, name, {}).values()}
        for node in nodes.values():
            # Each of its connections is forgotten even when closing it fails (the loop is gone).
            with contextlib.suppress(RuntimeError, OSError, redis.exceptions.RedisError):
                await node.disconnect()

    async def _close_connections(self) -> None:
        try:
            await self._batcher.aclose()
        finally:
            await self._close_client()

    async def _close_client(self) -> None:
        close = getattr(self.client, "aclose", None) or getattr(self.client, "close", None)
        if callable(close):
            await close()
        # A Sentinel-managed master: its pool asks the sentinels through clients of their own.
        manager = getattr(getattr(self.client, "connection_pool", None), "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            await sentinel.aclose()

    # -- operations -------------------------------------------------------------------

    async def inspect(self, session_id: str) -> SessionState | None:
        """The session's record, or None when it has none (never seen, cleared or expired)."""
        await self._enter()
        pipe = self.queue_state_reads(self.client.pipeline(transaction=False), [self.key(session_id)])
        states = self.decode_states(await pipe.execute(), await self.client.time(), None)
        return states[0] if states else None

    async def clear(self, session_id: str) -> bool:
        """Forget the session's streak; True when there was one."""
        await self._enter()
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
        async for _, state in self._scan(match):
            yield state

    async def _scan(self, match: str | None) -> AsyncIterator[tuple[str, SessionState]]:
        """Every session under this prefix with its key, filtered by a glob on the session id."""
        await self._enter()
        async for keys in self._key_batches():
            pipe = self.queue_state_reads(self.client.pipeline(transaction=False), keys)
            replies = await pipe.execute(raise_on_error=False)
            for found in self.keyed_states(keys, replies, await self.client.time(), match):
                yield found

    async def clear_all(self) -> int:
        """Forget every session under this prefix (and nothing else); returns how many."""
        await self._enter()
        cleared = 0
        for batch in [batch async for batch in self._key_batches()]:
            reads = self.queue_state_reads(self.client.pipeline(transaction=False), batch)
            keys = self.records_among(batch, await reads.execute(raise_on_error=False))
            if keys:
                pipe = self.queue_deletes(self.client.pipeline(transaction=False), keys)
                cleared += sum(int(n) for n in await pipe.execute())
        return cleared

    async def ping(self) -> bool:
        await self._enter()
        return bool(await self.client.ping())

    # -- the operator's stop (operator.py): a session's target is its key ------------------------------------

    def _target(self, session_id: str) -> str:
        return self.key(session_id)

    async def _matching(self, match: str, halted: bool) -> AsyncIterator[str]:
        async for key, state in self._scan(match):
            if state.halted or not halted:
                yield key

    async def _block_one(self, key: str, session_id: str | None, halt: Halt, ttl: float | None) -> bool:
        await self.block_key(key, halt, 0 if ttl is None else ttl_ms(ttl), session_id)
        return True

    async def _unblock_one(self, key: str) -> bool:
        return await self.unblock_key(key)

    async def _clear_one(self, key: str) -> bool:
        return bool(await self.client.delete(key))

    async def _read_kill(self) -> Stop | None:
        return self.kill_read(await self.queue_kill_read(self.client.pipeline(transaction=False)).execute())

    async def kill_switch(self) -> KillState | None:
        """The fleet's kill switch (`block_all`) as Redis has it now, or None when it is not set."""
        await self._enter()
        return self.kill_state(await self._read_kill())

    async def _set_kill(self, halt: Halt, ttl: float | None) -> None:
        await self._enter()
        key, value, px = self.kill_write(halt, ttl)
        await self.client.set(key, value, px=px)

    async def _clear_kill(self) -> bool:
        await self._enter()
        self.switch.set(None)
        return bool(await self.client.delete(self.kill_key))

    async def aclose(self) -> None:
        """Close every connection the brake opened, the sentinels' included (a brake from a URL owns its client).

        From a loop other than the one the connections belong to (an earlier
        `asyncio.run`), those connections cannot be closed: they are dropped,
        and this does not fail on them. The fleet view's counters noted so far are written first
        (waiting at most two seconds).
        """
        await self._enter()
        await self.switch.aclose(2 * self.settings.timeout_seconds)  # a read's connect and reply, at most
        if self.watch is not None:
            await self.watch.aflush()
        await self._close_connections()

    async def __aenter__(self) -> AsyncDistributedBrake:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
