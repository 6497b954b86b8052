"""The benchmark figures measured on the server at --url: latency, rules, throughput, memory.

* `sync_check_latency`: a sync `DistributedBrake.check` (small arguments)
  against redis-py sending `EVALSHA` of `return 1` to the same server;
* `async_throughput`: checks per second of `AsyncDistributedBrake` at 64
  concurrent tasks against redis.asyncio sending one unpipelined
  `EVALSHA return 1` per task at 64 tasks;
* `memory_per_session`: Redis `used_memory` growth per session record (UUID
  session ids, 29-character call ids, TTL set), under a dedicated key prefix
  that is cleared afterwards (only on a real Redis: never `memory://`);
* (the raw-socket figures are in `bench_raw`, the other asyncio ones in
  `bench_async`, the Cluster ones in `bench_cluster`).

Each takes the run's settings for their backend URL (parsed once, never
again); the benchmark's brakes use their own key prefix, fail closed, and take
any other setting from the environment.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from distbrake import AsyncDistributedBrake, BrakeOptions, BrakeSettings, DistributedBrake, ToolRules
from distbrake.killswitch import KillSwitch
from distbrake.redis import connect
from distbrake.settings import load_settings

from .local import SMALL_ARGS, Figure, Step, flat, no_step, paired_rounds, ratio_figure

FLOOR_SCRIPT = "return 1"
CONCURRENCY = 64
DEFAULT_SESSIONS = 20_000
QUICK_SESSIONS = 2_000
CALL_ID_CHARS = 29
SERVER_COST_SESSIONS = 10_000
MEMORY_TOOL = "get_weather_forecast"  # a realistic tool name (12-24 characters)

AnyBrake = TypeVar("AnyBrake", DistributedBrake, AsyncDistributedBrake)


def bench_brake(kind: type[AnyBrake], backend: BrakeSettings, prefix: str, timeout: float) -> AnyBrake:
    """A brake of `kind` on `backend`'s server under `prefix`, failing closed (as `from_url` makes it)."""
    return kind.from_url(backend.url, key_prefix=prefix, timeout_seconds=timeout, on_backend_error="closed")


def _is_memory(backend: BrakeSettings) -> bool:
    return backend.parsed_url.connector == "memory"


def memory_note(backend: BrakeSettings) -> str:
    if _is_memory(backend):
        return "memory:// is the embedded fakeredis (no network); the target is meant for a real Redis"
    return ""


# -- (a) sync check latency ------------------------------------------------------------


def sync_check_latency(
    backend: BrakeSettings, *, rounds: int = 10, block: int = 500, warmup: int = 300,
    timeout_seconds: float = 2.0, step: Step = no_step,
) -> Figure:
    """Median latency of one sync check vs one redis-py `EVALSHA return 1`, same server.

    Each check alternates between two small argument sets in one session, so
    every check is allowed and writes its record (the common case of an agent
    that is not looping).
    """
    prefix = f"bnch{uuid.uuid4().hex[:5]}"
    brake = bench_brake(DistributedBrake, backend, prefix, timeout_seconds)
    floor_client = connect.sync_client(backend.parsed_url, timeout_seconds)
    try:
        sha = floor_client.script_load(FLOOR_SCRIPT)
        floor_key = f"{prefix}:floor"
        session = f"bench-{uuid.uuid4()}"

        def floor(i: int) -> object:
            return floor_client.evalsha(sha, 1, floor_key)

        def ours(i: int) -> object:
            return brake.check("search", SMALL_ARGS[i & 1], session_id=session)

        ours_r, floor_r = paired_rounds(floor, ours, warmup=warmup, rounds=rounds, block=block,
                                        key="sync_check_latency", step=step)
        ours_t, floor_t = flat(ours_r), flat(floor_r)
        brake.clear(session)
    finally:
        brake.close()
        floor_client.close()
    return ratio_figure(
        "sync_check_latency", "sync check latency (median)", "µs",
        statistics.median(ours_t) * 1e6, statistics.median(floor_t) * 1e6,
        at_most=1.2, note=memory_note(backend), samples=len(ours_t),
    )


# -- (a2) what the opt-in rules cost a sync check ----------------------------------------------

ONCE_TOOL = "send_email"
ONCE_SESSION_CALLS = 8  # the ladder figure's sessions: 8 once-only calls each (a session keeps at most 64)

# figure key: (the rules' options, the bound as a ratio to the same check with every rule off)
RULES: dict[str, tuple[BrakeOptions, float]] = {
    "rules_warn_shadow": (BrakeOptions(warn_at=2, enforce=False), 1.1),
    "rules_cycles": (BrakeOptions(max_cycle_period=4, cycle_repeats=3), 1.2),
    # a progress-aware tool: its check, then the observation of its result (one more round trip)
    "rules_progress": (BrakeOptions(tools={"search": ToolRules(progress=True)}), 2.2),
    # the ladder (issue 24): sessions halt at 5 in a row, and a tool is once-only; the figure checks that tool
    # (each check a new call, so it runs: looked up among the session's once-only calls, then kept there)
    "rules_ladder": (BrakeOptions(halt_at=5, tools={ONCE_TOOL: ToolRules(once=True)}), 1.1),
}
STAGE_NAMES = {
    "rules_warn_shadow": "sync check, warn_at + shadow mode vs rules off",
    "rules_cycles": "sync check, cycles on (period 4 x 3) vs rules off",
    "rules_progress": "sync check + observe of a progress tool vs rules off",
    "rules_ladder": "sync check, halt_at + a once-only tool's new call vs rules off",
}
ROTATING_ARGS = tuple({"query": f"weather in city {i}", "limit": 5} for i in range(5))  # period 5: never a cycle


def rules_cost(
    backend: BrakeSettings, key: str, *, rounds: int = 10, block: int = 400, warmup: int = 200,
    timeout_seconds: float = 2.0, step: Step = no_step,
) -> Figure:
    """Median sync check with the rules of `key` on vs the same check with every rule off, interleaved.

    Both brakes check five calls in turn in their own session (every check
    allowed and written, the ring full and never a cycle), one check of each
    at a time, so both see the same noise. `rules_ladder` checks its
    once-only tool instead, a new call each time, in sessions of
    ONCE_SESSION_CALLS; its note adds, from the same rounds' method, the
    same with one session (its once-only calls at their bound, 64) and a
    check of a tool that is not once-only (what the ladder costs the others).
    """
    options, bound = RULES[key]
    prefix = f"bnch{uuid.uuid4().hex[:5]}"
    plain = bench_brake(DistributedBrake, backend, prefix, timeout_seconds)
    ruled = DistributedBrake(plain.client, settings=load_settings(plain.settings, **options))
    new_calls = itertools.count()

    def rotating(i: int) -> object:
        return ROTATING_ARGS[i % 5]

    def fresh(i: int) -> object:
        return {"to": "ops@example.com", "subject": f"report {next(new_calls)}"}

    def measured(tool: str, args_of: Callable[[int], object], per_session: int) -> tuple[list[float], list[float]]:
        """(ours', the floor's timings) of `tool`'s calls `args_of(i)`, a session of each brake per
        `per_session` checks (0: one session)."""
        base, made = uuid.uuid4(), [itertools.count(), itertools.count()]

        def session(side: int) -> str:
            done = next(made[side])
            return f"bench-{base}-{side}-{done // per_session if per_session else 0}"

        def floor(i: int) -> object:
            return plain.check(tool, args_of(i), session_id=session(0))

        def ours(i: int) -> object:
            verdict = ruled.check(tool, args_of(i), session_id=session(1))
            if verdict.observe_token is not None:
                ruled.observe(verdict, {"status": "running"})
            return verdict

        ours_r, floor_r = paired_rounds(floor, ours, warmup=warmup, rounds=rounds, block=block, key=key, step=step)
        return flat(ours_r), flat(floor_r)

    try:
        note = memory_note(backend)
        if key == "rules_ladder":
            ours_t, floor_t = measured(ONCE_TOOL, fresh, ONCE_SESSION_CALLS)
            full = measured(ONCE_TOOL, fresh, 0)
            others = measured("search", rotating, 0)
            note = "; ".join(filter(None, (
                f"sessions of {ONCE_SESSION_CALLS} once-only calls; in the same run, one session (its once-only "
                f"calls at their bound, 64): {_ratio(full):.2f}x; a check of a tool that is not once-only: "
                f"{_ratio(others):.2f}x", note)))
        else:
            ours_t, floor_t = measured("search", rotating, 0)
        plain.clear_all()
    finally:
        plain.close()
    return ratio_figure(
        key, STAGE_NAMES[key], "µs",
        statistics.median(ours_t) * 1e6, statistics.median(floor_t) * 1e6,
        at_most=bound, note=note, samples=len(ours_t),
    )


def _ratio(timings: tuple[list[float], list[float]]) -> float:
    """The median of ours over the floor's, from (ours' timings, the floor's)."""
    return statistics.median(timings[0]) / statistics.median(timings[1])


KILL_SWITCH_NAME = "sync check, kill switch read in the background vs none"
KILL_SWITCH_BOUND = 1.1  # "no measurable cost": within the noise bound of the cheapest rule figure


def kill_switch_cost(
    backend: BrakeSettings, *, rounds: int = 10, block: int = 400, warmup: int = 200,
    timeout_seconds: float = 2.0, step: Step = no_step,
) -> Figure:
    """Median sync check of a brake that reads the fleet's kill switch (its reader thread running, each check
    testing one attribute) vs the same check of a brake without one (an inert switch), interleaved.

    Both check five calls in turn in their own session, as `rules_cost`.
    """
    prefix = f"bnch{uuid.uuid4().hex[:5]}"
    plain = bench_brake(DistributedBrake, backend, prefix, timeout_seconds)
    plain.switch = KillSwitch("redis")  # type: ignore[assignment]  # never set, and no reader: no kill switch
    watched = DistributedBrake(plain.client, settings=plain.settings)
    try:
        plain_session, watched_session = f"bench-{uuid.uuid4()}", f"bench-{uuid.uuid4()}"

        def floor(i: int) -> object:
            return plain.check("search", ROTATING_ARGS[i % 5], session_id=plain_session)

        def ours(i: int) -> object:
            return watched.check("search", ROTATING_ARGS[i % 5], session_id=watched_session)

        ours_r, floor_r = paired_rounds(
            floor, ours, warmup=warmup, rounds=rounds, block=block, key="kill_switch_cost", step=step)
        ours_t, floor_t = flat(ours_r), flat(floor_r)
        assert watched.switch._running, "the kill switch's reader did not run during the benchmark"
        plain.clear(plain_session)
        plain.clear(watched_session)
    finally:
        watched.switch.close()
        plain.close()
    return ratio_figure(
        "kill_switch_cost", KILL_SWITCH_NAME, "µs", statistics.median(ours_t) * 1e6,
        statistics.median(floor_t) * 1e6, at_most=KILL_SWITCH_BOUND, note=memory_note(backend),
        samples=len(ours_t),
    )


# -- (b) async throughput ----------------------------------------------------------------


async def _async_throughput(
    backend: BrakeSettings, *, concurrency: int, per_task: int, rounds: int,
    timeout_seconds: float, step: Step,
) -> tuple[float, float]:
    prefix = f"bnch{uuid.uuid4().hex[:5]}"
    brake = bench_brake(AsyncDistributedBrake, backend, prefix, timeout_seconds)
    floor_client = connect.async_client(backend.parsed_url, timeout_seconds)
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
    backend: BrakeSettings, *, concurrency: int = CONCURRENCY, per_task: int = 200,
    rounds: int = 5, timeout_seconds: float = 5.0, step: Step = no_step,
) -> Figure:
    """Checks/s of `AsyncDistributedBrake` vs unpipelined `EVALSHA return 1`, both at 64 tasks."""
    ours, floor = asyncio.run(
        _async_throughput(backend, concurrency=concurrency, per_task=per_task, rounds=rounds,
                          timeout_seconds=timeout_seconds, step=step)
    )
    return ratio_figure(
        "async_throughput", f"async throughput, {concurrency} tasks", "checks/s", ours, floor,
        at_least=2.0, note=memory_note(backend), samples=rounds * concurrency * per_task,
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
    backend: BrakeSettings, prefix: str, *, sessions: int, timeout_seconds: float, step: Step, key: str,
    measure: Callable[[], int],
) -> tuple[int, int, int]:
    """Fill `sessions` records; `used_memory` before and after, both with the brake's clients closed."""
    brake = bench_brake(AsyncDistributedBrake, backend, prefix, timeout_seconds)
    try:  # warm up (script cache), then forget the warm-up record
        await brake.check("search", SMALL_ARGS[0], session_id="warm-up", call_id=_call_id())
        await brake.clear("warm-up")
    finally:
        await brake.aclose()
    before = await asyncio.to_thread(measure)
    brake = bench_brake(AsyncDistributedBrake, backend, prefix, timeout_seconds)
    done = 0

    async def agent() -> None:  # 64 of these: a fleet's worth of concurrent checks
        nonlocal done
        while done < sessions:
            done += 1
            await brake.check(MEMORY_TOOL, SMALL_ARGS[0], session_id=str(uuid.uuid4()),
                              call_id=_call_id())
            if done % 500 == 0:
                step(key, done, sessions)

    try:
        try:
            await asyncio.gather(*(agent() for _ in range(CONCURRENCY)))
        finally:
            await brake.aclose()
        step(key, sessions, sessions)
        after = await asyncio.to_thread(measure)  # data only: the brake's clients are closed
    finally:
        brake = bench_brake(AsyncDistributedBrake, backend, prefix, timeout_seconds)
        try:
            cleared = await brake.clear_all()
        finally:
            await brake.aclose()
    return before, after, cleared


def memory_per_session(
    backend: BrakeSettings, *, sessions: int = DEFAULT_SESSIONS, timeout_seconds: float = 5.0,
    step: Step = no_step, key: str = "memory_per_session", bound: int = 240,
) -> Figure:
    """Redis `used_memory` growth per session record, under a dedicated prefix cleared afterwards.

    The prefix has the length of the default one ("distbrake", 9 characters),
    so the keys are the size they are in production; `used_memory` is read
    with the brake's clients closed (data only), summed over a cluster's
    masters. Only on a real Redis (and only on one you may fill with
    `sessions` short-lived keys).
    """
    name = "Redis memory per session" + (", Cluster" if backend.parsed_url.connector == "cluster" else "")
    target = f"<= {bound} B"
    if _is_memory(backend):
        return Figure(
            key, name, "bytes", None, None, None, target, None,
            "skipped: memory:// has no used_memory; run with --url redis://... (a server you may fill)",
        )
    prefix = f"bench{uuid.uuid4().hex[:4]}"  # 9 characters, like "distbrake"
    info_client = connect.sync_client(backend.parsed_url, timeout_seconds)
    try:
        before, after, cleared = asyncio.run(
            _fill(backend, prefix, sessions=sessions, timeout_seconds=timeout_seconds, step=step, key=key,
                  measure=lambda: _used_memory(info_client))
        )
    finally:
        info_client.close()
    per = (after - before) / sessions
    note = (f"{sessions} sessions under prefix {prefix!r}, clients closed when measured, "
            f"all cleared afterwards ({cleared})")
    return Figure(key, name, "bytes", per, None, None, target, per <= bound, note, sessions)
