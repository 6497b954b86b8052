"""The asyncio batcher's Redis Cluster path: a batch routed by slot, one packed pipeline per master.

Each master gets its runs in one write on one of its connections (all
masters at once), their replies read at once (`on_nodes`). What the fast
path cannot place or send goes the careful way, one EVALSHA per run through
redis-py's cluster client (`ClusterPath.per_key`), with one retry after the
slot map is read again (see `topology.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, cast

from .batch import read_replies, write_all
from .topology import (
    CAREFUL,
    INTERNAL_ERRORS,
    RETRY,
    UNROUTED,
    after_fast_path,
    arefresh_topology,
    is_topology_error,
    retry_after,
    slot_of,
    topology_error,
)

if TYPE_CHECKING:
    from .batcher import Queued
    from .script import Script

__all__ = ["CLUSTER_CONCURRENCY", "Answered", "ClusterPath"]

CLUSTER_CONCURRENCY = 32
Answered = Callable[["Queued", Any], None]  # told of a run's final reply before its batch ends


class ClusterPath:
    """How the batcher sends a batch to a Redis Cluster (`client`: a redis.asyncio cluster client)."""

    def __init__(self, client: Any, script: Script) -> None:
        self._client = client
        self._script = script  # the brake's (its telemetry is told of each load after a NOSCRIPT)
        self._refreshing = asyncio.Lock()  # held while the slot map is read again

    async def send(self, batch: list[Queued], sha: str, answered: Answered | None = None) -> list[Any]:
        """The batch routed by slot, one packed pipeline per master.

        Each master gets its runs in one write on one of its connections (all
        masters at once), their replies read at once. A run whose master
        redirected it (MOVED, ASK, TRYAGAIN) or failed inside redis-py (a node
        gone from the slot map) is sent once more after the slot map is read
        again, the retry of `per_key`; one answered with CLUSTERDOWN or
        NOSCRIPT, or whose master's pipeline failed otherwise (a lost
        connection), goes the whole careful way, `per_key`.
        Safe: every run carries its call id, so a run that did reach Redis is a replay.
        `answered` is told of each run a master answered as soon as that master's replies are read (the
        other masters may still be working): those checks need not wait for the slowest master.
        """
        client = self._client
        try:
            # Learn the slot map once, up front, rather than from a burst of calls racing to it.
            await client.initialize()
        except INTERNAL_ERRORS as error:
            if is_topology_error(error):
                raise topology_error(error) from error
            raise
        groups: dict[str, tuple[Any, list[Queued], list[int]]] = {}  # by master: its node, runs, their places
        again: list[int] = []  # not sent, or failed otherwise: the whole careful way
        retry: list[int] = []  # redirected (or the node failed inside redis-py): the retry after a refresh
        slots = client.nodes_manager.slots_cache  # read without its lock, as redis-py does: a stale entry is a MOVED
        for index, run in enumerate(batch):
            try:
                node = slots[slot_of(run.key)][0]
            except UNROUTED:
                again.append(index)
                continue
            group = groups.get(node.name)
            if group is None:
                group = groups[node.name] = (node, [], [])
            group[1].append(run)
            group[2].append(index)
        replies: list[Any] = [None] * len(batch)
        results = await on_nodes(
            [(node, runs) for node, runs, _ in groups.values()], answered, client.nodes_manager.nodes_cache)
        for (_, _, indexes), result in zip(groups.values(), results, strict=True):
            if isinstance(result, BaseException):  # the master's pipeline failed: nothing is known of its runs
                (retry if after_fast_path(result) == RETRY else again).extend(indexes)
                continue
            for index, reply in zip(indexes, result, strict=True):
                if isinstance(reply, BaseException):
                    step = after_fast_path(reply)  # the redirect rule the sync brake follows too
                    if step == RETRY:
                        retry.append(index)
                        continue
                    if step == CAREFUL:
                        again.append(index)
                        continue
                replies[index] = reply
        for indexes, sent in ((again, False), (retry, True)):
            if indexes:
                for index, reply in zip(
                    indexes, await self.per_key([batch[i] for i in indexes], sha, sent=sent), strict=True
                ):
                    replies[index] = reply
        return replies

    async def per_key(self, batch: list[Queued], sha: str, *, sent: bool = False) -> list[Any]:
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
        client, script = self._client, self._script

        async def calls(runs: list[Queued]) -> list[Any]:
            replies: list[Any] = []
            for start in range(0, len(runs), CLUSTER_CONCURRENCY):
                replies.extend(await asyncio.gather(
                    *(client.evalsha(sha, 1, run.key, *run.argv) for run in runs[start:start + CLUSTER_CONCURRENCY]),
                    return_exceptions=True,
                ))
            return replies

        async def load() -> None:  # on a new master (or a promoted replica) without the script
            try:
                await client.script_load(script.text)
            except INTERNAL_ERRORS as error:
                if is_topology_error(error):
                    raise topology_error(error) from error
                raise

        async def attempt(runs: list[Queued]) -> list[Any]:
            return await script.aresend(runs, await calls(runs), calls, load)

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


async def on_nodes(
    work: list[tuple[Any, list[Queued]]], answered: Answered | None = None, nodes: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Each (node, runs): the runs written in one send on one of the node's connections, every node's
    first (so all masters work at once), then the nodes' replies read as each node sends them (a task
    per node when more than one has replies to read), and each run's reply that is not an error told to
    `answered` as soon as its node's are read: a slow master delays its own checks only.

    A node whose write or read failed has that error as its result (its connection dropped); the
    others go on. Cancelled (the batch's deadline): every connection with replies unread is dropped.
    No connection with unread replies ever goes back to its node. `nodes`: the client's nodes by name
    (its nodes manager's cache); a connection of a node no longer there (a slot-map refresh dropped it
    while this batch was on the wire) is closed when it is given back, as nothing else would close it.
    """
    taken: list[tuple[Any, Any]] = []
    results: list[Any] = [None] * len(work)

    async def read(index: int, connection: Any, runs: list[Queued]) -> None:
        try:
            results[index] = replies = await read_replies(connection, len(runs))
        except Exception as error:
            await connection.disconnect(nowait=True)
            results[index] = error
            return
        if answered is not None:
            for run, reply in zip(runs, replies, strict=True):
                if not isinstance(reply, BaseException):  # final (an error reply may be retried)
                    answered(run, reply)

    try:
        for index, (node, runs) in enumerate(work):
            connection = node.acquire_connection()
            taken.append((node, connection))
            try:
                stale = getattr(connection, "should_reconnect", None)  # redis-py 7+
                if stale is not None and stale():  # marked by a slot-map refresh: a fresh socket, as redis-py does
                    await connection.disconnect()
                await write_all(connection, [run.packed for run in runs])
            except Exception as error:
                await connection.disconnect(nowait=True)
                results[index] = error
        reads = [read(index, connection, runs)
                 for index, ((_, connection), (_, runs)) in enumerate(zip(taken, work, strict=True))
                 if results[index] is None]
        if len(reads) == 1:
            await reads[0]
        elif reads:
            await _all(reads)
    except BaseException:
        for index, (_, connection) in enumerate(taken):
            if not isinstance(results[index], list):
                await connection.disconnect(nowait=True)
        raise
    finally:
        for node, connection in taken:
            if nodes is not None and nodes.get(node.name) is not node:
                await connection.disconnect(nowait=True)
            node.release(connection)
    return results


async def _all(coroutines: list[Coroutine[Any, Any, None]]) -> None:
    """Run `coroutines` as tasks until every one ended; cancelled, cancel them and wait until they have ended
    (so none still reads a connection its caller drops and releases)."""
    tasks = [asyncio.ensure_future(coroutine) for coroutine in coroutines]
    try:
        await asyncio.wait(tasks)
    finally:
        left = [task for task in tasks if not task.done()]
        for task in left:
            task.cancel()
        if left:
            await asyncio.wait(left)
    for task in tasks:  # an error other than a read's (which `read` keeps as the node's result)
        if not task.cancelled() and task.exception() is not None:
            raise cast(BaseException, task.exception())
