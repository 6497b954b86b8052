"""The `demo` command: a small fleet where one agent gets stuck, and a worker that saw fewer repeats stops it.

Three agents make N calls each, dealt round-robin over workers with a brake each (processes on Redis, threads on
`memory://`); "bravo" repeats one call. The streak lives in the store, so a worker that itself ran fewer than
max_repeats of those calls denies one: the proof the demo ends with. The ladder on the way: a warning one call
before the limit (warn_at), denials at it, and the session halted two calls past it (halt_at: every later call
of bravo is refused); before the last round an operator blocks charlie (`block`), whose last call is refused.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from rich.text import Text

from . import output
from .app import App, command

if TYPE_CHECKING:
    from ..settings import BrakeSettings

AGENTS, STUCK, BLOCKED = ("alpha", "bravo", "charlie"), "bravo", "charlie"
STUCK_CALL: tuple[str, dict[str, Any]] = ("search", {"query": "weather in Paris", "units": "metric"})
WAIT = 30.0  # longest wait for one answer before the demo gives up


def plan(workers: int, calls: int, limit: int, run_id: str) -> list[list[dict[str, Any]]]:
    """Round after round, one call of each agent: bravo makes one normal call, then up to limit + 2 identical
    ones, then carries on normally; the others repeat one harmless call, under the limit."""
    harmless = max(1, min(2, limit - 1))
    rounds: list[list[dict[str, Any]]] = []
    for seq in range(calls):
        this = []
        for index, agent in enumerate(AGENTS):
            stuck = agent == STUCK and 1 <= seq < 1 + min(limit + 2, calls - 1)
            if stuck:
                tool, args = STUCK_CALL
            elif agent != STUCK and 2 <= seq < 2 + harmless:
                tool, args = "get_status", {"job": f"{agent}-build"}
            else:
                normal: list[tuple[str, dict[str, Any]]] = [
                    ("search", {"query": f"{agent} topic {seq}"}), ("read_file", {"path": f"notes/{agent}/{seq}.md"}),
                    ("summarize", {"doc_id": f"{agent}-{seq}", "words": 100})]
                tool, args = normal[seq % 3]
            this.append({"agent": agent, "session_id": f"demo-{run_id}-{agent}", "seq": seq, "tool": tool,
                         "args": args, "worker": (index + seq) % workers, "stuck": stuck,
                         "call_id": f"{agent}-{run_id}-{seq}"})
        rounds.append(this)
    return rounds


def ladder(settings: BrakeSettings, limit: int) -> BrakeSettings:
    """The demo's settings: the ladder on (warn one call before the limit from a limit of 3, halt two calls past
    it) unless set."""
    update: dict[str, int] = {}
    if settings.warn_at is None and limit >= 3:
        update["warn_at"] = limit - 1
    if settings.halt_at is None:
        update["halt_at"] = limit + 2
    from ..settings import load_settings

    return load_settings(settings, **update)


def _worker(worker: int, settings: BrakeSettings, pace: float, tasks: Any, results: Any, processes: bool) -> None:
    """One worker (a process or a thread): its own brake, answering calls until it gets None."""
    from ..errors import LoopBrakeError, LoopBrakeHalt
    from ..redis.sync import DistributedBrake

    log = logging.getLogger("distbrake")
    if processes and not log.handlers and not logging.getLogger().handlers:  # the parent reports denials
        log.addHandler(logging.NullHandler())
    label = f"pid {os.getpid()}" if processes else f"thread {threading.current_thread().name}"
    try:
        brake = DistributedBrake.from_url(settings=settings)
    except Exception as error:
        results.put(("error", worker, f"worker-{worker} could not start: {type(error).__name__}"))
        return
    results.put(("ready", worker, label))
    try:
        while (call := tasks.get()) is not None:
            out = {k: call[k] for k in ("agent", "seq", "worker", "tool", "stuck")}
            try:
                verdict = brake.check(call["tool"], call["args"], session_id=call["session_id"],
                                      call_id=call["call_id"])
                out.update(allowed=True, count=verdict.count, limit=verdict.max_repeats,
                           hash_prefix=verdict.hash_prefix, error=None, warned=verdict.warning is not None,
                           halt=None)
                if pace:
                    time.sleep(pace)  # the tool "runs" (a denied call never gets here)
            except LoopBrakeHalt as halted:  # the session is halted (by the rule, or blocked by the operator)
                out.update(allowed=False, count=halted.count, limit=halted.limit, hash_prefix=halted.hash_prefix,
                           error=None, warned=False, halt=halted.halt_rule)
            except LoopBrakeError as denied:
                out.update(allowed=False, count=denied.count, limit=denied.max_repeats,
                           hash_prefix=denied.hash_prefix, error=None, warned=False, halt=None)
            except Exception as error:  # the backend failed: reported, never a traceback
                out.update(allowed=False, count=0, limit=0, hash_prefix="", error=type(error).__name__,
                           warned=False, halt=None)
            results.put(("outcome", worker, out))
    finally:
        brake.close()


def _proof(outcomes: list[dict[str, Any]], limit: int) -> dict[str, Any] | None:
    """The stuck agent's first denial, and whether only a shared streak explains it."""
    upto: list[int] = []
    for out in (o for o in outcomes if o["stuck"] and o["error"] is None):
        upto.append(out["worker"])
        if not out["allowed"] and out["halt"] is None:
            own = upto.count(out["worker"])
            proof = {"agent": out["agent"], "hash_prefix": out["hash_prefix"], "max_repeats": limit,
                     "workers_in_order": upto, "denied_on": out["worker"], "shared_count": out["count"],
                     "own_calls": own, "holds": out["count"] >= limit > own and len(set(upto)) > 1}
            path, denier = " -> ".join(f"worker-{w}" for w in upto), f"worker-{out['worker']}"
            proof["sentence"] = (
                f"shared streak: agent {out['agent']}'s identical call ran on {path}; {denier} denied call "
                f"{out['count']} in a row although it had run only {own} of them itself (< max_repeats {limit}): "
                "the count came from the shared store" if proof["holds"] else
                f"shared streak: not shown (agent {out['agent']}'s calls ran on {path}; the denying {denier} "
                f"ran {own} of them itself)")
            return proof
    return None


@command("demo")
@click.option("--workers", metavar="N", default=4, show_default=True, type=click.IntRange(2, 32),
              help="Workers in the fleet (processes on Redis, threads on memory://).")
@click.option("--calls", metavar="N", default=None, type=click.IntRange(2, 1000),
              help="Tool calls each of the 3 agents makes, so 3 x N in all; at least max_repeats + 1, for the "
                   "stuck agent to reach the limit (default: 8, or max_repeats + 4 when that is more).")
@click.option("--keep", is_flag=True, help="Leave the stuck agent's halted session and the blocked one in the store "
              "to look at (`distbrake list`, `distbrake inspect SESSION`); on a Redis URL only.")
@click.option("--pace", metavar="SECONDS", default=None, type=click.FloatRange(0, 5),
              help="How long each allowed tool call runs (default: 0.05 on a terminal, else 0).")
def demo_command(app: App, *, workers: int, calls: int | None, keep: bool, pace: float | None, as_json: bool) -> None:
    """A small fleet where one agent gets stuck repeating a call, and the brake stops it.

    Three agents make N calls each, dealt round-robin over workers with a brake each; "bravo" gets stuck. The
    streak is shared through the store: a worker that saw fewer than max_repeats of the calls denies one.
    """
    from ..redis.sync import DistributedBrake

    settings = app.settings().model_copy(update={"on_backend_error": "closed"})  # the URL stays parsed
    limit = settings.limit_for(STUCK_CALL[0]) or settings.max_repeats
    settings = ladder(settings, limit)
    calls = max(8, limit + 4) if calls is None else calls
    if calls < limit + 1:
        raise output.CliError(f"--calls {calls} is too few: with max_repeats {limit} the stuck agent needs at least "
                              f"{limit + 1} calls to reach the limit", output.EXIT_USAGE, "usage")
    console, terminal = output.make_console(), sys.stdout.isatty()
    processes, run_id = settings.parsed_url.connector != "memory", uuid.uuid4().hex[:6]

    def say(text: str, style: str = "") -> None:
        if not as_json:
            console.print(Text(text, style=style if terminal else ""))

    with DistributedBrake.from_url(settings=settings) as brake:
        brake.ping()  # fail fast when the backend is unusable; it clears the sessions afterwards
        began = time.perf_counter()
        say(f"demo: {workers} worker {'processes' if processes else 'threads (memory:// is private to one process)'}"
            f" on {output.escape_text(app.backend)}; agents {', '.join(AGENTS)} ({STUCK} is stuck), {calls} calls "
            f"each; max_repeats {limit}, warn_at {settings.warn_at}, halt_at {settings.halt_at}")

        def block() -> None:  # an operator stops charlie before the last round: `distbrake block SESSION`
            brake.block(f"demo-{run_id}-{BLOCKED}", reason=f"the demo's operator stops {BLOCKED}", who="distbrake demo")
            say(f"  operator: distbrake block demo-{run_id}-{BLOCKED} (every later call of {BLOCKED} is refused)",
                "bold")

        labels, outcomes, errors = _fleet(
            settings, workers, plan(workers, calls, limit, run_id), processes, say,
            (0.05 if terminal and not as_json else 0.0) if pace is None else pace, block)
        elapsed = time.perf_counter() - began
        kept = [f"demo-{run_id}-{agent}" for agent in (STUCK, BLOCKED)] if keep and processes else []
        for agent in AGENTS:
            if f"demo-{run_id}-{agent}" not in kept:
                brake.clear(f"demo-{run_id}-{agent}")
    report = _report(settings.shown_url, processes, limit, workers, labels, outcomes, errors, elapsed)
    report["kept"] = kept
    if as_json:
        output.emit_json(report)
    else:
        _print(report, console, terminal)
        for line in _next_steps(settings, processes, keep, kept, run_id):
            console.print(Text(line))
    if errors:
        raise output.CliError(f"demo workers could not reach the backend: {'; '.join(errors)}",
                              output.EXIT_BACKEND, "unreachable")


def _fleet(settings: BrakeSettings, workers: int, rounds: list[list[dict[str, Any]]], processes: bool,
           say: Callable[..., None], pace: float, before_last: Callable[[], None],
           ) -> tuple[dict[int, str], list[dict[str, Any]], list[str]]:
    """Start the workers, then play the rounds (`before_last` before the last one); each agent waits for the
    answer to its call."""
    context = multiprocessing.get_context()
    new_queue, start = (context.Queue, context.Process) if processes else (queue.Queue, threading.Thread)
    results: Any = new_queue()
    tasks: list[Any] = [new_queue() for _ in range(workers)]
    outcomes: list[dict[str, Any]] = []
    errors: list[str] = []
    halted: set[str] = set()  # the agents whose halt was said
    handles: list[Any] = [start(target=_worker, name=f"w{w}", daemon=True,
                                args=(w, settings, pace, tasks[w], results, processes)) for w in range(workers)]
    try:
        for handle in handles:
            handle.start()
        started = [results.get(timeout=WAIT) for _ in range(workers)]
        labels = {worker: label for kind, worker, label in started if kind == "ready"}
        if failed := [payload for kind, _, payload in started if kind == "error"]:
            raise ConnectionError("; ".join(failed))
        for index, this in enumerate(rounds):
            if index == len(rounds) - 1:
                before_last()
            for call in this:
                tasks[call["worker"]].put(call)
            done = sorted((results.get(timeout=WAIT)[2] for _ in this), key=lambda o: AGENTS.index(o["agent"]))
            for out in done:
                _say(out, say, errors, halted)
            outcomes += done
    except queue.Empty:
        raise RuntimeError(f"the demo workers stopped answering ({WAIT:g} s)") from None
    finally:
        for handle, inbox in zip(handles, tasks, strict=True):
            with contextlib.suppress(Exception):
                inbox.put(None)
            handle.join(timeout=5)
            if processes and handle.is_alive():
                handle.terminate()
    return labels, outcomes, errors


def _say(out: dict[str, Any], say: Callable[..., None], errors: list[str], halted: set[str]) -> None:
    """One line for a step of the ladder (the stuck agent's warning, a denial, a halt, a refusal), or an error;
    `halted`: the agents whose halt was said (changed)."""
    who = f"  worker-{out['worker']}"
    if out["error"] is not None:
        errors.append(f"worker-{out['worker']}: backend failed ({out['error']})")
    elif out["halt"] == "block":
        say(f"{who} refused agent {out['agent']}: its session is blocked by the operator", "bold red")
    elif out["halt"] is not None and out["agent"] not in halted:
        halted.add(out["agent"])
        say(f"{who} HALTED agent {out['agent']}: {out['tool']} (call {out['hash_prefix']}) is call {out['count']} in "
            f"a row, halt_at {out['limit']}: the run must stop, every later call of the session is refused",
            "bold red")
    elif out["halt"] is not None:
        say(f"{who} refused agent {out['agent']}: its session is halted", "red")
    elif not out["allowed"]:
        say(f"{who} denied agent {out['agent']}: {out['tool']} (call "
            f"{out['hash_prefix']}) is call {out['count']} in a row, limit {out['limit']}", "red")
    elif out["warned"] and out["stuck"]:
        say(f"{who} warned agent {out['agent']}: {out['tool']} (call {out['hash_prefix']}) is call {out['count']} "
            f"in a row, denied from {out['limit']}", "yellow")


def _report(backend: str, processes: bool, limit: int, workers: int, labels: dict[int, str],
            outcomes: list[dict[str, Any]], errors: list[str], elapsed: float) -> dict[str, Any]:
    denials = [o for o in outcomes if not o["allowed"] and o["error"] is None and o["halt"] is None]
    halts = [o for o in outcomes if o["halt"] is not None]
    return {
        "backend": backend, "mode": "processes" if processes else "threads", "max_repeats": limit,
        "agents": list(AGENTS), "stuck_agent": STUCK, "calls": len(outcomes),
        "calls_per_agent": {a: sum(1 for o in outcomes if o["agent"] == a) for a in AGENTS},
        "denied": len(denials),
        "denials": [{k: o[k] for k in ("agent", "seq", "worker", "tool", "count", "limit", "hash_prefix")}
                    for o in denials],
        "warned": sum(1 for o in outcomes if o["warned"]),
        "halted": [{k: o[k] for k in ("agent", "seq", "worker", "tool", "halt")} for o in halts],
        "workers": [{"worker": w, "label": labels.get(w, "?"), "calls": sum(1 for o in outcomes if o["worker"] == w),
                     "allowed": sum(1 for o in outcomes if o["worker"] == w and o["allowed"]),
                     "denied": sum(1 for o in denials if o["worker"] == w),
                     "halted": sum(1 for o in halts if o["worker"] == w),
                     "stuck_calls": sum(1 for o in outcomes if o["worker"] == w and o["stuck"]),
                     "denied_agents": sorted({o["agent"] for o in denials if o["worker"] == w})}
                    for w in range(workers)],
        "shared_streak": _proof(outcomes, limit), "elapsed_seconds": round(elapsed, 3), "errors": errors,
    }


def _print(report: dict[str, Any], console: Any, terminal: bool) -> None:
    table = output.make_table("worker", "runs as", "calls", "allowed", "denied", "halted", f"{STUCK}'s repeats",
                              "denied agent", title="fleet")
    for column in (2, 3, 4, 5, 6):
        table.columns[column].justify = "right"
    for w in report["workers"]:
        table.add_row(f"worker-{w['worker']}", w["label"], str(w["calls"]), str(w["allowed"]),
                      Text(str(w["denied"]), style="red" if terminal and w["denied"] else ""), str(w["halted"]),
                      str(w["stuck_calls"]), ", ".join(w["denied_agents"]) or "-")
    output.print_renderable(console, table)
    denied_on = sorted({f"worker-{d['worker']}" for d in report["denials"]})
    console.print(Text(f"calls made: {report['calls']}, warned: {report['warned']}, denied: {report['denied']} (on "
                       f"{', '.join(denied_on) or 'none'}), refused as halted or blocked: {len(report['halted'])}, "
                       f"in {report['elapsed_seconds']:.2f} s"))
    proof = report["shared_streak"]
    if proof is not None:
        console.print(Text(proof["sentence"], style=("bold green" if proof["holds"] else "yellow") if terminal else ""))


def _next_steps(settings: BrakeSettings, processes: bool, keep: bool, kept: list[str], run_id: str) -> list[str]:
    """What to run next: on memory://, how to see processes share a streak; with --keep, how to look at what
    was left stuck (and remove it)."""
    if not processes:
        return ["the workers were threads of this one process (memory:// is private to it): to see processes "
                "share a streak, run distbrake --url redis://localhost:6379/0 demo"
                + (" --keep (memory:// keeps nothing once the demo exits)" if keep else "")]
    if not kept:
        return []
    stuck, blocked = kept
    base = f"distbrake --url {output.escape_text(settings.shown_url)}" + (
        "" if settings.key_prefix == "distbrake" else f" --key-prefix {output.quote_text(settings.key_prefix)}")
    return [f"kept to look at: {stuck} (halted by the streak rule) and {blocked} (blocked by the operator); see them:",
            f"  {base} list --match 'demo-{run_id}-*'",
            f"  {base} inspect {stuck}",
            f"  {base} clear --match 'demo-{run_id}-*' --yes    (removes them)"]
