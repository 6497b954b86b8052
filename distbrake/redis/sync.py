"""`DistributedBrake`: the sync Redis brake. It only sends and receives.

One check is one EVALSHA of `lua/brake.lua`. On a single node (or a
Sentinel-managed master) the EVALSHA, packed by `wire.encode_call`, is
written straight to a pooled redis-py connection; on a Cluster the client
routes it. Either way a NOSCRIPT reply loads the script and sends the
check again. Everything else is in `base.py`.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
import weakref
from collections.abc import Iterator
from functools import partial
from typing import Any, Unpack, cast

import redis
import redis.cluster
import redis.exceptions

from ..core import PreparedCall, SessionState, SyncCheck, Verdict
from ..killswitch import Stop, ThreadReader
from ..model import Halt
from ..operator import KillState, OperatorMixin, ttl_ms
from ..policy import NO_TRY
from ..redis_errors import REDIS_FAILURES
from ..settings import BrakeOptions, BrakeSettings
from ..urls import ParsedURL
from .base import DistributedBase
from .batch import SyncExchange
from .connect import ATTEMPT_SHARE, LazyClient, sync_client
from .topology import (
    RETRY,
    UNROUTED,
    after_fast_path,
    is_topology_error,
    refresh_topology,
    retry_after,
    slot_of,
    topology_error,
)

__all__ = ["DistributedBrake"]

SCAN_BATCH = 500
# This process's pid, kept current in a forked child (no syscall per check).
_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


class ThreadConnections(dict[str, tuple[int, Any, SyncExchange]]):
    """One thread's connections of one brake, by node name: closed when the thread ends (its thread-local
    storage, the only reference, is dropped then). Left to the garbage collector, a connection (a reference
    cycle) kept its socket open until a collection, which may also close the socket first and warn."""

    __slots__ = ("pid",)

    def __init__(self) -> None:
        super().__init__()
        self.pid = _PID[0]

    def __del__(self) -> None:
        if self.pid == _PID[0]:  # a forked child leaves its parent's connections alone
            for _, _, send in self.values():
                with contextlib.suppress(Exception):  # a finalizer has no caller to tell (say, at interpreter exit)
                    send.connection.disconnect()


class DistributedBrake(OperatorMixin, SyncCheck, DistributedBase):
    """The loop brake with its streaks in Redis, shared by every worker of a fleet."""

    blocking_io = True
    switch: ThreadReader

    def __init__(
        self, client: Any, *, settings: BrakeSettings | None = None, url: str | None = None,
        **options: Unpack[BrakeOptions],
    ) -> None:
        super().__init__(client, settings=settings, url=url, **options)
        # Only a plain client on a plain pool (TCP, TLS or Unix socket): a
        # Sentinel-managed pool must pick the master itself, so it goes the usual way.
        self._direct = (
            type(client) is redis.Redis and type(client.connection_pool) is redis.ConnectionPool
        )
        # A Cluster: each check goes straight to its master the same way (see `_on_cluster`).
        self._cluster = isinstance(client, (redis.cluster.RedisCluster, LazyClient))  # (lazy: a Cluster's)
        self._nodes: Any = None  # the Cluster client's nodes manager, once it is built
        # On the direct path each thread keeps one connection of its own (made by
        # the client's pool, never shared): no pool round trip per check.
        self._local = threading.local()
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self.switch = ThreadReader("redis", self._read_kill)  # the kill switch, read in the background

    @staticmethod
    def connect(url: ParsedURL, timeout: float) -> Any:
        """The client `from_url` builds for this brake."""
        return sync_client(url, timeout)

    def decide(self, call: PreparedCall) -> Verdict:
        """Count `call` in Redis (one EVALSHA) and judge it; the failure policy if Redis fails."""
        key, argv, packed = self.encode(call)  # before a probe may be claimed: nothing between it and the try
        ticket = self.failures.breaker.attempt()
        if ticket == NO_TRY:
            return self.without_redis(call, None)
        try:
            reply = self._send(key, argv, packed)
        except REDIS_FAILURES as error:
            return self.without_redis(call, error, ticket)
        except BaseException:  # interrupted: a probe must not stay claimed forever
            self.failures.breaker.abandoned(ticket)
            raise
        return self.verdict(call, reply, ticket)

    def _send(self, key: str, argv: tuple[bytes | int, ...], packed: bytes) -> Any:
        """One EVALSHA of the script, by the brake's path (its own connection, the Cluster's master, the client)."""
        if self._direct:
            return self._on_connection(packed)
        if self._cluster:
            return self._on_cluster(key, argv, packed)
        return self._evalsha(key, argv)

    def observe(self, verdict: Verdict, result: object, failed: bool | None = None) -> None:
        """After the tool ran: its result (or raised exception), for a progress-aware tool's streak and a
        tool's failures in a row (max_failures). `failed`: the call failed (default: `result` is an
        exception; an MCP result with isError, or a framework's tool error, is a failure too: pass True).

        One more round trip for each, for those tools only; a no-op otherwise.
        """
        for key, argv, packed in self.observations(verdict, result, failed):
            try:
                self._send(key, argv, packed)
            except REDIS_FAILURES as error:
                self.observation_failed(error)

    def block_key(self, key: str, halt: Halt, ttl_ms: int, session_id: str | None = None) -> None:
        """Halt the session whose record is `key` (an operator's block: every check refused with `halt`'s
        why) for `ttl_ms` (>= 1); `session_id` is kept for `inspect` when it has no record yet.
        Errors are raised (no failure policy)."""
        self._send(*self.block_request(key, halt, ttl_ms, session_id))

    def unblock_key(self, key: str) -> bool:
        """Lift the halt of the session whose record is `key` (the record is deleted); False: not halted."""
        return bool(self._send(*self.unblock_request(key)))

    def _on_cluster(self, key: str, argv: tuple[bytes | int, ...], packed: bytes) -> Any:
        """A Cluster check sent straight to its master, on this thread's connection to it.

        The master comes from the client's slot map. A redirect (MOVED, ASK,
        TRYAGAIN) is sent once more after the slot map is read again, the
        retry of `_evalsha`; a key the map cannot place, CLUSTERDOWN, or a
        master that refused the connection go the client's way, `_evalsha`.
        A timeout is the backend failing (no second wait).
        """
        nodes = self._nodes
        if nodes is None:  # the client is built on first use (see connect.LazyClient); a build that fails
            nodes = self._nodes = self.client.nodes_manager  # is the backend failing: not built twice in one check
        try:
            # The slot map as the client keeps it, read without its lock: a stale entry is a MOVED.
            node = nodes.slots_cache[slot_of(key)][0]
            pool = node.redis_connection.connection_pool
        except UNROUTED:
            return self._evalsha(key, argv)
        try:
            return self._on_connection(packed, pool, node.name)
        except Exception as error:
            step = after_fast_path(error)  # the redirect rule the asyncio brake follows too
            if step is None:
                raise
            return self._evalsha(key, argv, sent=step == RETRY)

    def _evalsha(self, key: str, argv: tuple[bytes | int, ...], *, sent: bool = False) -> Any:
        """EVALSHA through the client (Cluster routes it); NOSCRIPT loads and sends again.

        On a Cluster whose topology changes under the check (a reshard, a
        failover), a redirect that failed (redis-py's cluster client failing
        inside itself, or a MOVED/ASK it gave up on) is sent once more after
        the slot map is read again; failing again, it is a `ClusterTopologyError`
        and the failure policy decides (see `topology.py`). Safe: the check
        carries its call id, so a resent check that did reach Redis is a replay.
        `sent`: the check was sent once already (`_on_cluster`) and redirected: only the retry is left.
        """
        client, script = self.client, self.script

        def once() -> Any:
            return script.run(lambda: client.evalsha(script.sha, 1, key, *argv),
                              lambda: client.script_load(script.text))

        if not sent:
            try:
                return once()
            except Exception as error:
                if not retry_after(error):
                    raise
        refresh_topology(self.client)
        try:
            return once()
        except Exception as error:
            if is_topology_error(error):
                raise topology_error(error) from error
            raise

    def _exchange(self, pool: Any, name: str) -> SyncExchange:
        """The exchange on this thread's connection made from `pool`'s settings (outside its count of connections)."""
        try:
            pid, made_from, send = cast(tuple[int, Any, SyncExchange], self._local.connections[name])
        except (AttributeError, KeyError):  # this thread's first command to the node
            return self._new_exchange(pool, name)
        if pid != _PID[0] or made_from is not pool:  # a forked child, or the cluster client made the node's pool anew
            return self._new_exchange(pool, name)
        return send

    def _new_exchange(self, pool: Any, name: str) -> SyncExchange:
        """A new connection made from `pool`'s settings, this thread's to the node `name` from now on."""
        local = self._local
        connections = getattr(local, "connections", None)
        if connections is None or connections.pid != _PID[0]:  # first use, or a forked child (the parent's
            connections = local.connections = ThreadConnections()  # connections are the parent's: left alone)
        mine = connections.get(name)
        if mine is not None:  # the cluster client made the node's pool anew
            mine[2].connection.disconnect()
        connection = pool.connection_class(**pool.connection_kwargs)
        send = SyncExchange(connection)
        connections[name] = (_PID[0], pool, send)
        self._connections.add(connection)
        return send

    def _on_connection(self, packed: bytes, pool: Any = None, name: str = "") -> Any:
        """Send one packed EVALSHA on this thread's connection (to `pool`'s server) and read its reply.

        A connection error or timeout is retried once on a fresh connection,
        as the client's `Retry(NoBackoff(), 1)` would, when a whole attempt
        still fits the check's timeout; NOSCRIPT loads the script and sends
        again. An error reply leaves the connection as it is; interrupted
        half-way, the connection is dropped, so no unread reply is ever left on it.
        """
        send = self._exchange(pool or self.client.connection_pool, name)
        connection = send.connection
        try:
            timeout = self.settings.timeout_seconds
            deadline = time.monotonic() + timeout
            for attempt in (1, 2):
                try:
                    try:
                        return send(packed)
                    except redis.exceptions.NoScriptError:
                        return self.script.resend(partial(send, packed), partial(send, self.script.load_command))
                except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
                    connection.disconnect()
                    # Again only if a whole attempt still fits the check's timeout (a connect that
                    # timed out has been tried twice by redis-py already).
                    if attempt == 2 or time.monotonic() + timeout * ATTEMPT_SHARE > deadline:
                        raise
            raise AssertionError("unreachable")  # pragma: no cover  # noqa: TRY301
        except redis.exceptions.ResponseError:  # a whole reply was read: the connection is fine
            raise
        except BaseException:
            connection.disconnect()
            raise

    # -- operations -------------------------------------------------------------------

    def inspect(self, session_id: str) -> SessionState | None:
        """The session's record, or None when it has none (never seen, cleared or expired)."""
        pipe = self.queue_state_reads(self.client.pipeline(transaction=False), [self.key(session_id)])
        states = self.decode_states(pipe.execute(), self.client.time(), None)
        return states[0] if states else None

    def clear(self, session_id: str) -> bool:
        """Forget the session's streak; True when there was one."""
        return bool(self.client.delete(self.key(session_id)))

    def _key_batches(self) -> Iterator[list[Any]]:
        keys = self.client.scan_iter(match=self.key_pattern, count=SCAN_BATCH)
        while batch := list(itertools.islice(keys, SCAN_BATCH)):
            yield batch

    def sessions(self, match: str | None = None) -> Iterator[SessionState]:
        """Every session under this prefix, filtered by a glob on the session id (SCAN, never KEYS)."""
        return (state for _, state in self._scan(match))

    def _scan(self, match: str | None) -> Iterator[tuple[str, SessionState]]:
        """Every session under this prefix with its key, filtered by a glob on the session id."""
        for keys in self._key_batches():
            pipe = self.queue_state_reads(self.client.pipeline(transaction=False), keys)
            yield from self.keyed_states(keys, pipe.execute(raise_on_error=False), self.client.time(), match)

    def clear_all(self) -> int:
        """Forget every session under this prefix (and nothing else); returns how many."""
        cleared = 0
        for batch in list(self._key_batches()):
            reads = self.queue_state_reads(self.client.pipeline(transaction=False), batch)
            keys = self.records_among(batch, reads.execute(raise_on_error=False))
            if keys:
                pipe = self.queue_deletes(self.client.pipeline(transaction=False), keys)
                cleared += sum(int(n) for n in pipe.execute())
        return cleared

    def ping(self) -> bool:
        return bool(self.client.ping())

    # -- the operator's stop (operator.py): a session's target is its key ------------------------------------

    def _target(self, session_id: str) -> str:
        return self.key(session_id)

    def _matching(self, match: str, halted: bool) -> Iterator[str]:
        return (key for key, state in self._scan(match) if state.halted or not halted)

    def _block_one(self, key: str, session_id: str | None, halt: Halt, ttl: float | None) -> bool:
        self.block_key(key, halt, 0 if ttl is None else ttl_ms(ttl), session_id)
        return True

    def _unblock_one(self, key: str) -> bool:
        return self.unblock_key(key)

    def _clear_one(self, key: str) -> bool:
        return bool(self.client.delete(key))

    def _read_kill(self) -> Stop | None:
        return self.kill_read(self.queue_kill_read(self.client.pipeline(transaction=False)).execute())

    def kill_switch(self) -> KillState | None:
        """The fleet's kill switch (`block_all`) as Redis has it now, or None when it is not set."""
        return self.kill_state(self._read_kill())

    def _set_kill(self, halt: Halt, ttl: float | None) -> None:
        key, value, px = self.kill_write(halt, ttl)
        self.client.set(key, value, px=px)

    def _clear_kill(self) -> bool:
        self.switch.set(None)
        return bool(self.client.delete(self.kill_key))

    def close(self) -> None:
        """Close the client's connections (a brake built from a URL owns its client).

        The fleet view's counters noted so far are written first (waiting at most two seconds).
        """
        self.switch.close(2 * self.settings.timeout_seconds)  # a read's connect and reply, at most
        if self.watch is not None:
            self.watch.flush()
        for connection in list(self._connections):
            connection.disconnect()
        close = getattr(self.client, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> DistributedBrake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
