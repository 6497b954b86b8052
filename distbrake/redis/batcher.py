"""The asyncio brake's batcher: concurrent checks coalesced into pipelines, on one or two lanes.

While a pipeline of EVALSHAs is on the wire, new checks queue, and all that
queued go out together in the next pipeline (on a single node or a Cluster,
two lanes take turns, so Redis runs one pipeline while the event loop
prepares the other). Two connections carry a burst of thousands of checks
(no "too many connections"), and throughput at high concurrency is several
times that of one round trip per check. A NOSCRIPT reply (flushed script
cache, restarted or failed-over server) loads the script and sends those
checks again. The Cluster path is in `aio_cluster.py`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple

import redis.asyncio
import redis.asyncio.cluster
import redis.exceptions

from .aio_cluster import Answered, ClusterPath
from .batch import read_replies, write_all
from .contract import MODE, MODE_CHECK
from .deadline import LazyDeadline
from .script import Script, brake_script
from .wire import CALL_HEAD, encode_run, resp_evalsha, run_replies

__all__ = ["LANES", "MAX_BATCH", "MAX_RUN", "SPLIT", "Batcher", "Lane", "QueueTimeout", "Queued"]

MAX_BATCH = 1024
MAX_RUN = 256  # identical checks of one session sent as one script call, at most
LANES = 2  # batches on the wire at once on the direct path with connections of its own, one per connection
SPLIT = 16  # a queue this long is shared by two lanes: Python prepares one batch while Redis runs the other
IDLE, STARTING, SENDING = 0, 1, 2  # a lane's state
_MODE_AT = MODE - 1  # ARGV[MODE] in a Python tuple
LATE = 0.02  # seconds: at least this late past its deadline, a timeout is the event loop's, not Redis's

class Queued(NamedTuple):
    """A queued check, or a run of identical checks of one session: what goes on the wire as one EVALSHA.

    A run of one is the queued check itself, with its one future (no object
    more per check on the wire); a run of several has the list of their futures.
    """

    key: str
    argv: tuple[Any, ...]
    deadline: float  # on the loop's clock: the run's earliest
    futures: asyncio.Future[Any] | list[asyncio.Future[Any]]
    packed: bytes  # the EVALSHA in wire format


# A `Queued` made by tuple's own constructor (NamedTuple's is a Python function: a check pays it on the hot path).
_Fields = tuple[str, tuple[Any, ...], float, "asyncio.Future[Any] | list[Any]", bytes]
_queued: Callable[[_Fields], Queued] = functools.partial(tuple.__new__, Queued)


class QueueTimeout(Exception):
    """A check spent its time waiting behind the brake's own earlier batches, not on Redis."""


class Lane:
    """One batch on the wire at a time: its sender task, its state, its own connection (direct path)."""

    __slots__ = ("connection", "sender", "state")

    def __init__(self) -> None:
        self.state = IDLE
        self.sender: asyncio.Task[None] | None = None
        self.connection: Any = None  # the direct path's own connection, connected by its first write


class Batcher:
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
    prepares the next (on two cores, they overlap). On a Cluster a queue is
    not halved (see `_may_share`): the second lane takes what queues while the
    first is on the wire, or what a full batch (MAX_BATCH) left. A session has at most one
    run on the wire at a time, so its checks keep their order on any lane.
    Other paths have one lane.
    """

    def __init__(
        self, client: Any, timeout: float, script: Script | None = None, *, own: bool = False,
        count_late: bool = False,
    ) -> None:
        self._client = client
        self._timeout = timeout
        # A check whose time ran out while it queued is decided by the policy; with `count_late` (a policy
        # under which the tool runs all the same) it is still sent, so that Redis's streaks stay true.
        self._count_late = count_late
        # How late past a deadline the loop may wake before a timeout is taken for the loop's lateness.
        self._late = max(LATE, timeout / 10)
        self._script = script = script or brake_script()  # the brake's (its telemetry is told of each load)
        # A plain redis.asyncio client (single node, or a Sentinel-managed master)
        # gets its batches, packed once, written straight to one pooled
        # connection; Cluster and the embedded backend use the client's pipeline.
        self._direct = (
            type(client) is redis.asyncio.Redis
            and type(client.connection_pool) in (redis.asyncio.ConnectionPool, redis.asyncio.BlockingConnectionPool)
        )
        cluster = isinstance(client, redis.asyncio.cluster.RedisCluster)
        self._cluster = ClusterPath(client, script) if cluster else None
        # `own`: a client the brake built (`from_url`) on a plain pool. Its direct path keeps one connection
        # of its own (made from the pool's settings, outside its count): one batch is on the wire at a
        # time, so one connection carries them all, and no batch pays the pool's acquire and release.
        # A pool that limits connections (`?max_connections=N`), and a caller's client (its pool may
        # re-authenticate, cap or drop its connections), are asked for one per batch instead.
        self._owns = own and self._direct and type(client.connection_pool) is redis.asyncio.ConnectionPool
        # a Cluster: per-node pools, a connection per batch
        self._lanes = tuple(Lane() for _ in range(LANES if self._owns or cluster else 1))
        self._busy = 0  # lanes not idle
        self._on_wire: set[str] = set()  # the keys of the runs on the wire
        self._deadline = LazyDeadline()
        self._queue: list[Queued] = []
        # The direct path learns of a missing script from NOSCRIPT; so does the cluster path (per node).
        self._loaded = self._direct or cluster
        # Whether the last batch held one check (one task checking at a time): then the next check,
        # with nothing else queued or on the wire, is sent by its own task (`_alone`), not a sender's.
        self._one_at_a_time = True
        self._inline: asyncio.Future[None] | None = None  # done when the check sent so is answered

    def call(self, key: str, argv: tuple[Any, ...], packed: bytes, deadline: float) -> Awaitable[Any]:
        """The reply to one check (`packed`: its EVALSHA), to be awaited: its future, or, when it is the only
        check, the coroutine that sends it from the caller's task (`_alone`)."""
        if self._one_at_a_time and self._inline is None and not self._queue and not self._busy:
            return self._alone(key, argv, packed, deadline)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        queue = self._queue
        queue.append(_queued((key, argv, deadline, future, packed)))
        # A lane starts when none is at work (else one that is takes this check when it is done),
        # and another once the queue is long enough to share.
        if not self._busy or (len(queue) >= SPLIT and self._busy < len(self._lanes) and self._may_share()):
            self._start(next(lane for lane in self._lanes if lane.state == IDLE))
        return future

    def _may_share(self) -> bool:
        """Whether a second lane may start now. On a Cluster, only while a batch is on the wire (the one busy
        lane is sending; one about to send takes the whole queue): a batch there is already one pipeline
        per master, all at once, and halving the queue between two lanes would halve every master's
        pipeline (twice the writes and reads per check, in the client and in the servers)."""
        return self._cluster is None or bool(self._on_wire)

    def _start(self, lane: Lane) -> None:
        lane.state = STARTING
        self._busy += 1
        lane.sender = sender = asyncio.create_task(self._send_all(lane))
        sender.add_done_callback(functools.partial(self._ended, lane))

    def _ended(self, lane: Lane, sender: asyncio.Task[None]) -> None:
        """A sender ended. Cancelled by the host (a shutdown hook, a watchdog), perhaps before it even started:
        its lane is made idle, and the checks still queued, whose tasks were not cancelled, get a new sender
        (nothing may wait past its timeout for a sender that will never come)."""
        if lane.sender is sender:
            lane.sender = None
            if lane.state != IDLE:  # cancelled before its first step: `_send_all` never ran
                lane.state = IDLE
                self._busy -= 1
        if not self._busy and any(not item.futures.done() for item in self._queue):  # type: ignore[union-attr]
            self._start(self._lanes[0])

    async def _alone(self, key: str, argv: tuple[Any, ...], packed: bytes, deadline: float) -> Any:
        """Send one check from the caller's task, a batch of its own (no sender task, no extra loop turn).

        Checks that come meanwhile queue; their sender waits for this one, so
        one batch is on the wire at a time, and a session's checks keep their order.
        """
        loop = asyncio.get_running_loop()
        self._inline = loop.create_future()
        batch = [_queued((key, argv, deadline, [], packed))]
        try:
            with self._deadline.bound(deadline):
                reply = (await self._send(batch, self._lanes[0]))[0]
        except TimeoutError:
            if loop.time() - deadline > self._late:  # the loop ran the deadline late: not Redis's timeout
                raise QueueTimeout from None
            raise
        finally:
            self._inline.set_result(None)
            self._inline = None
        if isinstance(reply, BaseException):
            raise reply
        return reply

    async def _send_all(self, lane: Lane) -> None:
        try:
            await self._send_lane(lane)
        finally:
            if lane.state != IDLE:
                lane.state = IDLE
                self._busy -= 1

    async def _send_lane(self, lane: Lane) -> None:
        await asyncio.sleep(0)  # let the checks started in this tick join the first batch
        while self._inline is not None:  # a check sent alone is on the wire: one batch at a time
            await asyncio.shield(self._inline)
        loop = asyncio.get_running_loop()
        on_wire = self._on_wire
        while self._queue:
            # Another lane about to start shares the queue: this one takes half of it (never on a Cluster).
            shared = self._cluster is None and any(
                other.state == STARTING for other in self._lanes if other is not lane)
            batch = self._next_batch(loop.time(), min(MAX_BATCH, -(-len(self._queue) // 2)) if shared else MAX_BATCH)
            if not batch:
                if self._queue and on_wire:
                    break  # what is left waits for its session's run on another lane; that lane takes it
                continue
            self._one_at_a_time = len(batch) == 1 and not isinstance(batch[0].futures, list)
            keys = [run.key for run in batch]
            on_wire.update(keys)
            lane.state = SENDING
            if self._cluster is not None and len(batch) == MAX_BATCH and self._busy < len(self._lanes):
                self._start(next(other for other in self._lanes if other.state == IDLE))  # the rest of a long queue
            sent_at = loop.time()
            early: set[str] = set()  # the keys of runs answered before the batch ended (a Cluster's masters)

            def answered(run: Queued, reply: Any, early: set[str] = early) -> None:
                """A run answered while the batch's other masters still work: its checks go on at once, and its
                session may have its next run on the wire."""
                _answer(run.futures, reply)
                on_wire.discard(run.key)
                early.add(run.key)

            try:
                with self._deadline.bound(min(run.deadline for run in batch)):
                    replies = await self._send(batch, lane, answered if self._cluster is not None else None)
            except BaseException as error:
                failure: BaseException = error
                if isinstance(error, TimeoutError) and self._own_delay(loop.time(), sent_at, batch):
                    failure = QueueTimeout()  # the batch never had a fair share of the timeout, or the loop was late
                elif isinstance(error, asyncio.CancelledError):
                    failure = QueueTimeout()  # the host cancelled the sender, not these checks: the policy decides
                for run in batch:
                    _fail(run.futures, failure)
                if isinstance(error, asyncio.CancelledError):
                    raise
                continue
            finally:  # (a key answered early may be on the wire again, on the other lane)
                on_wire.difference_update([key for key in keys if key not in early] if early else keys)
                lane.state = STARTING
            for run, reply in zip(batch, replies, strict=True):
                _answer(run.futures, reply)

    def _own_delay(self, now: float, sent_at: float, batch: list[Queued]) -> bool:
        """Whether a batch that timed out lost its time to the brake's own machinery, not to Redis: it was on
        the wire for less than half a timeout, or the event loop ran its deadline late (busy with other work,
        such as thousands of checks' first steps: a reply that arrived in time may be waiting unread)."""
        return now - sent_at < self._timeout / 2 or now - min(run.deadline for run in batch) > self._late

    def _next_batch(self, now: float, limit: int = MAX_BATCH) -> list[Queued]:
        """Up to `limit` runs, at most one per key, none of a key on the wire; the other checks wait.

        A run is a check and the identical checks of its session queued right
        after it (same call hash, limit and ttl). A batch whose reply is lost
        is sent again (the retry): the script recognises a resent run by its
        last call id, which is the last of its session; so a key never has two
        runs in one batch, and a session's checks are never reordered (once
        one waits, every later check of that session waits too). A check whose
        deadline passed while it queued fails with `QueueTimeout` (the policy decides it); it is
        still sent, with a new deadline, when the tool runs all the same (`count_late`). A check the
        host cancelled while it queued is dropped: never written, never counted (one already on the
        wire is counted once, as a check whose reply is lost).
        """
        runs: dict[str, Queued | list[Queued]] = {}  # a run of one is its check (the common case)
        waiting: set[str] = set(self._on_wire)
        later: list[Queued] = []
        for item in self._queue:
            key, argv, deadline, future, packed = item
            if future.cancelled():  # type: ignore[union-attr]  # queued: one future; cancelled: never written, never counted
                continue
            if deadline <= now:  # its caller gets the policy's verdict now
                _fail(future, QueueTimeout())
                if not self._count_late:
                    continue
                # the tool may run all the same (policy open or local): Redis still counts the call
                item = _queued((key, argv, now + self._timeout, future, packed))  # noqa: PLW2901
            if key not in waiting:
                run = runs.get(key)
                if run is None:
                    if len(runs) < limit:
                        runs[key] = item
                        continue
                elif isinstance(run, list):
                    if len(run) < MAX_RUN and _same_call(run[0].argv, argv):
                        run.append(item)
                        continue
                elif _same_call(run.argv, argv):
                    runs[key] = [run, item]
                    continue
                waiting.add(key)  # once one check of a session waits, every later one does
            later.append(item)
        self._queue = later
        head = self._script.evalsha_head
        return [run if not isinstance(run, list) else _joined(key, run, head) for key, run in runs.items()]

    async def _send(self, batch: list[Queued], lane: Lane, answered: Answered | None = None) -> list[Any]:
        """The replies to `batch`; `answered` is told of a run's final reply as soon as it is known (a Cluster's
        master that replied first), before the batch ends (its reply is in the list too)."""
        script = self._script
        if not self._loaded:  # load once up front rather than learn it from a burst of NOSCRIPTs
            await self._client.script_load(script.text)
            self._loaded = True
        replies = await self._pipeline(batch, lane, answered)
        for reply in replies:
            if isinstance(reply, redis.exceptions.NoScriptError):  # a flushed or new server
                return await script.aresend(batch, replies, functools.partial(self._pipeline, lane=lane),
                                            functools.partial(self._client.script_load, script.text))
        return replies

    async def _pipeline(self, batch: list[Queued], lane: Lane, answered: Answered | None = None) -> list[Any]:
        if self._direct:
            return await self._on_connection(batch, lane)
        sha = self._script.sha
        if self._cluster is not None:
            return await self._cluster.send(batch, sha, answered)
        pipe = self._client.pipeline(transaction=False)
        for run in batch:
            pipe.evalsha(sha, 1, run.key, *run.argv)
        return list(await pipe.execute(raise_on_error=False))

    async def _on_connection(self, batch: list[Queued], lane: Lane) -> list[Any]:
        """Write the batch in one send on the lane's connection (or a pooled one); read every reply.

        A connection error or timeout is retried once on a fresh connection,
        as the client's `Retry(NoBackoff(), 1)` would: safe, because each check
        carries a call id and a replayed check is not counted twice.
        """
        pool = self._client.connection_pool
        if self._owns:
            connection = lane.connection
            if connection is None:  # connected by its first write (see `write_all`)
                connection = lane.connection = pool.connection_class(**pool.connection_kwargs)
        else:
            connection = await pool.get_connection()
        packed = [run.packed for run in batch]
        try:
            for attempt in (1, 2):
                try:
                    await write_all(connection, packed)
                    return await read_replies(connection, len(batch))
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                    await connection.disconnect()
                    if attempt == 2 or (self._owns and connection is not lane.connection):  # closed by `aclose`
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
        """Close the direct path's own connections, if it has any (the next batch opens another).

        Batches still being sent (checks whose callers already have the policy's
        verdict, still counted) are waited for first, each bounded by its deadline.
        """
        loop = asyncio.get_running_loop()
        senders = [lane.sender for lane in self._lanes
                   if lane.sender is not None and not lane.sender.done() and lane.sender.get_loop() is loop]
        if senders:
            # Checks still queued get the policy's verdict now, and what was only kept to be counted is dropped;
            # the batches on the wire end (each bounded by its deadline), or are cancelled.
            for item in self._queue:
                _fail(item.futures, QueueTimeout())
            self._queue = []
            _, pending = await asyncio.wait(senders, timeout=self._timeout * 2)
            for sender in pending:
                sender.cancel()
            if pending:
                await asyncio.wait(pending)
        connections = []
        for lane in self._lanes:
            connections.append(lane.connection)
            lane.connection = None
        closed = await asyncio.gather(
            *(connection.disconnect() for connection in connections if connection is not None), return_exceptions=True)
        for result in closed:  # every one was closed (or tried): then the first failure, if any
            if isinstance(result, BaseException):
                raise result


def _same_call(first: tuple[Any, ...], argv: tuple[Any, ...]) -> bool:
    """Whether `argv` can join the run that starts with `first`: checks (MODE_CHECK: never observations,
    nor checks with cycles) of the same call, limit, ttl and window."""
    return bool(
        argv[_MODE_AT] == MODE_CHECK and first[0][:CALL_HEAD] == argv[0][:CALL_HEAD] and first[1:] == argv[1:]
    )


def _joined(key: str, run: list[Queued], head: bytes) -> Queued:
    """Identical checks of one session as one run (one script call, see `wire.encode_run`) of the brake's script
    (`head`: its `evalsha_head`, as each check's own)."""
    argv = encode_run([item.argv for item in run])
    futures: list[asyncio.Future[Any]] = [item.futures for item in run]  # type: ignore[misc]
    return Queued(key, argv, min(item.deadline for item in run), futures, resp_evalsha(key, argv, head))


def _answer(futures: asyncio.Future[Any] | list[asyncio.Future[Any]], reply: Any) -> None:
    """A run's reply to its checks' futures (an error to each; a run of several, each its own count); a future
    already done (answered early, or given the policy's verdict) is left as it is."""
    if isinstance(reply, BaseException):
        _fail(futures, reply)
    elif not isinstance(futures, list):  # the common case: a run of one
        if not futures.done():
            futures.set_result(reply)
    else:
        for future, one in zip(futures, run_replies(reply, len(futures)), strict=True):
            if not future.done():
                future.set_result(one)


def _fail(futures: asyncio.Future[Any] | list[asyncio.Future[Any]], error: BaseException) -> None:
    for future in futures if isinstance(futures, list) else (futures,):
        if not future.done():
            future.set_exception(error)
