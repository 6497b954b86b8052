"""The figures against the raw-socket floors: one sync check, and the server's cost per call.

* `sync_check_raw`: a sync `DistributedBrake.check` (small arguments)
  against a Python socket writing the pre-encoded bytes of `EVALSHA <sha of
  "return 1"> 0` and parsing the reply with hiredis, one of each in turn.
  With `--pin-cpu` the client and a local server share one CPU (the state
  of a busy machine, reproduced steadily); without, on an idle machine each
  round trip is dominated by CPU wake-ups, which hides the client's cost.
  The note adds the same checks' bytes, encoded beforehand, written by the
  raw socket: the script's own share, the least a check can take.
* `server_cost`: the server's CPU time per `EVALSHA return 1` against per
  check of the brake on the realistic path: 10,000 UUID sessions whose
  streaks go on, each call with a fresh call id, so every check writes its
  record. redis-benchmark cannot vary an argument's bytes per call, so the
  load is ours: pre-encoded distinct checks (the bytes the brake sends)
  written 16 per write on 4 connections, and the server's CPU time read
  from INFO before and after. The figure is the ratio of the rates per
  second of server CPU. The note adds the same checks sent to a script of
  the record's three commands and no logic: the least this record can cost.
"""

from __future__ import annotations

import functools
import itertools
import statistics
import uuid
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec

from distbrake import BrakeSettings, DistributedBrake
from distbrake.core import PreparedCall
from distbrake.model import Rules
from distbrake.redis import connect, wire

from .floors import RawConnection, pinned, resp, server_pid, server_seconds_per_call
from .local import SMALL_ARGS, Figure, Step, no_step, paired_rounds, ratio_figure
from .server import FLOOR_SCRIPT, MEMORY_TOOL, SERVER_COST_SESSIONS, bench_brake, memory_note

__all__ = ["server_cost", "sync_check_raw"]

CONNECTIONS = 4
DEPTH = 16
RAW_KINDS = ("redis", "unix")


SYNC_RAW = ("sync_check_raw", "sync check vs raw-socket EVALSHA return 1")
SERVER_COST = ("server_cost", "server cost, realistic path: script vs return 1")
P = ParamSpec("P")
Measure = Callable[Concatenate[BrakeSettings, P], Figure]


def single_node(key: str, name: str, unit: str, target: str) -> Callable[[Measure[P]], Measure[P]]:
    """A figure measured on a redis:// or unix:// single node: on any other backend it is skipped."""
    def decorate(figure: Measure[P]) -> Measure[P]:
        @functools.wraps(figure)
        def measured(backend: BrakeSettings, /, *args: P.args, **kwargs: P.kwargs) -> Figure:
            if backend.parsed_url.connector not in RAW_KINDS:
                return Figure(key, name, unit, None, None, None, target, None,
                              "skipped: needs a redis:// or unix:// single node")
            return figure(backend, *args, **kwargs)

        return measured

    return decorate


@single_node(*SYNC_RAW, "µs", "<= 1.6x")
def sync_check_raw(
    backend: BrakeSettings, *, rounds: int = 10, block: int = 500, warmup: int = 300,
    timeout_seconds: float = 2.0, pin_cpu: bool = False, step: Step = no_step,
) -> Figure:
    """Median sync check vs the raw-socket `EVALSHA return 1` round trip, interleaved, per round."""
    key, name = SYNC_RAW
    parsed = backend.parsed_url
    prefix = f"bnch{uuid.uuid4().hex[:5]}"
    brake = bench_brake(DistributedBrake, backend, prefix, timeout_seconds)
    info = brake.client.info("server")
    raw = RawConnection(parsed, timeout_seconds)
    try:
        sha = raw.call(resp("SCRIPT", "LOAD", FLOOR_SCRIPT)).decode("ascii")
        floor_bytes = resp("EVALSHA", sha, 0)
        session = f"bench-{uuid.uuid4()}"
        call, check = raw.call, brake.check

        def floor(i: int) -> object:
            return call(floor_bytes)

        def ours(i: int) -> object:
            return check("search", SMALL_ARGS[i & 1], session_id=session)

        # The same checks' bytes, encoded beforehand and written by the raw socket: what the script
        # alone costs the round trip, with no client work at all (the least `ours` can be).
        wire_session = f"bench-{uuid.uuid4()}"
        prepared = [brake.prepare("search", args, wire_session) for args in SMALL_ARGS]  # the tool's rules too
        encoded = [brake.encode(call)[2] for call in prepared if isinstance(call, PreparedCall)]

        def wire(i: int) -> object:
            return call(encoded[i & 1])

        wire_note = "n/a (the tool is exempt here)"
        with pinned(pin_cpu, server_pid(parsed, info)) as how:
            ours_r, floor_r = paired_rounds(floor, ours, warmup=warmup, rounds=rounds, block=block, key=key, step=step)
            if len(encoded) == len(SMALL_ARGS):
                wire_r, wire_floor_r = paired_rounds(floor, wire, warmup=warmup, rounds=rounds, block=block,
                                                     key=key, step=no_step)
                wire_note = "%.2fx" % (statistics.median(statistics.median(t) for t in wire_r)  # as the figure's
                                       / statistics.median(statistics.median(t) for t in wire_floor_r))
        ours_m = [statistics.median(t) for t in ours_r]
        floor_m = [statistics.median(t) for t in floor_r]
        brake.clear(session)
        brake.clear(wire_session)
    finally:
        raw.close()
        brake.close()
    ratios = sorted(o / f for o, f in zip(ours_m, floor_m, strict=True))
    return ratio_figure(
        key, name, "µs", statistics.median(ours_m) * 1e6, statistics.median(floor_m) * 1e6,
        at_most=1.6, samples=rounds * block,
        note=" ".join(filter(None, (f"{how}; median of {rounds} rounds' medians "
                                    f"(ratios {ratios[0]:.2f}-{ratios[-1]:.2f}); the same checks' bytes "
                                    f"encoded beforehand, from the raw socket (the script alone, no client "
                                    f"work): {wire_note}", memory_note(backend)))),
    )


# The commands a check needs on its record, and no logic: the least a script keeping this record can cost.
COMMANDS_ONLY = """local key = KEYS[1]
redis.call('HGET', key, 'h')
redis.call('HSET', key, 'h', ARGV[1], 'j', ARGV[7])
redis.call('PEXPIRE', key, ARGV[4])
return 4"""


def _checks(
    prefix: str, sessions: list[str], digests: list[str], count: int, start: int, sha: str | None = None,
) -> list[bytes]:
    """`count` pre-encoded checks, session after session: each continues its streak with a fresh call id
    (sent to the script `sha` instead of the brake's, when given)."""
    ttl_ms, window_ms = 60_000, 5_000
    out = []
    for i in range(start, start + count):
        index = i % len(sessions)
        call = PreparedCall(MEMORY_TOOL, digests[index], sessions[index], None, Rules(1_000_000))
        key, argv, packed = wire.encode_call(call, prefix, ttl_ms, window_ms)
        out.append(packed if sha is None else resp("EVALSHA", sha, 1, key, *argv))
    return out


@single_node(*SERVER_COST, "req/s", ">= 0.3x")
def server_cost(
    backend: BrakeSettings, *, requests: int = 200_000, rounds: int = 5, timeout_seconds: float = 5.0,
    step: Step = no_step,
) -> Figure:
    """The brake's checks (realistic path) per second of server CPU vs `EVALSHA return 1`, interleaved."""
    key, name = SERVER_COST
    parsed = backend.parsed_url
    prefix = f"bench{uuid.uuid4().hex[:4]}"
    bare_prefix = f"{prefix}b"  # the bare script's records: keys of their own
    connections = [RawConnection(parsed, timeout_seconds) for _ in range(CONNECTIONS)]
    info = RawConnection(parsed, timeout_seconds)
    per_round = max(DEPTH * CONNECTIONS, requests // rounds)
    try:
        floor_sha = info.call(resp("SCRIPT", "LOAD", FLOOR_SCRIPT)).decode("ascii")
        bare_sha = info.call(resp("SCRIPT", "LOAD", COMMANDS_ONLY)).decode("ascii")
        info.call(resp("SCRIPT", "LOAD", wire.script_source()))
        sessions = [str(uuid.uuid4()) for _ in range(SERVER_COST_SESSIONS)]
        digests = [uuid.uuid4().hex * 2 for _ in sessions]
        floor_calls = [resp("EVALSHA", floor_sha, 0)] * per_round
        # Every session's streak starts first (not timed): the timed checks all continue one.
        server_seconds_per_call(connections, info, _checks(prefix, sessions, digests, len(sessions), 0), DEPTH)
        server_seconds_per_call(  # and so do the bare script's records
            connections, info, _checks(bare_prefix, sessions, digests, len(sessions), 0, bare_sha), DEPTH)
        floors: list[float] = []
        ourses: list[float] = []
        bares: list[float] = []
        done = len(sessions)
        for index in range(rounds):
            checks = _checks(prefix, sessions, digests, per_round, done)
            bare = _checks(bare_prefix, sessions, digests, per_round, done, bare_sha)
            done += per_round
            floors.append(1 / server_seconds_per_call(connections, info, floor_calls, DEPTH))
            ourses.append(1 / server_seconds_per_call(connections, info, checks, DEPTH))
            bares.append(1 / server_seconds_per_call(connections, info, bare, DEPTH))
            step(key, index + 1, rounds)
        _delete(parsed, prefix, timeout_seconds)
        _delete(parsed, bare_prefix, timeout_seconds)
    finally:
        for connection in (*connections, info):
            connection.close()
    return ratio_figure(
        key, name, "req/s", statistics.median(ourses), statistics.median(floors), at_least=0.3,
        note=(f"per second of server CPU (INFO used_cpu_*): our raw-socket load, {DEPTH} pre-encoded "
              f"commands per write on {CONNECTIONS} connections; {SERVER_COST_SESSIONS} UUID sessions, "
              f"every check continuing its streak with a fresh call id; median of {rounds} alternating "
              f"rounds of {per_round}; the same checks sent to a script of the record's three commands "
              f"alone (HGET, HSET, PEXPIRE, no logic): {statistics.median(bares) / statistics.median(floors):.2f}x; "
              f"keys under {prefix!r} and {bare_prefix!r} deleted"),
        samples=rounds * per_round,
    )


def _delete(parsed: Any, prefix: str, timeout_seconds: float) -> None:
    client = connect.sync_client(parsed, timeout_seconds)
    try:
        keys = client.scan_iter(match=f"{prefix}:*", count=1000)
        while batch := list(itertools.islice(keys, 1000)):
            client.delete(*batch)
    finally:
        client.close()
