"""The `bench` command: what the brake costs on your own deployment, in absolute terms.

Against the backend of --url, under a key prefix of its own (deleted at the
end), through the public brakes (`DistributedBrake`, `AsyncDistributedBrake`):

* sync: checks per second of one thread, each check's latency (p50, p99) and
  the worker's CPU time per check;
* async: checks per second of one event loop with 64 tasks, p50 and p99;
* the server's CPU per check: `INFO commandstats`, the change of the script
  commands' `usec` over the change of their `calls` while the bench ran (the
  script's execution alone), and all in: the change of `INFO cpu`'s
  `used_cpu_user` + `used_cpu_sys` over the same calls (network I/O too);
  each summed over a Cluster's masters;
* memory per session: `INFO memory` `used_memory` growth over N fresh sessions.

What the server cannot tell (`memory://` is the embedded store in this
process; a server that refuses INFO) is reported as not available, never
estimated. It judges nothing: exit 0 once measured, 4 when the backend fails.
The team's ratio-to-floor suite lives outside the package, in tests/benchmarks.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from typing import TYPE_CHECKING, Any

import click
from rich.text import Text

from .app import App, command

if TYPE_CHECKING:
    from ..redis.sync import DistributedBrake
    from ..settings import BrakeSettings

TASKS = 64
TOOL = "get_weather_forecast"  # a realistic tool name
ARGS = tuple({"query": f"weather in city {i}", "limit": 5} for i in range(5))  # period 5: never a cycle
SCRIPT_COMMANDS = ("cmdstat_evalsha", "cmdstat_eval")


def _primaries(client: Any) -> list[Any]:
    """A client per server to ask INFO: every master of a Cluster, else the one server."""
    if callable(getattr(client, "get_primaries", None)):
        return [client.get_redis_connection(node) for node in client.get_primaries()]
    return [client]


def _server_stats(client: Any) -> tuple[int, int, float]:
    """(calls, usec) of the script commands and the server's CPU seconds, summed over every master."""
    calls = usec = 0
    cpu = 0.0
    for server in _primaries(client):
        stats = server.info("commandstats")
        for name in SCRIPT_COMMANDS:
            entry = stats.get(name) or {}
            calls += int(entry.get("calls", 0))
            usec += int(entry.get("usec", 0))
        used = server.info("cpu")
        cpu += float(used["used_cpu_user"]) + float(used["used_cpu_sys"])
    return calls, usec, cpu


def _used_memory(client: Any) -> int:
    return sum(int(server.info("memory")["used_memory"]) for server in _primaries(client))


def _info(client: Any, read: Any, why: dict[str, str], field: str) -> Any:
    """`read(client)`; None when there is no server to ask, or (the reason in `why[field]`) it fails."""
    if client is None:
        return None
    try:
        return read(client)
    except Exception as error:
        why[field] = f"not available: the server's INFO failed ({type(error).__name__})"
        return None


def _quantiles(seconds: list[float]) -> tuple[float, float]:
    """p50 and p99 in µs."""
    cuts = statistics.quantiles(seconds, n=100, method="inclusive")
    return round(cuts[49] * 1e6, 1), round(cuts[98] * 1e6, 1)


def _sync(brake: DistributedBrake, checks: int) -> dict[str, float]:
    session = f"bench-{uuid.uuid4()}"
    latencies: list[float] = []
    clock, check = time.perf_counter, brake.check
    cpu, start = time.process_time(), clock()
    for i in range(checks):
        began = clock()
        check(TOOL, ARGS[i % 5], session_id=session)
        latencies.append(clock() - began)
    elapsed, cpu = clock() - start, time.process_time() - cpu
    p50, p99 = _quantiles(latencies)
    return {"sync_checks_per_second": round(checks / elapsed), "sync_p50_us": p50, "sync_p99_us": p99,
            "worker_cpu_us_per_check": round(cpu / checks * 1e6, 1)}


async def _async(settings: BrakeSettings, checks: int) -> dict[str, float]:
    from ..redis.aio import AsyncDistributedBrake

    brake = AsyncDistributedBrake.from_url(settings=settings, otel=False)
    latencies: list[float] = []
    per_task = max(1, checks // TASKS)
    clock = time.perf_counter

    async def agent(session: str, calls: int) -> None:
        for i in range(calls):
            began = clock()
            await brake.check(TOOL, ARGS[i % 5], session_id=session)
            latencies.append(clock() - began)

    try:
        await asyncio.gather(*(agent(f"bench-{uuid.uuid4()}", 5) for _ in range(TASKS)))  # warm-up
        latencies.clear()
        start = clock()
        await asyncio.gather(*(agent(f"bench-{uuid.uuid4()}", per_task) for _ in range(TASKS)))
        elapsed = clock() - start
    finally:
        await brake.aclose()
    p50, p99 = _quantiles(latencies)
    return {"async_checks_per_second": round(TASKS * per_task / elapsed), "async_p50_us": p50, "async_p99_us": p99}


def _per_check(before: tuple[int, int, float] | None, after: tuple[int, int, float] | None) -> dict[str, Any]:
    """The server's CPU per script call between two `_server_stats`: the script alone, and all in."""
    script = total = None
    if before is not None and after is not None and after[0] > before[0]:
        calls = after[0] - before[0]
        script, total = (after[1] - before[1]) / calls, (after[2] - before[2]) * 1e6 / calls
    return {"server_cpu_us_per_check": None if script is None else round(script, 2),
            "server_total_cpu_us_per_check": None if total is None else round(total, 2),
            "server_checks_per_core_second": round(1e6 / total) if total else None}


def _memory(brake: DistributedBrake, server: Any, sessions: int, why: dict[str, str]) -> dict[str, Any]:
    """`used_memory` growth per session over `sessions` fresh ones (UUID ids, a call id each)."""
    field = "memory_bytes_per_session"
    per_session = None
    before = _info(server, _used_memory, why, field)
    if before is not None:
        for _ in range(sessions):
            call_id = ("call_" + uuid.uuid4().hex)[:29]
            brake.check(TOOL, ARGS[0], session_id=str(uuid.uuid4()), call_id=call_id)
        grown = _info(server, _used_memory, why, field)
        per_session = None if grown is None else (grown - before) / sessions
    return {field: None if per_session is None else round(per_session),
            "sessions_per_gb": round(1e9 / per_session) if per_session and per_session > 0 else None}


def measure(settings: BrakeSettings, *, checks: int, sessions: int) -> dict[str, Any]:
    """Every figure of the bench on `settings`' backend, under a prefix of its own deleted afterwards."""
    from ..redis.sync import DistributedBrake

    prefix = f"bench{uuid.uuid4().hex[:4]}"  # 9 characters, as long as the default "distbrake"
    settings = DistributedBrake.settings_for_url(
        settings.url, settings, key_prefix=prefix, on_backend_error="closed",
        timeout_seconds=max(settings.timeout_seconds, 5.0), max_repeats=max(settings.max_repeats, 2))
    why: dict[str, str] = {}
    if settings.parsed_url.connector == "memory":
        why["server_cpu_us_per_check"] = why["memory_bytes_per_session"] = (
            "not available: memory:// is the embedded store, inside this process")
    report: dict[str, Any] = {"backend": settings.shown_url, "key_prefix": prefix, "checks": checks,
                              "tasks": TASKS, "sessions": sessions}
    brake = DistributedBrake.from_url(settings=settings, otel=False)
    try:
        brake.ping()  # fail fast (exit 4) when the server is not there
        for i in range(50):  # warm-up: connection, script
            brake.check(TOOL, ARGS[i % 5], session_id="bench-warm-up")
        server = None if why else brake.client  # the server INFO is asked of
        before = _info(server, _server_stats, why, "server_cpu_us_per_check")
        report.update(_sync(brake, checks))
        report.update(asyncio.run(_async(settings, checks)))
        after = _info(server if before else None, _server_stats, why, "server_cpu_us_per_check")
        report.update(_per_check(before, after))
        report.update(_memory(brake, server, sessions, why))
    finally:
        try:
            report["cleared"] = brake.clear_all()
        finally:
            brake.close()
    report["not_available"] = why
    return report


ROWS = (  # (field, what it is, unit)
    ("sync_checks_per_second", "sync checks per second (1 thread)", "/s"),
    ("sync_p50_us", "sync check latency p50", " µs"),
    ("sync_p99_us", "sync check latency p99", " µs"),
    ("worker_cpu_us_per_check", "worker CPU per sync check", " µs"),
    ("async_checks_per_second", f"async checks per second ({TASKS} tasks, 1 event loop)", "/s"),
    ("async_p50_us", "async check latency p50", " µs"),
    ("async_p99_us", "async check latency p99", " µs"),
    ("server_cpu_us_per_check", "server CPU per check: the script (INFO commandstats)", " µs"),
    ("server_total_cpu_us_per_check", "server CPU per check: all in, network I/O too (INFO cpu)", " µs"),
    ("server_checks_per_core_second", "checks per second one server core decides (all in)", "/s"),
    ("memory_bytes_per_session", "server memory per session (used_memory growth)", " B"),
    ("sessions_per_gb", "sessions per GB of server memory", ""),
)


@command("bench")
@click.option("--checks", metavar="N", default=5000, show_default=True, type=click.IntRange(min=TASKS),
              help=f"Checks to time, sync and again async ({TASKS} tasks).")
@click.option("--sessions", metavar="N", default=5000, show_default=True, type=click.IntRange(min=100),
              help="Fresh sessions written for the memory figure (other clients' buffers move used_memory too: "
                   "the more sessions, the steadier the figure).")
def bench_command(app: App, *, checks: int, sessions: int, as_json: bool) -> None:
    """Measure the brake on the backend at --url: checks/s, latency, server CPU and memory per session.

    It writes under a key prefix of its own (bench + 4 hex characters) and
    deletes it all at the end; the memory figure adds N short-lived sessions
    first. On a busy server the CPU and memory figures include other clients'
    work: run it on a quiet one. Nothing is judged: exit 0 once measured.
    """
    from .output import emit_json, escape_text, make_console, make_table, print_renderable

    report = measure(app.settings(), checks=checks, sessions=sessions)
    if as_json:
        emit_json(report)
        return
    table = make_table("measure", "value", title=Text(f"distbrake bench on {escape_text(report['backend'])}"))
    table.columns[1].justify = "right"
    for field, label, unit in ROWS:
        value = report[field]
        table.add_row(label, "n/a" if value is None else f"{value:,}{unit}")
    console = make_console()
    print_renderable(console, table)
    for field, reason in report["not_available"].items():
        console.print(Text(f"{field}: {reason}"))
    console.print(Text(f"{checks} checks sync and async, {sessions} sessions for memory; "
                       f"{report['cleared']} sessions under {report['key_prefix']!r} deleted"))
