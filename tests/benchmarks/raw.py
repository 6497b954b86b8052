"""The figures against the raw-socket floors: one sync check, and the server's cost per call.

* `sync_check_raw`: a sync `DistributedBrake.check` (small arguments)
  against a Python socket writing the pre-encoded bytes of `EVALSHA <sha of
  "return 1"> 0` and parsing the reply with hiredis, one of each in turn.
  With `--pin-cpu` the client and a local server share one CPU (the state
  of a busy machine, reproduced steadily); without, on an idle machine each
  round trip is dominated by CPU wake-ups, which hides the client's cost.
* `sync_check_wire`: the same sync check against the same checks' bytes,
  encoded beforehand and written by that raw socket: the script alone, no
  client work at all, the least a check can take (pinned as above).
* `server_cost` and `server_record`: the server's time per check of the
  brake on the realistic path (10,000 UUID sessions whose streaks go on,
  each call with a fresh call id, so every check writes its record): its
  CPU time, all in (INFO `used_cpu_*`), against `EVALSHA return 1`
  (`server_cost`); and its script time (INFO `commandstats`, as issue 29
  measures: client speed and the network I/O common to both do not enter)
  against the same checks sent to a bare script that only reads the
  record, writes its three fields and sets its TTL, with no logic
  (`server_record`: the least this record can cost the server; its note
  adds the bare script writing field h alone, all a streak that goes on
  writes now, and the all-in ratio). redis-benchmark cannot vary an
  argument's bytes per call, so the load is ours: pre-encoded distinct
  checks (the bytes the brake sends) written 16 per write on 4
  connections, and the server's counters read from INFO before and after,
  the loads in turn, round after round. Each figure is a ratio of rates.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import statistics
import uuid
from collections.abc import Callable, Iterator
from typing import Any, Concatenate, NamedTuple, ParamSpec

from distbrake import BrakeSettings, DistributedBrake, call_hash
from distbrake.core import PreparedCall
from distbrake.model import Rules
from distbrake.redis import connect, wire

from .floors import RawConnection, ServerTime, pinned, resp, server_pid, server_time_per_call
from .local import SMALL_ARGS, Figure, Step, no_step, paired_rounds, ratio_figure
from .server import FLOOR_SCRIPT, MEMORY_TOOL, SERVER_COST_SESSIONS, bench_brake, memory_note

__all__ = ["server_cost", "server_record", "sync_check_raw", "sync_check_wire"]

CONNECTIONS = 4
DEPTH = 16
RAW_KINDS = ("redis", "unix")


SYNC_RAW = ("sync_check_raw", "sync check vs raw-socket EVALSHA return 1")
SYNC_WIRE = ("sync_check_wire", "sync check vs its own bytes from a raw socket")
SERVER_COST = ("server_cost", "server cost, realistic path: script vs return 1")
SERVER_RECORD = ("server_record", "script time, realistic path: ours vs bare record script")
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
    with _raw_bench(backend, timeout_seconds) as (brake, raw, ours):
        floor_bytes = resp("EVALSHA", raw.call(resp("SCRIPT", "LOAD", FLOOR_SCRIPT)).decode("ascii"), 0)
        call = raw.call

        def floor(i: int) -> object:
            return call(floor_bytes)

        with pinned(pin_cpu, server_pid(backend.parsed_url, brake.client.info("server"))) as how:
            ours_r, floor_r = paired_rounds(floor, ours, warmup=warmup, rounds=rounds, block=block, key=key, step=step)
    return _round_medians(key, name, ours_r, floor_r, 1.6, how, backend)


@single_node(*SYNC_WIRE, "µs", "<= 1.3x")
def sync_check_wire(
    backend: BrakeSettings, *, rounds: int = 10, block: int = 500, warmup: int = 300,
    timeout_seconds: float = 2.0, pin_cpu: bool = False, step: Step = no_step,
) -> Figure:
    """Median sync check vs the same checks' bytes, encoded beforehand, from the raw socket (the script
    alone, no client work: what hashing, encoding, sending, reading and judging add), interleaved, per round."""
    key, name = SYNC_WIRE
    with _raw_bench(backend, timeout_seconds) as (brake, raw, ours):
        wire_session = f"bench-{uuid.uuid4()}"
        prepared = [brake.prepare("search", args, wire_session) for args in SMALL_ARGS]  # the tool's rules too
        encoded = [brake.encode(call)[2] for call in prepared if isinstance(call, PreparedCall)]
        if len(encoded) != len(SMALL_ARGS):
            return Figure(key, name, "µs", None, None, None, "<= 1.3x", None, "skipped: the tool is exempt here")
        call, encode = raw.call, brake.encode
        rules = next(made.rules for made in prepared if isinstance(made, PreparedCall))

        def floor(i: int) -> object:  # every check's bytes carry a fresh call id: each is counted, as ours are
            return call(encoded[i & 1])

        def least(i: int) -> object:  # the call hashed and packed (the brake's own code), sent by the raw socket
            return call(encode(PreparedCall("search", call_hash("search", SMALL_ARGS[i & 1]), wire_session, None,
                                            rules))[2])

        try:
            with pinned(pin_cpu, server_pid(backend.parsed_url, brake.client.info("server"))) as how:
                ours_r, floor_r = paired_rounds(floor, ours, warmup=warmup, rounds=rounds, block=block, key=key,
                                                step=step)
                least_r, least_floor_r = paired_rounds(floor, least, warmup=warmup, rounds=rounds, block=block,
                                                       key=key, step=step)
        finally:
            brake.clear(wire_session)
    least_m = statistics.median(statistics.median(t) for t in least_r)
    least_floor_m = statistics.median(statistics.median(t) for t in least_floor_r)
    figure = _round_medians(key, name, ours_r, floor_r, 1.3, how, backend)
    return dataclasses.replace(figure, note=(
        f"{figure.note}; the least a Python client of this script does, the call hashed and packed (the brake's "
        f"own code) and sent by the raw socket, interleaved with the floor in the same run: "
        f"{least_m * 1e6:.1f} / {least_floor_m * 1e6:.1f} µs, {least_m / least_floor_m:.2f}x"))


@contextlib.contextmanager
def _raw_bench(
    backend: BrakeSettings, timeout_seconds: float,
) -> Iterator[tuple[DistributedBrake, RawConnection, Callable[[int], object]]]:
    """A brake and a raw connection to its server, and the brake's check of two small calls in turn (`ours`).
    The brake's script is loaded first: the raw socket's pre-encoded EVALSHAs do not load it on NOSCRIPT."""
    brake = bench_brake(DistributedBrake, backend, f"bnch{uuid.uuid4().hex[:5]}", timeout_seconds)
    raw = RawConnection(backend.parsed_url, timeout_seconds)
    raw.call(resp("SCRIPT", "LOAD", brake.script.text))
    session = f"bench-{uuid.uuid4()}"
    check = brake.check

    def ours(i: int) -> object:
        return check("search", SMALL_ARGS[i & 1], session_id=session)

    try:
        yield brake, raw, ours
        brake.clear(session)
    finally:
        raw.close()
        brake.close()


def _round_medians(
    key: str, name: str, ours_r: list[list[float]], floor_r: list[list[float]], bound: float, how: str,
    backend: BrakeSettings,
) -> Figure:
    """The median of each round's medians, ours and the floor's, as a figure (`bound`: its upper bound)."""
    ours_m = [statistics.median(t) for t in ours_r]
    floor_m = [statistics.median(t) for t in floor_r]
    ratios = sorted(o / f for o, f in zip(ours_m, floor_m, strict=True))
    return ratio_figure(
        key, name, "µs", statistics.median(ours_m) * 1e6, statistics.median(floor_m) * 1e6,
        at_most=bound, samples=sum(len(t) for t in ours_r),
        note=" ".join(filter(None, (f"{how}; median of {len(ours_m)} rounds' medians "
                                    f"(ratios {ratios[0]:.2f}-{ratios[-1]:.2f})", memory_note(backend)))),
    )


# The bare record script (issue 29's floor): what a check needs of its record (read it, write its three fields,
# set its TTL) and no logic, sent the very ARGV of the brake's checks: the least a script keeping this record costs.
BARE_RECORD = """local key = KEYS[1]
redis.call('HGET', key, 'h')
redis.call('HSET', key, 'h', ARGV[1], 's', ARGV[5], 'j', ARGV[7])
redis.call('PEXPIRE', key, ARGV[4])
return 4"""
# The same, writing field h alone: all a streak that goes on writes now (shown beside the figure, in its note).
BARE_STREAK = BARE_RECORD.replace(", 's', ARGV[5], 'j', ARGV[7]", "")


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


class Loads(NamedTuple):
    """Rates of the loads (per second of one measure), the median of interleaved rounds: `EVALSHA return 1`, the
    brake's realistic checks, the same checks sent to the bare record script, and to it writing h alone."""

    floor: float
    ours: float
    bare: float
    bare_streak: float


class ServerRates(NamedTuple):
    """The loads' rates per second of server CPU, all in (`cpu`), and per second of script time (`script`)."""

    cpu: Loads
    script: Loads
    rounds: int
    per_round: int


_MEASURED: dict[tuple[str, int, int], ServerRates] = {}


def server_rates(backend: BrakeSettings, requests: int, rounds: int, timeout_seconds: float) -> ServerRates:
    """The three loads of `server_cost` and `server_record`, in turn, round after round (measured once per run
    and server: both figures read the same rounds)."""
    known = (backend.shown_url, requests, rounds)
    if known not in _MEASURED:
        _MEASURED[known] = _server_rates(backend, requests, rounds, timeout_seconds)
    return _MEASURED[known]


def _server_rates(backend: BrakeSettings, requests: int, rounds: int, timeout_seconds: float) -> ServerRates:
    parsed = backend.parsed_url
    prefix = f"bench{uuid.uuid4().hex[:4]}"
    bare_prefix = f"{prefix}b"  # the bare script's records: keys of their own
    connections = [RawConnection(parsed, timeout_seconds) for _ in range(CONNECTIONS)]
    info = RawConnection(parsed, timeout_seconds)
    per_round = max(DEPTH * CONNECTIONS, requests // rounds)
    try:
        floor_sha = info.call(resp("SCRIPT", "LOAD", FLOOR_SCRIPT)).decode("ascii")
        bare_sha = info.call(resp("SCRIPT", "LOAD", BARE_RECORD)).decode("ascii")
        streak_sha = info.call(resp("SCRIPT", "LOAD", BARE_STREAK)).decode("ascii")
        info.call(resp("SCRIPT", "LOAD", wire.script_source()))
        sessions = [str(uuid.uuid4()) for _ in range(SERVER_COST_SESSIONS)]
        digests = [uuid.uuid4().hex * 2 for _ in sessions]
        floor_calls = [resp("EVALSHA", floor_sha, 0)] * per_round
        # Every session's streak starts first (not timed): the timed checks all continue one.
        server_time_per_call(connections, info, _checks(prefix, sessions, digests, len(sessions), 0), DEPTH)
        server_time_per_call(  # and so do the bare script's records
            connections, info, _checks(bare_prefix, sessions, digests, len(sessions), 0, bare_sha), DEPTH)
        times: tuple[list[ServerTime], ...] = ([], [], [], [])
        done = len(sessions)
        for _ in range(rounds):
            checks = _checks(prefix, sessions, digests, per_round, done)
            bare = _checks(bare_prefix, sessions, digests, per_round, done, bare_sha)
            streak = _checks(bare_prefix, sessions, digests, per_round, done, streak_sha)
            done += per_round
            for load, out in zip((floor_calls, checks, bare, streak), times, strict=True):
                out.append(server_time_per_call(connections, info, load, DEPTH))
        _delete(parsed, prefix, timeout_seconds)
        _delete(parsed, bare_prefix, timeout_seconds)
    finally:
        for connection in (*connections, info):
            connection.close()
    cpu, script = (Loads(*(statistics.median(1 / getattr(time, measure) for time in out) for out in times))
                   for measure in ("cpu", "script"))
    return ServerRates(cpu, script, rounds, per_round)


SERVER_NOTE = ("per second of {measure}: our raw-socket load, {depth} pre-encoded commands per write on {connections} "
               "connections; {sessions} UUID sessions, every check continuing its streak with a fresh call id; median "
               "of {rounds} rounds of {per_round}, the loads in turn")
SERVER_CPU = "server CPU, all in (INFO used_cpu_*)"
SCRIPT_TIME = "script time (INFO commandstats)"


def _server_note(rates: ServerRates, measure: str, extra: str) -> str:
    return SERVER_NOTE.format(measure=measure, depth=DEPTH, connections=CONNECTIONS, sessions=SERVER_COST_SESSIONS,
                              rounds=rates.rounds, per_round=rates.per_round) + "; " + extra


@single_node(*SERVER_COST, "req/s", ">= 0.3x")
def server_cost(
    backend: BrakeSettings, *, requests: int = 200_000, rounds: int = 5, timeout_seconds: float = 5.0,
    step: Step = no_step,
) -> Figure:
    """The brake's checks (realistic path) per second of server CPU vs `EVALSHA return 1`."""
    key, name = SERVER_COST
    rates = server_rates(backend, requests, rounds, timeout_seconds)
    step(key, rounds, rounds)
    cpu = rates.cpu
    return ratio_figure(key, name, "req/s", cpu.ours, cpu.floor, at_least=0.3, samples=rounds * rates.per_round,
                        note=_server_note(rates, SERVER_CPU, f"the bare record script: {cpu.bare / cpu.floor:.2f}x"))


@single_node(*SERVER_RECORD, "req/s", ">= 0.8x")
def server_record(
    backend: BrakeSettings, *, requests: int = 200_000, rounds: int = 5, timeout_seconds: float = 5.0,
    step: Step = no_step,
) -> Figure:
    """The brake's checks (realistic path) per second of script time vs the same checks sent to the bare record
    script (HGET, HSET of the record's three fields, PEXPIRE: no logic); all in, per second of server CPU, in its
    note."""
    key, name = SERVER_RECORD
    rates = server_rates(backend, requests, rounds, timeout_seconds)
    step(key, rounds, rounds)
    script, cpu = rates.script, rates.cpu
    per_check = ", ".join(f"{label} {1e6 / rate:.2f} µs" for label, rate in (
        ("ours", script.ours), ("bare", script.bare), ("bare writing h alone", script.bare_streak),
        ("return 1", script.floor)))
    return ratio_figure(key, name, "req/s", script.ours, script.bare, at_least=0.8, samples=rounds * rates.per_round,
                        note=_server_note(rates, SCRIPT_TIME, (
                            f"script time per check: {per_check}; per second of {SERVER_CPU}: "
                            f"{cpu.ours / cpu.bare:.2f}x (ours {1e6 / cpu.ours:.2f} µs, bare {1e6 / cpu.bare:.2f} µs)"),
                        ))


def _delete(parsed: Any, prefix: str, timeout_seconds: float) -> None:
    client = connect.sync_client(parsed, timeout_seconds)
    try:
        keys = client.scan_iter(match=f"{prefix}:*", count=1000)
        while batch := list(itertools.islice(keys, 1000)):
            client.delete(*batch)
    finally:
        client.close()
