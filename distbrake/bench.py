"""Benchmark figures of distbrake, each measured against its own floor.

Every figure is a ratio to the cheapest thing that could do the same job on
the same machine and server, so that the numbers travel between machines:

* `sync_check_latency`: a sync `DistributedBrake.check` (small arguments)
  against redis-py sending `EVALSHA` of `return 1` to the same server;
* `async_throughput`: checks per second of `AsyncDistributedBrake` at 64
  concurrent tasks against redis.asyncio sending one unpipelined
  `EVALSHA return 1` per task at 64 tasks;
* `memory_per_session`: Redis `used_memory` growth per session slot (UUID
  session ids, 29-character call ids, TTL set), under a dedicated key prefix
  that is cleared afterwards (only on a real Redis: never `memory://`);
* `inprocess_check`: `LoopBrake.check` (small arguments) against
  `sha256(json.dumps(args, sort_keys=True, separators=(",", ":")))`;
* `call_hash_1mb`: `call_hash` of a ~1 MB nested dict against stdlib
  `json.dumps(sort_keys=True)` + sha256.

Timing uses `time.perf_counter`, warm-ups, interleaved blocks of ours and the
floor (so drift hits both alike) and medians. Each function returns a
`Figure`; `run_bench` returns them all in a `BenchReport`. `distbrake bench`
prints them; tests and scripts may call the functions directly.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import shutil
import statistics
import subprocess
import time
import uuid
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any

from .aio import AsyncDistributedBrake
from .connect import async_client, sync_client
from .errors import LoopBrakeError
from .identity import call_hash
from .redis_brake import DistributedBrake
from .slot import script_source
from .streak import LoopBrake
from .urls import ParsedURL, parse_url, redact_url

__all__ = [
    "BenchReport",
    "Figure",
    "Step",
    "async_throughput",
    "call_hash_1mb",
    "inprocess_check",
    "memory_per_session",
    "nested_document",
    "run_bench",
    "sync_check_latency",
]

#: `step(stage, done, total)`: progress of one stage, in that stage's own units.
Step = Callable[[str, int, int], None]

FLOOR_SCRIPT = "return 1"
SMALL_ARGS = ({"query": "weather in Paris", "limit": 5}, {"query": "weather in Lyon", "limit": 5})
CONCURRENCY = 64
DEFAULT_SESSIONS = 20_000
QUICK_SESSIONS = 2_000
CALL_ID_CHARS = 29


@dataclass(frozen=True)
class Figure:
    """One measured figure: ours, its floor, the ratio and whether it meets its target.

    `ratio` is ours / floor (both in `unit`); for `memory_per_session`, which
    has no floor, it is None and the target is on `ours` itself.
    """

    key: str
    name: str
    unit: str
    ours: float | None
    floor: float | None
    ratio: float | None
    target: str
    passed: bool | None  # None when not measured (skipped)
    note: str = ""
    samples: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BenchReport:
    backend: str  # redacted URL
    quick: bool
    figures: list[Figure] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(f.passed is not False for f in self.figures)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "quick": self.quick,
            "passed": self.passed,
            "figures": [f.to_json() for f in self.figures],
        }


def _ratio_figure(
    key: str, name: str, unit: str, ours: float, floor: float, *,
    at_most: float | None = None, at_least: float | None = None, note: str = "", samples: int = 0,
) -> Figure:
    ratio = ours / floor if floor > 0 else float("inf")
    if at_most is not None:
        target, passed = f"<= {at_most:g}x", ratio <= at_most
    elif at_least is not None:
        target, passed = f">= {at_least:g}x", ratio >= at_least
    else:
        raise ValueError("a ratio figure needs at_most or at_least")
    return Figure(key, name, unit, ours, floor, ratio, target, passed, note, samples)


def _no_step(stage: str, done: int, total: int) -> None:
    return None


def _is_memory(url: str) -> bool:
    return parse_url(url).kind == "memory"


def _memory_note(url: str) -> str:
    if _is_memory(url):
        return "memory:// is the embedded fakeredis (no network); the target is meant for a real Redis"
    return ""


# -- (a) sync check latency ------------------------------------------------------------


def sync_check_latency(
    url: str, *, rounds: int = 10, block: int = 500, warmup: int = 300,
    timeout_seconds: float = 2.0, step: Step = _no_step,
) -> Figure:
    """Median latency of one sync check vs one redis-py `EVALSHA return 1`, same server.

    Each check alternates between two small argument sets in one session, so
    every check is allowed and writes its slot (the common case of an agent
    that is not looping).
    """
    prefix = f"bnch{uuid.uuid4().hex[:5]}"
    brake = DistributedBrake.from_url(
        url, key_prefix=prefix, timeout_seconds=timeout_seconds, on_backend_error="closed"
    )
    floor_client = sync_client(url, timeout_seconds)
    try:
        sha = floor_client.script_load(FLOOR_SCRIPT)
        floor_key = f"{prefix}:floor"
        session = f"bench-{uuid.uuid4()}"

        # One floor call, then one check, and again: both see the same noise.
        def pairs(n: int, ours_out: list[float], floor_out: list[float]) -> None:
            clock = time.perf_counter
            for i in range(n):
                start = clock()
                floor_client.evalsha(sha, 1, floor_key)
                middle = clock()
                brake.check("search", SMALL_ARGS[i & 1], session_id=session)
                end = clock()
                floor_out.append(middle - start)
                ours_out.append(end - middle)

        pairs(warmup, [], [])
        ours_t: list[float] = []
        floor_t: list[float] = []
        for index in range(rounds):
            pairs(block, ours_t, floor_t)
            step("sync_check_latency", index + 1, rounds)
        brake.clear(session)
    finally:
        brake.close()
        floor_client.close()
    return _ratio_figure(
        "sync_check_latency", "sync check latency (median)", "µs",
        statistics.median(ours_t) * 1e6, statistics.median(floor_t) * 1e6,
        at_most=1.2, note=_memory_note(url), samples=len(ours_t),
    )


# -- (b) async throughput ----------------------------------------------------------------


async def _async_throughput(
    url: str, *, concurrency: int, per_task: int, rounds: int, timeout_seconds: float, step: Step,
) -> tuple[float, float]:
    prefix = f"bnch{uuid.uuid4().hex[:5]}"
    brake = AsyncDistributedBrake.from_url(
        url, key_prefix=prefix, timeout_seconds=timeout_seconds, on_backend_error="closed"
    )
    floor_client = async_client(url, timeout_seconds)
    sessions = [f"bench-{uuid.uuid4()}" for _ in range(concurrency)]
    floor_key = f"{prefix}:floor"
    try:
        sha = await floor_client.script_load(FLOOR_SCRIPT)

        async def our_task(session: str, n: int) -> None:
            for i in range(n):
                await brake.check("search", SMALL_ARGS[i & 1], session_id=session)

        async def floor_task(n: int) -> None:
            for _ in range(n):
                await floor_client.evalsha(sha, 1, floor_key)

        async def ours(n: int) -> float:
            start = time.perf_counter()
            await asyncio.gather(*(our_task(s, n) for s in sessions))
            return concurrency * n / (time.perf_counter() - start)

        async def floor(n: int) -> float:
            start = time.perf_counter()
            await asyncio.gather(*(floor_task(n) for _ in range(concurrency)))
            return concurrency * n / (time.perf_counter() - start)

        await ours(max(5, per_task // 5))
        await floor(max(5, per_task // 5))
        ours_r: list[float] = []
        floor_r: list[float] = []
        for index in range(rounds):
            floor_r.append(await floor(per_task))
            ours_r.append(await ours(per_task))
            step("async_throughput", index + 1, rounds)
        await brake.clear_all()
    finally:
        await brake.aclose()
        close = getattr(floor_client, "aclose", None) or floor_client.close
        await close()
    return statistics.median(ours_r), statistics.median(floor_r)


def async_throughput(
    url: str, *, concurrency: int = CONCURRENCY, per_task: int = 200, rounds: int = 5,
    timeout_seconds: float = 5.0, step: Step = _no_step,
) -> Figure:
    """Checks/s of `AsyncDistributedBrake` vs unpipelined `EVALSHA return 1`, both at 64 tasks."""
    ours, floor = asyncio.run(
        _async_throughput(url, concurrency=concurrency, per_task=per_task, rounds=rounds,
                          timeout_seconds=timeout_seconds, step=step)
    )
    return _ratio_figure(
        "async_throughput", f"async throughput, {concurrency} tasks", "checks/s", ours, floor,
        at_least=2.0, note=_memory_note(url), samples=rounds * concurrency * per_task,
    )


# -- (c) memory per session ----------------------------------------------------------------


def _used_memory(client: Any) -> int:
    """`used_memory` summed over every primary (one node, or each master of a cluster)."""
    primaries = getattr(client, "get_primaries", None)
    if callable(primaries):
        return sum(
            int(client.get_redis_connection(node).info("memory")["used_memory"])
            for node in primaries()
        )
    return int(client.info("memory")["used_memory"])


def _call_id() -> str:
    return ("call_" + uuid.uuid4().hex + uuid.uuid4().hex)[:CALL_ID_CHARS]


async def _fill(
    url: str, prefix: str, *, sessions: int, timeout_seconds: float, step: Step,
    measure: Callable[[], int],
) -> tuple[int, int, int]:
    brake = AsyncDistributedBrake.from_url(
        url, key_prefix=prefix, timeout_seconds=timeout_seconds, on_backend_error="closed"
    )
    try:
        # Warm up (script cache, connections), then forget the warm-up slot.
        await brake.check("search", SMALL_ARGS[0], session_id="warm-up", call_id=_call_id())
        await brake.clear("warm-up")
        before = await asyncio.to_thread(measure)
        done = 0

        async def agent() -> None:  # 64 of these: a fleet's worth of concurrent checks
            nonlocal done
            while done < sessions:
                done += 1
                await brake.check("search", SMALL_ARGS[0], session_id=str(uuid.uuid4()),
                                  call_id=_call_id())
                if done % 500 == 0:
                    step("memory_per_session", done, sessions)

        try:
            await asyncio.gather(*(agent() for _ in range(CONCURRENCY)))
            step("memory_per_session", sessions, sessions)
            after = await asyncio.to_thread(measure)
        finally:
            cleared = await brake.clear_all()
    finally:
        await brake.aclose()
    return before, after, cleared


def memory_per_session(
    url: str, *, sessions: int = DEFAULT_SESSIONS, timeout_seconds: float = 5.0,
    step: Step = _no_step,
) -> Figure:
    """Redis `used_memory` growth per session slot, under a dedicated prefix cleared afterwards.

    The prefix has the length of the default one ("distbrake", 9 characters),
    so the keys are the size they are in production. Only on a real Redis
    (and only on one you may fill with `sessions` short-lived keys).
    """
    name, target = "Redis memory per session", "<= 240 B"
    if _is_memory(url):
        return Figure(
            "memory_per_session", name, "bytes", None, None, None, target, None,
            "skipped: memory:// has no used_memory; run with --url redis://... (a server you may fill)",
        )
    prefix = f"bench{uuid.uuid4().hex[:4]}"  # 9 characters, like "distbrake"
    info_client = sync_client(url, timeout_seconds)
    try:
        before, after, cleared = asyncio.run(
            _fill(url, prefix, sessions=sessions, timeout_seconds=timeout_seconds, step=step,
                  measure=lambda: _used_memory(info_client))
        )
    finally:
        info_client.close()
    per = (after - before) / sessions
    note = f"{sessions} sessions under prefix {prefix!r}, all cleared afterwards ({cleared})"
    return Figure(
        "memory_per_session", name, "bytes", per, None, None, target, per <= 240, note, sessions,
    )


# -- (e) server cost ------------------------------------------------------------------------


SERVER_COST_SESSIONS = 10_000


def _benchmark_rate(parsed: ParsedURL, command: list[str], requests: int) -> float:
    host, port = parsed.hosts[0]
    argv = ["redis-benchmark", "-h", host, "-p", str(port), "-n", str(requests), "-P", "16",
            "-q", "-r", str(SERVER_COST_SESSIONS), "--dbnum", str(parsed.db)]
    if parsed.username:
        argv += ["--user", parsed.username]
    if parsed.password:
        argv += ["-a", parsed.password, "--no-auth-warning"]
    out = subprocess.run(
        argv + command, capture_output=True, text=True, timeout=300, check=True
    ).stdout
    lines = [line for line in out.replace("\r", "\n").split("\n") if "requests per second" in line]
    if not lines:
        raise RuntimeError("redis-benchmark printed no rate")
    return float(lines[-1].rsplit(":", 1)[1].split()[0])


def server_cost(url: str, *, requests: int = 200_000, timeout_seconds: float = 5.0) -> Figure:
    """Server throughput of the brake's script vs `EVALSHA return 1`, both with redis-benchmark -P 16.

    Only on a single node reached over TCP without TLS; the script's keys go
    under a dedicated prefix with a one-minute TTL and are deleted afterwards.
    """
    name, target = "server cost: script rate vs return 1 (-P 16)", ">= 0.25x"
    parsed = parse_url(url)
    if parsed.kind != "redis" or parsed.tls or shutil.which("redis-benchmark") is None:
        return Figure(
            "server_cost", name, "req/s", None, None, None, target, None,
            "skipped: needs redis-benchmark on PATH and a redis:// single node",
        )
    client = sync_client(url, timeout_seconds)
    prefix = f"bench{uuid.uuid4().hex[:4]}"
    try:
        floor_sha = client.script_load("return 1")
        ours_sha = client.script_load(script_source())
        call = "A" * 16 + "B" * 5 + "C" * 5  # ARGV[1]: call hash 16, call id 5, ttl 5 (no NUL in argv)
        ours_command = ["EVALSHA", ours_sha, "1", f"{prefix}:__rand_int__", call, "1000000",
                        "60000", "\x06searchbench-session"]
        floors, ourses = [], []
        for _ in range(3):  # alternate, and take medians: the two share the machine's cores
            floors.append(_benchmark_rate(parsed, ["EVALSHA", floor_sha, "0"], requests))
            ourses.append(_benchmark_rate(parsed, ours_command, requests))
        floor, ours = statistics.median(floors), statistics.median(ourses)
        for batch in _batched(client.scan_iter(match=f"{prefix}:*", count=1000), 1000):
            client.delete(*batch)
    finally:
        client.close()
    return _ratio_figure(
        "server_cost", name, "req/s", ours, floor, at_least=0.25,
        note=(f"redis-benchmark -n {requests} -P 16 -r {SERVER_COST_SESSIONS} (sessions checked "
              f"again and again, as in production), 3 alternating runs; keys under {prefix!r} deleted"),
        samples=requests,
    )


def _batched(items: Any, size: int) -> Any:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


# -- (d) in process -------------------------------------------------------------------------


def _floor_hash(args: Any) -> str:
    text = json.dumps(args, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def inprocess_check(
    *, rounds: int = 40, block: int = 500, step: Step = _no_step
) -> Figure:
    """`LoopBrake.check` (small arguments) vs sha256 of stdlib canonical-ish JSON, per call."""
    brake = LoopBrake(3)
    session = "bench"

    def ours(n: int) -> float:
        check = brake.check
        start = time.perf_counter()
        for i in range(n):
            check("search", SMALL_ARGS[i & 1], session_id=session)
        return (time.perf_counter() - start) / n

    def floor(n: int) -> float:
        start = time.perf_counter()
        for i in range(n):
            _floor_hash(SMALL_ARGS[i & 1])
        return (time.perf_counter() - start) / n

    ours(block)
    floor(block)
    ours_t: list[float] = []
    floor_t: list[float] = []
    for index in range(rounds):
        floor_t.append(floor(block))
        ours_t.append(ours(block))
        step("inprocess_check", index + 1, rounds)
    return _ratio_figure(
        "inprocess_check", "in-process LoopBrake.check", "µs",
        statistics.median(ours_t) * 1e6, statistics.median(floor_t) * 1e6,
        at_most=1.5, samples=rounds * block,
    )


def nested_document(size: int = 1_000_000, seed: int = 7) -> dict[str, Any]:
    """A deterministic nested dict whose JSON is about `size` bytes.

    It looks like a big tool argument: records with strings, paths, ints,
    two-decimal floats, bools, nulls, nested objects and lists.
    """
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "search", "file", "path", "query", "result",
             "value", "Zürich", "naïve", "日本"]
    items: list[dict[str, Any]] = []
    total = 0
    index = 0
    while total < size:
        item = {
            "id": index,
            "name": " ".join(rng.choice(words) for _ in range(4)),
            "tags": [rng.choice(words) for _ in range(3)],
            "score": round(rng.random() * 100, 2),
            "active": rng.random() < 0.5,
            "meta": {
                "owner": f"user{rng.randrange(1000)}",
                "path": f"/srv/data/{rng.randrange(10**6)}.json",
                "depth": rng.randrange(10),
                "note": None,
            },
        }
        items.append(item)
        total += len(json.dumps(item)) + 1
        index += 1
    return {"query": "bulk import", "items": items}


def call_hash_1mb(*, repeats: int = 11, step: Step = _no_step) -> Figure:
    """`call_hash` of a ~1 MB nested dict vs `json.dumps(sort_keys=True)` + sha256."""
    document = nested_document()

    def ours() -> float:
        start = time.perf_counter()
        call_hash("import", document)
        return time.perf_counter() - start

    def floor() -> float:
        start = time.perf_counter()
        hashlib.sha256(json.dumps(document, sort_keys=True).encode("utf-8")).hexdigest()
        return time.perf_counter() - start

    ours()
    floor()
    ours_t: list[float] = []
    floor_t: list[float] = []
    for index in range(repeats):
        floor_t.append(floor())
        ours_t.append(ours())
        step("call_hash_1mb", index + 1, repeats)
    size = len(json.dumps(document))
    return _ratio_figure(
        "call_hash_1mb", f"call_hash of a {size / 1e6:.1f} MB dict", "ms",
        statistics.median(ours_t) * 1e3, statistics.median(floor_t) * 1e3,
        at_most=0.5, samples=repeats,
    )


# -- all of them ------------------------------------------------------------------------------

STAGES = {
    "sync_check_latency": ("sync check latency (median)", "µs", "<= 1.2x"),
    "async_throughput": (f"async throughput, {CONCURRENCY} tasks", "checks/s", ">= 2x"),
    "memory_per_session": ("Redis memory per session", "bytes", "<= 240 B"),
    "inprocess_check": ("in-process LoopBrake.check", "µs", "<= 1.5x"),
    "call_hash_1mb": ("call_hash of a ~1 MB dict", "ms", "<= 0.5x"),
    "server_cost": ("server cost: script rate vs return 1 (-P 16)", "req/s", ">= 0.25x"),
}


def _failed(key: str, error: BaseException) -> Figure:
    name, unit, target = STAGES[key]
    if isinstance(error, LoopBrakeError):
        why = (f"a benchmark check was denied ({error.count} >= {error.max_repeats}); "
               "run with max_repeats >= 3")
    else:
        why = f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"
    return Figure(key, name, unit, None, None, None, target, False, f"failed: {why}")


def run_bench(
    url: str = "memory://", *, quick: bool = False, sessions: int | None = None,
    timeout_seconds: float = 5.0, step: Step = _no_step, only: Collection[str] = (),
) -> BenchReport:
    """Every figure (or those named in `only`), in the order of `STAGES`.

    `quick` is a small run (seconds, noisier figures).

    A figure whose measurement fails is reported as failed (with the error
    class and message in its note) and the others are still measured.
    """
    if sessions is None:
        sessions = QUICK_SESSIONS if quick else DEFAULT_SESSIONS
    t = timeout_seconds
    runs: dict[str, Callable[[], Figure]] = {
        "sync_check_latency": (
            (lambda: sync_check_latency(url, rounds=4, block=150, warmup=100,
                                        timeout_seconds=t, step=step))
            if quick else (lambda: sync_check_latency(url, timeout_seconds=t, step=step))
        ),
        "async_throughput": (
            (lambda: async_throughput(url, per_task=40, rounds=3, timeout_seconds=t, step=step))
            if quick else (lambda: async_throughput(url, timeout_seconds=t, step=step))
        ),
        "memory_per_session": lambda: memory_per_session(
            url, sessions=sessions, timeout_seconds=t, step=step),
        "inprocess_check": (
            (lambda: inprocess_check(rounds=5, block=1000, step=step))
            if quick else (lambda: inprocess_check(step=step))
        ),
        "call_hash_1mb": (
            (lambda: call_hash_1mb(repeats=3, step=step))
            if quick else (lambda: call_hash_1mb(step=step))
        ),
        "server_cost": lambda: server_cost(
            url, requests=20_000 if quick else 200_000, timeout_seconds=t),
    }
    figures = []
    unknown = sorted(set(only) - set(STAGES))
    if unknown:
        raise ValueError(f"unknown figure(s) {', '.join(unknown)}; known: {', '.join(STAGES)}")
    for key in STAGES:
        if only and key not in only:
            continue
        try:
            figures.append(runs[key]())
        except Exception as error:  # reported as a failed figure
            figures.append(_failed(key, error))
    return BenchReport(redact_url(url), quick, figures)
