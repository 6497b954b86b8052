"""A benchmark figure (ours against its floor), how both are timed, and the figures measured in-process.

Every figure is a ratio to the cheapest thing that could do the same job on
the same machine, so that the numbers travel between machines. Here:

* `inprocess_check`: `LoopBrake.check` (small arguments) against
  `sha256(json.dumps(args, sort_keys=True, separators=(",", ":")))`;
* `call_hash_1mb`: `call_hash` of a ~1 MB nested dict against stdlib
  `json.dumps(sort_keys=True)` + sha256;
* `import_time` and `cli_startup`: a fresh process's CPU time for `import
  distbrake` against importing its own dependencies, and for `distbrake
  --version`/`--help` against `import click`.

Timing uses `time.perf_counter`, warm-ups, interleaved blocks of ours and the
floor (so drift hits both alike) and medians. The figures measured on a
server are in `bench_server`; `bench.run_bench` runs them all.
"""

from __future__ import annotations

import hashlib
import json
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from distbrake import LoopBrake, call_hash

#: `step(stage, done, total)`: progress of one stage, in that stage's own units.
Step = Callable[[str, int, int], None]

SMALL_ARGS = ({"query": "weather in Paris", "limit": 5}, {"query": "weather in Lyon", "limit": 5})


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


def ratio_figure(
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


def no_step(stage: str, done: int, total: int) -> None:
    return None


def paired(floor: Callable[[int], object], ours: Callable[[int], object], n: int) -> tuple[list[float], list[float]]:
    """`n` pairs, the floor's call `floor(i)` then ours `ours(i)`, so both see the same noise: (ours', the floor's)."""
    clock = time.perf_counter
    ours_t: list[float] = []
    floor_t: list[float] = []
    for i in range(n):
        start = clock()
        floor(i)
        middle = clock()
        ours(i)
        end = clock()
        floor_t.append(middle - start)
        ours_t.append(end - middle)
    return ours_t, floor_t


def paired_rounds(
    floor: Callable[[int], object], ours: Callable[[int], object], *, warmup: int, rounds: int, block: int,
    key: str, step: Step, between: Callable[[], object] | None = None,
) -> tuple[list[list[float]], list[list[float]]]:
    """`warmup` pairs, then `rounds` blocks of `block` pairs (`between` after each): (ours' blocks, the floor's)."""
    paired(floor, ours, warmup)
    ours_r: list[list[float]] = []
    floor_r: list[list[float]] = []
    for index in range(rounds):
        ours_t, floor_t = paired(floor, ours, block)
        ours_r.append(ours_t)
        floor_r.append(floor_t)
        if between is not None:
            between()
        step(key, index + 1, rounds)
    return ours_r, floor_r


def flat(blocks: list[list[float]]) -> list[float]:
    """The timings of every block, in one list."""
    return [t for block in blocks for t in block]


def interleaved(
    stage: str, ours: Callable[[], float], floor: Callable[[], float], rounds: int, step: Step,
) -> tuple[list[float], list[float]]:
    """Warm both up, then `rounds` of the floor and ours in turn: (ours' timings, the floor's)."""
    ours()
    floor()
    ours_t: list[float] = []
    floor_t: list[float] = []
    for index in range(rounds):
        floor_t.append(floor())
        ours_t.append(ours())
        step(stage, index + 1, rounds)
    return ours_t, floor_t


# -- (d) in process -------------------------------------------------------------------------


def _floor_hash(args: Any) -> str:
    text = json.dumps(args, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def inprocess_check(
    *, rounds: int = 40, block: int = 500, step: Step = no_step
) -> Figure:
    """`LoopBrake.check` (small arguments) vs sha256 of stdlib canonical-ish JSON, per call."""
    brake = LoopBrake(3)
    session = "bench"

    def ours() -> float:
        check = brake.check
        start = time.perf_counter()
        for i in range(block):
            check("search", SMALL_ARGS[i & 1], session_id=session)
        return (time.perf_counter() - start) / block

    def floor() -> float:
        start = time.perf_counter()
        for i in range(block):
            _floor_hash(SMALL_ARGS[i & 1])
        return (time.perf_counter() - start) / block

    ours_t, floor_t = interleaved("inprocess_check", ours, floor, rounds, step)
    return ratio_figure(
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


def call_hash_1mb(*, repeats: int = 11, step: Step = no_step) -> Figure:
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

    ours_t, floor_t = interleaved("call_hash_1mb", ours, floor, repeats, step)
    size = len(json.dumps(document))
    return ratio_figure(
        "call_hash_1mb", f"call_hash of a {size / 1e6:.1f} MB dict", "ms",
        statistics.median(ours_t) * 1e3, statistics.median(floor_t) * 1e3,
        at_most=0.5, samples=repeats,
    )


# -- (f) start-up ---------------------------------------------------------------------------------


def _cpu_seconds(argv: list[str]) -> float:
    """The CPU time (user + system) one run of `argv` took: steadier than wall time on a busy machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _startup(key: str, name: str, ours: list[list[str]], floor: list[str], at_most: float,
             rounds: int, step: Step) -> Figure:
    """The slowest of `ours` against `floor`, each the median CPU time of `rounds` interleaved runs."""
    timings: list[list[float]] = [[] for _ in ours]
    floor_t: list[float] = []
    for index in range(rounds):
        floor_t.append(_cpu_seconds(floor))
        for argv, out in zip(ours, timings, strict=True):
            out.append(_cpu_seconds(argv))
        step(key, index + 1, rounds)
    slowest = max(statistics.median(out) for out in timings)
    return ratio_figure(key, name, "ms", slowest * 1e3, statistics.median(floor_t) * 1e3,
                        at_most=at_most, samples=rounds, note="CPU time of a fresh process, median")


def import_time(*, rounds: int = 15, step: Step = no_step) -> Figure:
    """`python -c "import distbrake"` vs `python -c "import redis, pydantic_settings"` (its own dependencies)."""
    python = sys.executable
    return _startup("import_time", "import distbrake vs import redis, pydantic_settings",
                    [[python, "-c", "import distbrake"]], [python, "-c", "import redis, pydantic_settings"],
                    1.1, rounds, step)


def cli_startup(*, rounds: int = 15, step: Step = no_step) -> Figure:
    """`distbrake --version` and `--help` (the slower) vs `python -c "import click"`."""
    python = sys.executable
    return _startup("cli_startup", "distbrake --version / --help vs import click",
                    [[python, "-m", "distbrake", "--version"], [python, "-m", "distbrake", "--help"]],
                    [python, "-c", "import click"], 2.0, rounds, step)
