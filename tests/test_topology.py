"""A Redis Cluster whose topology changes under load: nothing but the brake's own errors reaches a caller.

While a cluster grows (a master added, slots resharded to it) or fails over,
redis-py's cluster client can fail inside itself (`AttributeError: 'NoneType'
object has no attribute 'redis_connection'` for an ASK to a node it does not
know yet, `... 'connection_kwargs'`, `... 'writelines'`). Those are the
backend failing: the brake sends such a check once more after the slot map
is read again, and then the failure policy decides. The caller only ever
sees a verdict, `LoopBrakeError`, or (policy `closed`) `BrakeUnavailableError`.

One cluster serves the module: 3 masters with a replica each; every test
adds a master of its own to it. Slots move by hand, as `redis-cli --cluster
reshard` moves them (`CLUSTER SETSLOT ... IMPORTING/MIGRATING`, `MIGRATE`,
`SETSLOT ... NODE`), so the tests know which sessions are in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from distbrake import AsyncDistributedBrake, BrakeUnavailableError, DistributedBrake, LoopBrakeError
from distbrake.redis.aio_cluster import on_nodes
from distbrake.redis.batcher import _queued
from tests.servers import RedisCluster, RedisServer, wait_until
from tests.servers.process import REDIS_CLI, child_env, output, run_quietly
from tests.servers.resp import parse_info

BUDGET = 30.0  # how long any one topology change may take to settle (an upper bound, never a target)
RESHARD_SLOTS = 64
SYNC_THREADS = 4
ASYNC_TASKS = 64
FAILOVERS = ((), (), (), ("FORCE",))  # three manual failovers, then a forced one


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    """3 masters + 1 replica each, for this module only (its tests add masters and fail them over)."""
    with RedisCluster(masters=3, replicas_per_master=1) as made:
        yield made


# -- moving the cluster ----------------------------------------------------------------------------


def add_master(cluster: RedisCluster) -> RedisServer:
    """A new, empty master joined to the cluster (`redis-cli --cluster add-node`)."""
    node = RedisServer(extra_args=cluster.nodes[0].extra_args, name=f"cluster-added{len(cluster.nodes)}")
    cluster.nodes.append(node)  # before start: the cluster closes it with the others
    node.start()
    first = cluster.masters[0]
    result = run_quietly(
        [REDIS_CLI, "--cluster", "add-node", f"{node.host}:{node.port}", f"{first.host}:{first.port}"],
        timeout=BUDGET, env=child_env(),
    )
    assert result.returncode == 0, output(result)
    cluster.wait_healthy(BUDGET)
    return node


def owner_of(cluster: RedisCluster, slot: int) -> RedisServer:
    for info in cluster.view():
        if not info.is_master or "fail" in info.flags:
            continue
        for spec in info.slots:
            lo, _, hi = spec.partition("-")
            if int(lo) <= slot <= int(hi or lo):
                return cluster.nodes[[n.port for n in cluster.nodes].index(info.port)]
    raise LookupError(slot)


def start_migration(cluster: RedisCluster, slot: int, source: RedisServer, target: RedisServer) -> None:
    target.command("CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(source))
    source.command("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(target))


def migrate_keys(source: RedisServer, target: RedisServer, slot: int, keys: list[str] | None = None) -> None:
    """MIGRATE `keys` (default: every key of `slot`) from `source` to `target`, one at a time."""
    while True:
        batch = keys if keys is not None else source.command("CLUSTER", "GETKEYSINSLOT", slot, 10)
        if not batch:
            return
        for key in batch:
            source.command("MIGRATE", target.host, target.port, key, 0, 5000)
        if keys is not None:
            return


def finish_migration(cluster: RedisCluster, slot: int, source: RedisServer, target: RedisServer) -> None:
    """Hand `slot` to `target` (target first, then source, then every other master), as redis-cli does."""
    migrate_keys(source, target, slot)
    for node in [target, source, *(m for m in cluster.masters if m not in (target, source))]:
        node.command("CLUSTER", "SETSLOT", slot, "NODE", cluster.node_id(target))


@contextlib.contextmanager
def migrating(cluster: RedisCluster, slot: int, source: RedisServer, target: RedisServer) -> Iterator[None]:
    """`slot` half-way from `source` to `target` in the block; handed to `target` on the way out, whatever happened."""
    start_migration(cluster, slot, source, target)
    try:
        yield
    finally:
        finish_migration(cluster, slot, source, target)
        wait_settled(cluster)


def move_slot(cluster: RedisCluster, slot: int, target: RedisServer) -> None:
    source = owner_of(cluster, slot)
    start_migration(cluster, slot, source, target)
    finish_migration(cluster, slot, source, target)


def wait_settled(cluster: RedisCluster) -> None:
    """Every node agrees on the slots (and no slot is half-migrated anywhere)."""
    def settled() -> bool:
        for node in cluster.running_nodes():
            if "->-" in node.command("CLUSTER", "NODES") or "-<-" in node.command("CLUSTER", "NODES"):
                return False
        return True

    wait_until(settled, timeout=BUDGET, message="a slot stays half-migrated")
    cluster.wait_healthy(BUDGET)


def fail_over(cluster: RedisCluster, replica: RedisServer, mode: tuple[str, ...]) -> None:
    """`CLUSTER FAILOVER [FORCE]` on `replica`; wait until it serves its slots and the cluster agrees."""
    replica.command("CLUSTER", "FAILOVER", *mode)

    def promoted() -> bool:
        mine = next(i for i in cluster.view(replica) if i.port == replica.port)
        return mine.is_master and bool(mine.slots)

    wait_until(promoted, timeout=BUDGET, message=lambda: f"{replica.port} was not promoted")
    cluster.wait_healthy(BUDGET)


def redirected_evalshas(node: RedisServer) -> int:
    """How many EVALSHAs `node` refused without running them (an ASK or MOVED redirect is a refusal)."""
    entry = parse_info(node.command("INFO", "commandstats")).get("cmdstat_evalsha", "")
    fields = dict(part.split("=") for part in entry.split(",") if "=" in part)
    return int(fields.get("rejected_calls", 0))


def sessions_in(brake: Any, slots: set[int], count: int, prefix: str) -> list[str]:
    """`count` session ids whose keys fall in `slots` (ids tried in order, so the choice is repeatable)."""
    found = []
    for index in range(10**6):
        session = f"{prefix}-{index}"
        if key_slot(brake.key(session).encode()) in slots:
            found.append(session)
            if len(found) == count:
                return found
    raise AssertionError("no such sessions")


# -- one check, sync or async ---------------------------------------------------------------------


class Brakes:
    """A sync and an async brake per failure policy on the cluster (built now: their slot maps are of now)."""

    def __init__(self, url: str, policies: tuple[str, ...] = ("closed", "local")) -> None:
        # a generous timeout: these tests are about redirects and retries, and a busy machine must not turn
        # a slow first slot-map read into a policy decision
        options = {"max_repeats": 10**6, "retry_after_seconds": 0.05, "timeout_seconds": 5.0}
        self.sync = {p: DistributedBrake.from_url(url, on_backend_error=p, **options) for p in policies}
        self.aio = {p: AsyncDistributedBrake.from_url(url, on_backend_error=p, **options) for p in policies}

    async def outcome(self, flavour: str, policy: str, session: str) -> str:
        """decided_by, "unavailable" or "denied" (anything else raises: that is the bug)."""
        try:
            if flavour == "sync":
                verdict = await asyncio.to_thread(self.sync[policy].check, "search", {"q": 1}, session_id=session)
            else:
                verdict = await self.aio[policy].check("search", {"q": 1}, session_id=session)
        except BrakeUnavailableError:
            return "unavailable"
        except LoopBrakeError:
            return "denied"
        return verdict.decided_by

    async def close(self) -> None:
        for brake in self.sync.values():
            brake.close()
        for abrake in self.aio.values():
            await abrake.aclose()


# -- an ASK redirect to a node the client has never seen ---------------------------------------------


CASES = [(flavour, policy) for flavour in ("sync", "async") for policy in ("closed", "local")]


async def test_an_ask_to_a_node_nobody_knows_is_retried_once_then_the_policy_decides(cluster: RedisCluster) -> None:
    """The first slot of a reshard to a new master: an ASK to a node that is in no slot map yet.

    Reading the slot map again cannot name that node (it owns no slot yet),
    so the retry fails the same way and the policy decides: one retry, so
    the owner sees exactly two EVALSHAs per check.
    """
    new = add_master(cluster)
    brakes = Brakes(cluster.url)
    try:
        token = uuid.uuid4().hex[:8]
        probe = DistributedBrake.from_url(cluster.url)
        slot = key_slot(probe.key(f"{token}-0").encode())
        probe.close()
        sessions = {case: sessions_in(brakes.sync["closed"], {slot}, 4, token)[i] for i, case in enumerate(CASES)}
        for (flavour, policy), session in sessions.items():
            assert await brakes.outcome(flavour, policy, session) == "redis"
        owner = owner_of(cluster, slot)
        with migrating(cluster, slot, owner, new):
            migrate_keys(owner, new, slot, [brakes.sync["closed"].key(s) for s in sessions.values()])
            for (flavour, policy), session in sessions.items():
                before = redirected_evalshas(owner)
                got = await brakes.outcome(flavour, policy, session)
                assert got == ("unavailable" if policy == "closed" else "fallback"), (flavour, policy)
                assert redirected_evalshas(owner) - before == 2, (flavour, policy)  # sent, then once more
    finally:
        await brakes.close()


async def test_an_ask_to_a_node_the_client_has_not_seen_yet_is_followed_on_the_retry(cluster: RedisCluster) -> None:
    """The new master already owns a slot, but the client's slot map is older: the retry reads the map
    again, learns the node, follows the ASK there (loading the script on it) and Redis decides,
    with the streak continuing."""
    new = add_master(cluster)
    brakes = Brakes(cluster.url)  # slot maps without the new master...
    try:
        token = uuid.uuid4().hex[:8]
        slot = key_slot(brakes.sync["closed"].key(f"{token}-0").encode())
        sessions = {case: sessions_in(brakes.sync["closed"], {slot}, 4, token)[i] for i, case in enumerate(CASES)}
        for (flavour, policy), session in sessions.items():
            assert await brakes.outcome(flavour, policy, session) == "redis"
        other = next(s for s in range(16384) if s != slot and owner_of(cluster, s) is owner_of(cluster, slot))
        move_slot(cluster, other, new)  # ...which now owns a slot of its own
        wait_settled(cluster)
        owner = owner_of(cluster, slot)
        with migrating(cluster, slot, owner, new):
            migrate_keys(owner, new, slot, [brakes.sync["closed"].key(s) for s in sessions.values()])
            for (flavour, policy), session in sessions.items():
                assert await brakes.outcome(flavour, policy, session) == "redis", (flavour, policy)
                state = brakes.sync["closed"].inspect(session)
                assert state is not None and state.count == 2  # the streak went on, on the new master
    finally:
        await brakes.close()


# -- a reshard to an added master and four failovers, under load ------------------------------------


class Load:
    """SYNC_THREADS threads and ASYNC_TASKS tasks checking sessions until stopped; every outcome counted."""

    def __init__(self, brakes: Brakes, sessions: list[str]) -> None:
        self.brakes = brakes
        self.sessions = sessions
        self.stop = threading.Event()
        self.outcomes: Counter[str] = Counter()
        self.causes: Counter[str] = Counter()
        self.raw: list[BaseException] = []
        self._lock = threading.Lock()

    def _record(self, flavour: str, policy: str, result: str, error: BaseException | None = None) -> None:
        with self._lock:
            self.outcomes[f"{flavour}/{policy}/{result}"] += 1
            if isinstance(error, BrakeUnavailableError):
                cause = error.__cause__
                self.causes[type(cause).__name__ if cause is not None else "known down"] += 1
            elif error is not None and len(self.raw) < 20:
                self.raw.append(error)
            elif error is not None:
                self.outcomes["raw (not kept)"] += 1

    def _one(self, flavour: str, policy: str, check: Any, session: str) -> Any:
        try:
            verdict = check("search", {"q": session}, session_id=session)
        except LoopBrakeError:
            self._record(flavour, policy, "denied")
        except BrakeUnavailableError as error:
            self._record(flavour, policy, "unavailable", error)
        except Exception as error:  # the bug this module is about
            self._record(flavour, policy, "RAW", error)
        else:
            return verdict
        return None

    def sync_worker(self, index: int) -> None:
        policy = ("closed", "local")[index % 2]
        brake = self.brakes.sync[policy]
        step = 0
        while not self.stop.is_set():
            step += 1
            session = self.sessions[(index * 7919 + step * 31) % len(self.sessions)]
            verdict = self._one("sync", policy, brake.check, session)
            if verdict is not None:
                self._record("sync", policy, verdict.decided_by)

    async def async_worker(self, index: int) -> None:
        policy = ("closed", "local")[index % 2]
        brake = self.brakes.aio[policy]
        step = 0
        while not self.stop.is_set():
            step += 1
            session = self.sessions[(index * 104729 + step * 17) % len(self.sessions)]
            try:
                verdict = await brake.check("search", {"q": session}, session_id=session)
            except LoopBrakeError:
                self._record("async", policy, "denied")
            except BrakeUnavailableError as error:
                self._record("async", policy, "unavailable", error)
                await asyncio.sleep(0.001)  # known down: do not spin the loop
            except Exception as error:  # the bug this module is about
                self._record("async", policy, "RAW", error)
            else:
                self._record("async", policy, verdict.decided_by)
                if verdict.decided_by != "redis":
                    await asyncio.sleep(0.001)

    def total(self, flavour: str) -> int:
        return sum(n for name, n in self.outcomes.items() if name.startswith(f"{flavour}/"))


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_reshard_and_failovers_under_load_reach_no_caller_as_raw_errors(cluster: RedisCluster) -> None:
    cluster.wait_healthy(BUDGET)
    new = add_master(cluster)
    brakes = Brakes(cluster.url)
    # RESHARD_SLOTS slots from the start of the widest slot range go to the new master.
    ranges = [
        (int(hi or lo) - int(lo), int(lo), info.port)
        for info in cluster.view() if info.is_master
        for lo, _, hi in (spec.partition("-") for spec in info.slots)
    ]
    width, first, port = max(ranges)
    assert width >= RESHARD_SLOTS
    source = next(node for node in cluster.nodes if node.port == port)
    moved = list(range(first, first + RESHARD_SLOTS))
    token = uuid.uuid4().hex[:8]
    in_flight = sessions_in(brakes.sync["closed"], set(moved), 4 * RESHARD_SLOTS, f"{token}-m")
    elsewhere = [f"{token}-e-{i}" for i in range(256)]
    load = Load(brakes, in_flight + elsewhere)
    threads = [threading.Thread(target=load.sync_worker, args=(i,), daemon=True) for i in range(SYNC_THREADS)]
    tasks: list[asyncio.Task[None]] = []
    steps: list[str] = []
    redirects_before = sum(redirected_evalshas(node) for node in cluster.running_nodes())
    started = time.monotonic()
    try:
        for thread in threads:
            thread.start()
        tasks = [asyncio.create_task(load.async_worker(i)) for i in range(ASYNC_TASKS)]
        await asyncio.sleep(0.5)  # load on the settled cluster first (the sessions get records)

        def change() -> None:
            for slot in moved:
                start_migration(cluster, slot, source, new)
                migrate_keys(source, new, slot)
                finish_migration(cluster, slot, source, new)
            wait_settled(cluster)
            steps.append(f"reshard of {len(moved)} slots to a new master: {time.monotonic() - started:.1f} s")
            for number, mode in enumerate(FAILOVERS):
                original = cluster.initial_masters[number % len(cluster.initial_masters)]
                master = next(m for m in cluster.masters if m is original or original in cluster.replicas_of(m))
                replica = cluster.replicas_of(master)[0]
                fail_over(cluster, replica, mode)
                steps.append(f"CLUSTER FAILOVER {' '.join(mode)} of {master.port} to {replica.port}: "
                             f"{time.monotonic() - started:.1f} s")

        await asyncio.to_thread(change)
        await asyncio.sleep(0.5)  # load on the changed cluster too
    finally:
        load.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for thread in threads:
            thread.join(BUDGET)
    redirects = sum(redirected_evalshas(node) for node in cluster.running_nodes()) - redirects_before
    try:
        # Once the cluster has settled, Redis decides every check again (each brake probes and recovers).
        for flavour in ("sync", "async"):
            for policy in ("closed", "local"):
                deadline = time.monotonic() + BUDGET
                while await brakes.outcome(flavour, policy, f"{token}-after") != "redis":
                    assert time.monotonic() < deadline, f"{flavour}/{policy} never decided by Redis again"
                    await asyncio.sleep(0.05)
    finally:
        await brakes.close()

    print(f"\ntopology: {' | '.join(steps)}")
    print(f"topology: checks run: sync {load.total('sync')}, async {load.total('async')}; "
          f"raw exceptions: {len(load.raw) + load.outcomes['raw (not kept)']}; "
          f"EVALSHAs the servers redirected (MOVED/ASK): {redirects}")
    print(f"topology: outcomes: {dict(sorted(load.outcomes.items()))}")
    print(f"topology: causes of BrakeUnavailableError: {dict(load.causes)}")
    assert [f"{type(e).__name__}: {e}" for e in load.raw] == []
    assert load.total("sync") > 0 and load.total("async") > 0
    assert not any("RAW" in name for name in load.outcomes)


async def test_a_master_dropped_from_the_slot_map_mid_batch_keeps_no_connection_open(
    redis_cluster: RedisCluster, cluster_url: str,
) -> None:
    """A slot-map refresh (another lane's retry) that drops a master from the client's nodes while a batch is still
    being written to an earlier master: the batch then connects to the dropped master and, giving the connection
    back to a node nothing will ever close, used to leave its socket open until garbage collection (a
    ResourceWarning in a later test; found by review). Now such a connection is closed when it is given back."""
    brake = AsyncDistributedBrake.from_url(cluster_url)
    client = brake.client
    try:
        await brake.check("warm", {}, session_id="warm")  # the client built, the script loaded where it went
        await client.script_load(brake._batcher._script.text)
        manager = client.nodes_manager
        first, second = manager.get_nodes_by_server_type("primary")[:2]
        await second.execute_command("PING")  # `second` has a free, connected connection (as in steady use)
        for connection in list(first._free):  # `first` connects a new one: its write yields to the refresh
            await connection.disconnect()
        runs = []
        for node in (first, second):
            for n in range(10_000):
                prepared = brake.prepare("search", {}, f"o{node.port}-{n}")
                key, argv, packed = brake.encode(prepared)
                if manager.get_node_from_slot(key_slot(key.encode())).name == node.name:
                    future = asyncio.get_running_loop().create_future()
                    runs.append([_queued((key, argv, 1e18, future, packed))])
                    break

        async def refresh_drops_second() -> None:  # what initialize() does when CLUSTER SLOTS lacks `second`
            await asyncio.sleep(0)
            kept = {name: node for name, node in manager.nodes_cache.items() if name != second.name}
            manager.set_nodes(manager.nodes_cache, kept, remove_old=True)

        dropper = asyncio.ensure_future(refresh_drops_second())
        results = await on_nodes([(first, runs[0]), (second, runs[1])], None, manager.nodes_cache)
        await dropper
        for _ in range(5):
            await asyncio.sleep(0.05)  # redis-py's own disconnects of the dropped node run
        assert all(isinstance(result, list) for result in results), results  # both masters answered
        assert second.name not in manager.nodes_cache
        left_open = [connection for connection in second._connections if connection.is_connected]
        assert not left_open, f"{len(left_open)} connection(s) of a dropped master left open"
    finally:
        await brake.aclose()
