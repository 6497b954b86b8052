"""`AsyncDistributedBrake`: the asyncio Redis brake. It only sends and receives.

Concurrent checks are coalesced: while a pipeline of EVALSHAs is on the
wire, new checks queue, and all that queued go out together in the next
pipeline (on a single node or a Cluster, two lanes take turns, so Redis runs
one pipeline while the event loop prepares the other). Two connections carry a burst
of thousands of checks (no "too many connections"), and throughput at high
concurrency is several times that of one round trip per check. A NOSCRIPT reply (flushed script cache,
restarted or failed-over server) loads the script and sends those checks
again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Unpack

import redis.asyncio.cluster
import redis.exceptions
from redis.crc import key_slot

from ..core import SessionState, Verdict
from ..errors import BrakeUnavailableError, EventLoopError, LoopBrakeError
from ..policy import NO_TRY
from ..settings import BrakeOptions, BrakeSettings
from ..urls import ParsedURL
from .base import BACKEND_ERRORS, DistributedBase
from .batch import read_replies, write_all
from .connect import async_client
from .deadline import LazyDeadline
from .topology import (
    INTERNAL_ERRORS,
    arefresh_topology,
    is_topology_error,
    retry_after,
    topology_error,
)
from .wire import CALL_HEAD, encode_run, resp_evalsha, run_replies, script_sha, script_source

__all__ = ["AsyncDistributedBrake"]

logger = logging.getLogger("distbrake")

SCAN_BATCH = 500
MAX_BATCH = 1024
CLUSTER_CONCURRENCY = 32

MAX_RUN = 256  # identical checks of one session sent as one script call, at most
LANES = 2  # batches on the wire at once on the direct path with connections of its own, one per connection
SPLIT = 16  # a queue this long is shared by two lanes: Python prepares one batch while Redis runs the other
_IDLE, _STARTING, _SENDING = 0, 1, 2  # a lane's state
CHECK_ARGS = 6  # the ARGV of a check; an observation has one more (see lua/brake.lua)

# (key, argv, the check's deadline on the loop clock, its future, its packed EVALSHA)
_Pending = tuple[str, tuple[Any, ...], float, "asyncio.Future[Any]", bytes]
# What goes on the wire: (key, argv of the run, the run's earliest deadline, the run's futures, the packed
# EVALSHA of the run). A run of one check is its `_Pending` itself, with its one future (no object more
# per check on the wire).
_Run = tuple[str, tuple[Any, ...], float, "asyncio.Future[Any] | list[asyncio.Future[Any]]", bytes]

# The clients `AsyncDistributedBrake.connect` built, with what it built them from: a brake owns
# such a client, and gives each new event loop a fresh one (see `AsyncDistributedBrake._bind`).
_BUILT: weakref.WeakKeyDictionary[Any, tuple[ParsedURL, float]] = weakref.WeakKeyDictionary()


class QueueTimeout(Exception):
    """A check spent its time waiting behind the brake's own earlier batches, not on Redis."""


class _Coalescer:
    """Sends queued checks as pipelines, one pipeline in flight at a time on each of its lanes.

    Each check carries its deadline; a pipeline may take until the earliest
    deadline of its batch, so no check waits longer than its own timeout
    (one timer per pipeline, not one per check). Identical checks of one
    session that queue together go as one run (one script call, see
    lua/brake.lua), so a burst of one session takes one round trip. Time a
    check spends queued behind earlier batches is not Redis's: a check whose
    time ran out before it was sent, or whose batch was on the wire for less
    than half a timeout, fails with `QueueTimeout`, which the brake decides by
    its policy without marking Redis down.

    The direct path with connections of its own, and a Cluster (a connection
    per master per batch), have two lanes, each with at most one batch on the wire: a queue of at least SPLIT
    checks is shared by both, so Redis runs one batch while the event loop
    prepares the next (on two cores, they overlap). A session has at most one
    run on the wire at a time, so its checks keep their order on any lane.
    Other paths have one lane.
    """

    def __init__(
        self, client: Any, timeout: float, script_loaded: Callable[[], None] = lambda: None, *, own: bool = False,
    ) -> None:
        self._client = client
        self._timeout = timeout
        self._script_loaded = script_loaded  # told of each load after a NOSCRIPT (telemetry)
        # A plain redis.asyncio client (single node, or a Sentinel-managed master)
        # gets its batches, packed once, written straight to one pooled
        # connection; Cluster and the embedded backend use the client's pipeline.
        self._direct = (
            type(client) is redis.asyncio.Redis
            and type(client.connection_pool) in (redis.asyncio.ConnectionPool, redis.asyncio.BlockingConnectionPool)
        )
        self._cluster = isinstance(client, redis.asyncio.cluster.RedisCluster)
        # `own`: a client the brake built (`from_url`) on a plain pool. Its direct path keeps one connection
        # of its own (made from the pool's settings, outside its count): one batch is on the wire at a
        # time, so one connection carries them all, and no batch pays the pool's acquire and release.
        # A pool that limits connections (`?max_connections=N`), and a caller's client (its pool may
        # re-authenticate, cap or drop its connections), are asked for one per batch instead.
        self._owns = own and self._direct and type(client.connection_pool) is redis.asyncio.ConnectionPool
        lanes = LANES if self._owns or self._cluster else 1  # a Cluster: per-node pools, a connection per batch
        self._owned: list[Any] = [None] * lanes  # each lane's connection (the direct path's own)
        self._senders: list[asyncio.Task[None] | None] = [None] * lanes
        self._states = [_IDLE] * lanes
        self._on_wire: set[str] = set()  # the keys of the runs on the wire
        self._refreshing = asyncio.Lock()  # held while a Cluster's slot map is read again
        self._deadline = LazyDeadline()
        self._queue: list[_Pending] = []
        # The direct path learns of a missing script from NOSCRIPT; so does the cluster path (per node).
        self._loaded = self._direct or self._cluster
        # Whether the last batch held one check (one task checking at a time): then the next check,
        # with nothing else queued or on the wire, is sent by its own task (`_alone`), not a sender's.
        self._one_at_a_time = True
        self._inline: asyncio.Future[None] | None = None  # done when the check sent so is answered

    def call(self, key: str, argv: tuple[Any, ...], packed: bytes, deadline: float) -> Awaitable[Any]:
        """The reply to one check (`packed`: its EVALSHA), to be awaited: its future, or, when it is the only
        check, the coroutine that sends it from the caller's task (`_alone`)."""
        if self._one_at_a_time and self._inline is None and not self._queue and max(self._states) == _IDLE:
            return self._alone(key, argv, packed, deadline)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        queue = self._queue
        queue.append((key, argv, deadline, future, packed))
        states = self._states
        # A lane starts when none is at work (else one that is takes this check when it is done),
        # and another once the queue is long enough to share.
        if max(states) == _IDLE or (len(queue) >= SPLIT and _IDLE in states):
            lane = states.index(_IDLE)
            states[lane] = _STARTING
            self._senders[lane] = asyncio.create_task(self._send_all(lane))
        return future

    async def _alone(self, key: str, argv: tuple[Any, ...], packed: bytes, deadline: float) -> Any:
        """Send one check from the caller's task, a batch of its own (no sender task, no extra loop turn).

        Checks that come meanwhile queue; their sender waits for this one, so
        one batch is on the wire at a time, and a session's checks keep their order.
        """
        self._inline = asyncio.get_running_loop().create_future()
        try:
            with self._deadline.bound(deadline):
                reply = (await self._send([(key, argv, deadline, [], packed)], 0))[0]
        finally:
            self._inline.set_result(None)
            self._inline = None
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def _send_all(self, lane: int) -> None:
        try:
            await self._send_lane(lane)
        finally:
            self._states[lane] = _IDLE

    async def _send_lane(self, lane: int) -> None:
        await asyncio.sleep(0)  # let the checks started in this tick join the first batch
        while self._inline is not None:  # a check sent alone is on the wire: one batch at a time
            await asyncio.shield(self._inline)
        loop = asyncio.get_running_loop()
        states, on_wire = self._states, self._on_wire
        while self._queue:
            # Another lane about to start shares the queue: this one takes half of it.
            shared = any(state == _STARTING for other, state in enumerate(states) if other != lane)
            batch = self._next_batch(loop.time(), min(MAX_BATCH, -(-len(self._queue) // 2)) if shared else MAX_BATCH)
            if not batch:
                if self._queue and on_wire:
                    break  # what is left waits for its session's run on another lane; that lane takes it
                continue
            self._one_at_a_time = len(batch) == 1 and not isinstance(batch[0][3], list)
            keys = [run[0] for run in batch]
            on_wire.update(keys)
            states[lane] = _SENDING
            sent_at = loop.time()
            try:
                with self._deadline.bound(min(run[2] for run in batch)):
                    replies = await self._send(batch, lane)
            except BaseException as error:
                failure: BaseException = error
                if isinstance(error, TimeoutError) and loop.time() - sent_at < self._timeout / 2:
                    failure = QueueTimeout()  # the batch never had a fair share of the timeout
                for run in batch:
                    _fail(run[3], failure)
                if isinstance(error, asyncio.CancelledError):
                    raise
                continue
            finally:
                on_wire.difference_update(keys)
                states[lane] = _STARTING
            for run, reply in zip(batch, replies, strict=True):
                futures = run[3]
                if isinstance(reply, BaseException):
                    _fail(futures, reply)
                elif not isinstance(futures, list):  # the common case: a run of one
                    if not futures.done():
                        futures.set_result(reply)
                else:
                    for future, one in zip(futures, run_replies(reply, len(futures)), strict=True):
                        if not future.done():
                            future.set_result(one)

    def _next_batch(self, now: float, limit: int = MAX_BATCH) -> list[_Run]:
        """Up to `limit` runs, at most one per key, none of a key on the wire; the other checks wait.

        A run is a check and the identical checks of its session queued right
        after it (same call hash, limit and ttl). A batch whose reply is lost
        is sent again (the retry): the script recognises a resent run by its
        last call id, which is the last of its session; so a key never has two
        runs in one batch, and a session's checks are never reordered (once
        one waits, every later check of that session waits too). A check whose
        deadline passed while it queued is not sent (`QueueTimeout`).
        """
        runs: dict[str, _Pending | list[_Pending]] = {}  # a run of one is its check (the common case)
        waiting: set[str] = set(self._on_wire)
        later: list[_Pending] = []
        for item in self._queue:
            key, argv, deadline, future, _ = item
            if deadline <= now:
                _fail(future, QueueTimeout())
                continue
            if key not in waiting:
                run = runs.get(key)
                if run is None:
                    if len(runs) < limit:
                        runs[key] = item
                        continue
                elif isinstance(run, list):
                    if len(run) < MAX_RUN and _same_call(run[0][1], argv):
                        run.append(item)
                        continue
                elif _same_call(run[1], argv):
                    runs[key] = [run, item]
                    continue
                waiting.add(key)  # once one check of a session waits, every later one does
            later.append(item)
        self._queue = later
        return [run if not isinstance(run, list) else _joined(key, run) for key, run in runs.items()]

    async def _send(self, batch: list[_Run], lane: int) -> list[Any]:
        if not self._loaded:  # load once up front rather than learn it from a burst of NOSCRIPTs
            await self._client.script_load(script_source())
            self._loaded = True
        replies = await self._pipeline(batch, lane)
        missing = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
        if missing:  # a flushed or new server: load the script, send those checks again
            self._script_loaded()
            await self._client.script_load(script_source())
            again = await self._pipeline([batch[i] for i in missing], lane)
            for index, reply in zip(missing, again, strict=True):
                replies[index] = reply
        return replies

    async def _pipeline(self, batch: list[_Run], lane: int) -> list[Any]:
        if self._direct:
            return await self._on_connection(batch, lane)
        sha = script_sha()
        if self._cluster:
            return await self._on_cluster(batch, sha)
        pipe = self._client.pipeline(transaction=False)
        for key, argv, *_ in batch:
            pipe.evalsha(sha, 1, key, *argv)
        return list(await pipe.execute(raise_on_error=False))

    async def _on_cluster(self, batch: list[_Run], sha: str) -> list[Any]:
        """The cluster branch of `_pipeline`: the batch routed by slot, one packed pipeline per master.

        Each master gets its runs in one write on one of its connections (all
        masters at once), their replies read at once. A run whose master
        redirected it (MOVED, ASK, TRYAGAIN) or failed inside redis-py (a node
        gone from the slot map) is sent once more after the slot map is read
        again, the retry of `_per_key`; one answered with CLUSTERDOWN or
        NOSCRIPT, or whose master's pipeline failed otherwise (a lost
        connection), goes the whole careful way, `_per_key`.
        Safe: every run carries its call id, so a run that did reach Redis is a replay.
        """
        client = self._client
        try:
            # Learn the slot map once, up front, rather than from a burst of calls racing to it.
            await client.initialize()
        except INTERNAL_ERRORS as error:
            if is_topology_error(error):
                raise topology_error(error) from error
            raise
        groups: dict[str, tuple[Any, list[int]]] = {}
        again: list[int] = []  # not sent, or failed otherwise: the whole careful way
        retry: list[int] = []  # redirected (or the node failed inside redis-py): the retry after a refresh
        manager = client.nodes_manager
        for index, run in enumerate(batch):
            try:
                node = manager.get_node_from_slot(key_slot(run[0].encode("utf-8")))
            except _UNROUTED:
                again.append(index)
                continue
            groups.setdefault(node.name, (node, []))[1].append(index)
        replies: list[Any] = [None] * len(batch)
        results = await _on_nodes([(node, [batch[i] for i in indexes]) for node, indexes in groups.values()])
        for (_, indexes), result in zip(groups.values(), results, strict=True):
            if isinstance(result, BaseException):
                (retry if retry_after(result) else again).extend(indexes)
                continue
            for index, reply in zip(indexes, result, strict=True):
                if retry_after(reply):
                    retry.append(index)
                elif isinstance(reply, _CAREFUL):
                    again.append(index)
                else:
                    replies[index] = reply
        for indexes, sent in ((again, False), (retry, True)):
            if indexes:
                for index, reply in zip(
                    indexes, await self._per_key([batch[i] for i in indexes], sha, sent=sent), strict=True
                ):
                    replies[index] = reply
        return replies

    async def _per_key(self, batch: list[_Run], sha: str, *, sent: bool = False) -> list[Any]:
        """One EVALSHA per run through the cluster client, a bounded number at a time.

        redis-py's cluster client follows redirects itself (at most
        CLUSTER_CONCURRENCY calls at once: its pools are bounded); a NOSCRIPT
        loads the script and sends those again. While the cluster's topology
        changes (a reshard, a failover), a call redis-py's cluster client
        failed inside itself, or whose redirect it gave up on, is sent once
        more after the slot map is read again; failing again it is a
        `ClusterTopologyError`, and the failure policy decides (see `topology.py`).
        `sent`: the runs were sent once already and failed so: only the retry is left.
        """
        client = self._client

        async def calls(runs: list[_Run]) -> list[Any]:
            replies: list[Any] = []
            for start in range(0, len(runs), CLUSTER_CONCURRENCY):
                replies.extend(await asyncio.gather(
                    *(client.evalsha(sha, 1, key, *argv) for key, argv, *_ in runs[start:start + CLUSTER_CONCURRENCY]),
                    return_exceptions=True,
                ))
            return replies

        async def attempt(runs: list[_Run]) -> list[Any]:
            replies = await calls(runs)
            missing = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
            if missing:  # a new master (or a promoted replica) without the script
                self._script_loaded()
                try:
                    await client.script_load(script_source())
                except INTERNAL_ERRORS as error:
                    if is_topology_error(error):
                        raise topology_error(error) from error
                    raise
                for index, reply in zip(missing, await calls([runs[i] for i in missing]), strict=True):
                    replies[index] = reply
            return replies

        if sent:  # these were sent once already (the fast path), and failed as worth a retry: that was the first try
            replies: list[Any] = [None] * len(batch)
            again = list(range(len(batch)))
        else:
            replies = await attempt(batch)
            again = [i for i, reply in enumerate(replies) if retry_after(reply)]
        if again:
            async with self._refreshing:  # one slot-map refresh at a time (the lanes may both want one)
                await arefresh_topology(client)
            for index, reply in zip(again, await attempt([batch[i] for i in again]), strict=True):
                replies[index] = reply
                if is_topology_error(reply):
                    replies[index] = topology_error(reply)
                    replies[index].__cause__ = reply
        return replies

    async def _on_connection(self, batch: list[_Run], lane: int) -> list[Any]:
        """Write the batch in one send on the lane's connection (or a pooled one); read every reply.

        A connection error or timeout is retried once on a fresh connection,
        as the client's `Retry(NoBackoff(), 1)` would: safe, because each check
        carries a call id and a replayed check is not counted twice.
        """
        pool = self._client.connection_pool
        if self._owns:
            connection = self._owned[lane]
            if connection is None:  # connected by its first write (see `write_all`)
                connection = self._owned[lane] = pool.connection_class(**pool.connection_kwargs)
        else:
            connection = await pool.get_connection()
        packed = [run[4] for run in batch]
        try:
            for attempt in (1, 2):
                try:
                    await write_all(connection, packed)
                    return await read_replies(connection, len(batch))
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                    await connection.disconnect()
                    if attempt == 2 or (self._owns and connection is not self._owned[lane]):  # closed by `aclose`
                        raise
            raise AssertionError("unreachable")  # pragma: no cover  # noqa: TRY301
        except BaseException:
            # Cancelled (the batch's deadline) or failed half-way: never hand a
            # connection with unread replies back to the pool.
            await connection.disconnect(nowait=True)
            raise
        finally:
            if not self._owns:
                await pool.release(connection)

    async def aclose(self) -> None:
        """Close the direct path's own connections, if it has any (the next batch opens another)."""
        connections, self._owned = self._owned, [None] * len(self._owned)
        closed = await asyncio.gather(
            *(connection.disconnect() for connection in connections if connection is not None), return_exceptions=True)
        for result in closed:  # every one was closed (or tried): then the first failure, if any
            if isinstance(result, BaseException):
                raise result


# Replies (besides redirects) that send a run of the fast cluster path again through `_per_key`.
_CAREFUL = (redis.exceptions.ClusterDownError, redis.exceptions.NoScriptError)
# A key the slot map cannot place right now (a slot not covered, a map being rebuilt): `_per_key` too.
_UNROUTED: tuple[type[BaseException], ...] = (redis.exceptions.RedisClusterException, *INTERNAL_ERRORS)


async def _on_nodes(work: list[tuple[Any, list[_Run]]]) -> list[Any]:
    """Each (node, runs): the runs written in one send on one of the node's connections, every node's
    first (so all masters work at once, with no task per node), then each node's replies read.

    A node whose write or read failed has that error as its result (its connection dropped); the
    others go on. Cancelled (the batch's deadline): every connection with replies unread is dropped.
    No connection with unread replies ever goes back to its node.
    """
    taken: list[tuple[Any, Any]] = []
    results: list[Any] = [None] * len(work)
    try:
        for index, (node, runs) in enumerate(work):
            connection = node.acquire_connection()
            taken.append((node, connection))
            try:
                stale = getattr(connection, "should_reconnect", None)  # redis-py 7+
                if stale is not None and stale():  # marked by a slot-map refresh: a fresh socket, as redis-py does
                    await connection.disconnect()
                await write_all(connection, [run[4] for run in runs])
            except Exception as error:
                await connection.disconnect(nowait=True)
                results[index] = error
        for index, ((_, connection), (_, runs)) in enumerate(zip(taken, work, strict=True)):
            if results[index] is None:
                try:
                    results[index] = await read_replies(connection, len(runs))
                except Exception as error:
                    await connection.disconnect(nowait=True)
                    results[index] = error
    except BaseException:
        for index, (_, connection) in enumerate(taken):
            if not isinstance(results[index], list):
                await connection.disconnect(nowait=True)
        raise
    finally:
        for node, connection in taken:
            node.release(connection)
    return results


def _same_call(first: tuple[Any, ...], argv: tuple[Any, ...]) -> bool:
    """Whether `argv` can join the run that starts with `first`: checks (never observations) of the
    same call, limit, ttl and window."""
    return bool(
        len(argv) == CHECK_ARGS and first[0][:CALL_HEAD] == argv[0][:CALL_HEAD] and first[1:] == argv[1:]
    )


def _joined(key: str, run: list[_Pending]) -> _Run:
    """Identical checks of one session as one run (one script call, see `wire.encode_run`)."""
    argv = encode_run([item[1] for item in run])
    return key, argv, min(item[2] for item in run), [item[3] for item in run], resp_evalsha(key, argv)


def _fail(futures: asyncio.Future[Any] | list[asyncio.Future[Any]], error: BaseException) -> None:
    for future in futures if isinstance(futures, list) else (futures,):
        if not future.done():
            future.set_exception(error)


class AsyncDistributedBrake(DistributedBase):
    """The loop brake for asyncio code; `check` is a coroutine."""

    asynchronous = True

    def __init__(
        self, client: Any, *, settings: BrakeSettings | None = None, url: str | None = None,
        **options: Unpack[BrakeOptions],
    ) -> None:
        super().__init__(client, settings=settings, url=url, **options)
        self._coalescer = self._new_coalescer()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_end: Any = None  # closes the connections when `_loop` ends (see `_bind`)

    def _new_coalescer(self) -> _Coalescer:
        """The coalescer of the brake's current client (a new one for each event loop, see `_bind`)."""
        return _Coalescer(self.client, self.settings.timeout_seconds, self.recorder.script_load,
                          own=self.client in _BUILT)

    @staticmethod
    def connect(url: ParsedURL, timeout: float) -> Any:
        """The client `from_url` builds for this brake (a brake owns it: a new loop gets a new one)."""
        client = async_client(url, timeout)
        _BUILT[client] = (url, timeout)
        return client

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
        steps are plain calls; the coalescer hands back the check's future): under
        a load of thousands of checks at once, each object a check keeps alive
        costs the garbage collector. (A check sent alone, with nothing else
        queued, goes from its own task: a second coroutine, no sender's.)
        """
        watch = self.watch
        start = 0.0 if watch is None else watch.start()
        try:
            call = self.prepare(tool, args, session_id, call_id, context)
            if isinstance(call, Verdict):
                verdict = call
            else:
                loop = asyncio.get_running_loop()
                if self._loop is not loop:
                    self._bind(loop)
                key, argv, packed = self.encode(call)  # before a probe may be claimed (see the sync brake)
                ticket = self.failures.health.attempt()
                if ticket == NO_TRY:
                    verdict = self.without_redis(call, None)
                else:
                    try:
                        reply = await self._coalescer.call(
                            key, argv, packed, loop.time() + self.settings.timeout_seconds)
                    except QueueTimeout as error:  # queued behind the brake's own work: not Redis's failure
                        self.failures.health.abandoned(ticket)
                        verdict = self.failures.decide(call, error)
                    except BACKEND_ERRORS as error:
                        verdict = self.without_redis(call, error, ticket)
                    except BaseException:  # cancelled by the host: a probe must not stay claimed forever
                        self.failures.health.abandoned(ticket)
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

    async def observe(self, verdict: Verdict, result: object) -> None:
        """After the tool ran: its result (or raised exception), for a progress-aware tool's streak.

        One more round trip, for progress-aware tools only; a no-op otherwise.
        """
        observation = self.observation(verdict, result)
        if observation is None:
            return
        key, argv, packed = observation
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # the first call on a new loop: its own connections and timer
            self._bind(loop)
        try:
            await self._coalescer.call(key, argv, packed, loop.time() + self.settings.timeout_seconds)
        except QueueTimeout as error:
            self.observation_failed(error)
        except BACKEND_ERRORS as error:
            self.observation_failed(error)

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
        built = _BUILT.get(self.client)
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
        self._coalescer = self._new_coalescer()
        self._loop = loop
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
            await self._coalescer.aclose()
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
        await self._enter()
        async for keys in self._key_batches():
            pipe = self.queue_state_reads(self.client.pipeline(transaction=False), keys)
            replies = await pipe.execute(raise_on_error=False)
            for state in self.decode_states(replies, await self.client.time(), match):
                yield state

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

    async def aclose(self) -> None:
        """Close every connection the brake opened, the sentinels' included (a brake from a URL owns its client).

        From a loop other than the one the connections belong to (an earlier
        `asyncio.run`), those connections cannot be closed: they are dropped,
        and this does not fail on them. The fleet view's counters noted so far are written first
        (waiting at most two seconds).
        """
        await self._enter()
        if self.watch is not None:
            await self.watch.aflush()
        await self._close_connections()

    async def __aenter__(self) -> AsyncDistributedBrake:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
