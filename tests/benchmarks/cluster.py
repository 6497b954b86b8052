"""The Redis Cluster figures (`--cluster-url`), each against the same figure on the single node at --url.

* `cluster_async`: the asyncio brake's checks/s at 64 tasks on the Cluster
  against on the single node, interleaved in one event loop; its note gives
  the CPU each spent per check, the client's (this process) and the
  servers' (the masters' INFO cpu), measured in the same rounds: on a
  machine whose cores the client and every server share, a Cluster's rate
  is bounded by the sum;
* `cluster_sync`: the sync brake's checks/s at 8 threads (one session each)
  on the Cluster against on the single node, interleaved;
* `cluster_memory`: Redis memory per session on the Cluster, `used_memory`
  summed over its masters, read with the brake's clients closed.

Without a Cluster URL each says "skipped".
"""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from distbrake import AsyncDistributedBrake, BrakeSettings, DistributedBrake
from distbrake.redis import connect

from .aio import Workload, brake_rate, measure
from .local import SMALL_ARGS, Figure, Step, no_step, ratio_figure
from .server import CONCURRENCY, DEFAULT_SESSIONS, bench_brake, memory_per_session

__all__ = ["MODES", "THREADS", "cluster_memory", "cluster_rate"]

THREADS = 8
CLUSTER_BOUND = 0.9  # the Cluster's checks/s at least this share of the single node's (issue 29)
NO_CLUSTER = "skipped: needs --cluster-url redis+cluster://... (and a single node at --url)"


def _usable(single: BrakeSettings, cluster: BrakeSettings | None) -> bool:
    return cluster is not None and cluster.parsed_url.connector == "cluster" and single.parsed_url.connector != "memory"


def _servers_cpu(client: Any) -> float:
    """CPU seconds the server has used (INFO cpu), summed over every primary of a cluster."""
    primaries = getattr(client, "get_primaries", None)
    nodes = [client.get_redis_connection(node) for node in primaries()] if callable(primaries) else [client]
    return sum(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]) for info in (n.info("cpu") for n in nodes))


def _accounted(workload: Workload, checks: int, server: Any, spent: list[tuple[float, float]]) -> Workload:
    """`workload`, noting each run's CPU per check (this process's, the servers') in `spent`."""
    async def run() -> float:
        client_before, server_before = time.process_time(), _servers_cpu(server)
        rate = await workload()
        spent.append(((time.process_time() - client_before) / checks, (_servers_cpu(server) - server_before) / checks))
        return rate

    return run


def _async_rates(single: BrakeSettings, cluster: BrakeSettings, per_task: int, rounds: int,
                 timeout_seconds: float, step: Step) -> tuple[list[float], str]:
    async def rates() -> tuple[list[float], str]:
        prefix = f"bnch{uuid.uuid4().hex[:5]}"
        targets = (cluster, single)
        brakes = [bench_brake(AsyncDistributedBrake, b, prefix, timeout_seconds) for b in targets]
        servers = [connect.sync_client(b.parsed_url, timeout_seconds) for b in targets]
        spent: tuple[list[tuple[float, float]], ...] = ([], [])
        try:
            workloads = [_accounted(brake_rate(brake, CONCURRENCY, per_task), CONCURRENCY * per_task, server, out)
                         for brake, server, out in zip(brakes, servers, spent, strict=True)]
            rates = await measure(workloads, rounds, "cluster_async", step)
            for brake in brakes:
                await brake.clear_all()
        finally:
            for brake in brakes:
                await brake.aclose()
            for server in servers:
                server.close()
        (cluster_client, cluster_servers), (single_client, single_server) = (
            (statistics.median(c for c, _ in out[1:]) * 1e6, statistics.median(s for _, s in out[1:]) * 1e6)
            for out in spent)  # [1:]: not the warm-up
        note = (f"CPU per check, the client's and the servers': Cluster {cluster_client:.1f} + {cluster_servers:.1f} "
                f"µs (3 masters), single node {single_client:.1f} + {single_server:.1f} µs; "
                f"{os.cpu_count()} CPUs shared by the client and every server")
        return rates, note

    return asyncio.run(rates())


def _threads_rate(brake: DistributedBrake, sessions: list[str], per_thread: int) -> Callable[[], float]:
    """One thread per session, `per_thread` checks each: checks/s from the moment all have started (a barrier)
    until the last is done (thread start-up is not timed)."""
    def one(session: str, ready: threading.Barrier) -> None:
        ready.wait()
        for i in range(per_thread):
            brake.check("search", SMALL_ARGS[i & 1], session_id=session)

    def run() -> float:
        ready = threading.Barrier(len(sessions) + 1)
        threads = [threading.Thread(target=one, args=(s, ready)) for s in sessions]
        for thread in threads:
            thread.start()
        ready.wait()
        start = time.perf_counter()
        for thread in threads:
            thread.join()
        return len(sessions) * per_thread / (time.perf_counter() - start)

    return run


def _sync_rates(single: BrakeSettings, cluster: BrakeSettings, per_thread: int, rounds: int,
                timeout_seconds: float, step: Step) -> tuple[list[float], str]:
    prefix = f"bnch{uuid.uuid4().hex[:5]}"
    brakes = [bench_brake(DistributedBrake, b, prefix, timeout_seconds) for b in (cluster, single)]
    sessions = [f"bench-{uuid.uuid4()}" for _ in range(THREADS)]
    try:
        runs = [_threads_rate(b, sessions, per_thread) for b in brakes]
        for run in runs:
            run()  # warm-up: connections, script, slot map
        rates: list[list[float]] = [[], []]
        for index in range(rounds):
            for run, out in zip(runs, rates, strict=True):
                out.append(run())
            step("cluster_sync", index + 1, rounds)
        for brake in brakes:
            brake.clear_all()
    finally:
        for brake in brakes:
            brake.close()
    return [statistics.median(out) for out in rates], ""


Rates = Callable[[BrakeSettings, BrakeSettings, int, int, float, Step], tuple[list[float], str]]
# figure key: (its name, workers, checks per worker by default, how both rates are measured, interleaved)
MODES: dict[str, tuple[str, int, int, Rates]] = {
    "cluster_async": (f"Cluster async {CONCURRENCY} tasks vs single node", CONCURRENCY, 200, _async_rates),
    "cluster_sync": (f"Cluster sync {THREADS} threads vs single node", THREADS, 1000, _sync_rates),
}


def cluster_rate(
    key: str, single: BrakeSettings, cluster: BrakeSettings | None, *, per_worker: int | None = None,
    rounds: int = 5, timeout_seconds: float = 5.0, step: Step = no_step,
) -> Figure:
    """Checks/s on the Cluster vs on the single node: the asyncio brake at 64 tasks (`cluster_async`) or the
    sync brake at 8 threads, one session each (`cluster_sync`)."""
    name, workers, default, rates = MODES[key]
    per_worker = per_worker or default
    if cluster is None or not _usable(single, cluster):
        return Figure(key, name, "checks/s", None, None, None, f">= {CLUSTER_BOUND:g}x", None, NO_CLUSTER)
    (ours, floor), note = rates(single, cluster, per_worker, rounds, timeout_seconds, step)
    return ratio_figure(key, name, "checks/s", ours, floor, at_least=CLUSTER_BOUND, note=note,
                        samples=rounds * workers * per_worker)


def cluster_memory(
    cluster: BrakeSettings | None, *, sessions: int = DEFAULT_SESSIONS, timeout_seconds: float = 5.0,
    step: Step = no_step,
) -> Figure:
    """Redis memory per session on the Cluster (summed over its masters, clients closed)."""
    if cluster is None or cluster.parsed_url.connector != "cluster":
        return Figure("cluster_memory", "Redis memory per session, Cluster", "bytes", None, None, None,
                      "<= 265 B", None, NO_CLUSTER)
    return memory_per_session(cluster, sessions=sessions, timeout_seconds=timeout_seconds, step=step,
                              key="cluster_memory", bound=265)
