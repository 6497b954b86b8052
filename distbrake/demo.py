"""`distbrake demo`: a small fleet where one agent gets stuck, and the brake stops it.

Three agents (sessions) send tool calls to a fleet of workers. Each agent's
calls are dealt round-robin over the workers, as a load balancer or a job
queue would, so consecutive calls of one agent run on different workers.
Two agents work normally (varied calls, one harmless repeat below the
limit); the agent "bravo" gets stuck and sends the same call again and again.

Every worker has its own brake (its own Redis client); the streak lives in
the shared store. So the stuck agent is denied on its Nth identical call in
a row by a worker that itself saw fewer than N of those calls: the count
came from the fleet, not from the worker. That is the proof the report ends
with.

Against a real Redis URL the workers are processes (`multiprocessing`); on
`memory://` (the embedded store, private to one process) they are threads.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .errors import LoopBrakeError
from .redis_brake import DistributedBrake
from .urls import parse_url, redact_url

__all__ = [
    "AGENTS",
    "STUCK_AGENT",
    "DemoCall",
    "DemoOutcome",
    "DemoReport",
    "SharedStreakProof",
    "WorkerSummary",
    "plan_calls",
    "run_demo",
]

AGENTS = ("alpha", "bravo", "charlie")
STUCK_AGENT = "bravo"
STUCK_TOOL = "search"
STUCK_ARGS: dict[str, Any] = {"query": "weather in Paris", "units": "metric"}
RESULT_TIMEOUT = 30.0  # longest wait for one result before the demo gives up


@dataclass(frozen=True)
class DemoCall:
    """One tool call of one agent, and the worker it is dealt to."""

    agent: str
    session_id: str
    seq: int  # 0-based position in the agent's calls
    worker: int
    tool: str
    args: dict[str, Any]
    call_id: str
    stuck: bool  # one of the stuck agent's identical calls


@dataclass(frozen=True)
class DemoOutcome:
    """What a worker's brake said about one call."""

    agent: str
    seq: int
    worker: int
    worker_label: str  # "pid 1234" or "thread"
    tool: str
    stuck: bool
    allowed: bool
    count: int
    limit: int
    hash_prefix: str
    error: str | None = None  # the backend failed (policy "closed")


@dataclass(frozen=True)
class WorkerSummary:
    worker: int
    label: str
    calls: int
    allowed: int
    denied: int
    stuck_calls: int  # identical calls of the stuck agent this worker ran
    denied_agents: list[str]


@dataclass(frozen=True)
class SharedStreakProof:
    """The stuck agent's first denial, and why only a shared streak explains it."""

    agent: str
    hash_prefix: str
    max_repeats: int
    workers_in_order: list[int]  # worker of each identical call up to the denial
    denied_on: int
    shared_count: int  # the count the store gave the denied call
    own_calls: int  # identical calls the denying worker itself ran, the denied one included
    holds: bool

    def sentence(self) -> str:
        path = " -> ".join(f"worker-{w}" for w in self.workers_in_order)
        if not self.holds:
            return (
                f"shared streak: not shown (agent {self.agent}'s calls ran on {path}; "
                f"the denying worker-{self.denied_on} ran {self.own_calls} of them itself)"
            )
        return (
            f"shared streak: agent {self.agent}'s identical call ran on {path}; "
            f"worker-{self.denied_on} denied call {self.shared_count} in a row although it had "
            f"run only {self.own_calls} of them itself (< max_repeats {self.max_repeats}): "
            "the count came from the shared store"
        )


@dataclass(frozen=True)
class DemoReport:
    backend: str  # redacted URL
    mode: str  # processes | threads
    max_repeats: int
    agents: list[str]
    stuck_agent: str
    workers: list[WorkerSummary]
    outcomes: list[DemoOutcome] = field(repr=False)
    proof: SharedStreakProof | None
    elapsed_seconds: float
    errors: list[str]

    @property
    def calls(self) -> int:
        return len(self.outcomes)

    @property
    def denied(self) -> int:
        return sum(1 for o in self.outcomes if not o.allowed and o.error is None)

    def to_json(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "mode": self.mode,
            "max_repeats": self.max_repeats,
            "agents": self.agents,
            "stuck_agent": self.stuck_agent,
            "calls": self.calls,
            "denied": self.denied,
            "denials": [
                {"agent": o.agent, "seq": o.seq, "worker": o.worker, "tool": o.tool,
                 "count": o.count, "limit": o.limit, "hash_prefix": o.hash_prefix}
                for o in self.outcomes if not o.allowed and o.error is None
            ],
            "workers": [asdict(w) for w in self.workers],
            "shared_streak": None if self.proof is None else {
                **asdict(self.proof), "sentence": self.proof.sentence(),
            },
            "elapsed_seconds": round(self.elapsed_seconds, 3),
            "errors": self.errors,
        }


# -- the plan ------------------------------------------------------------------------------


def _normal_call(agent: str, seq: int) -> tuple[str, dict[str, Any]]:
    kind = seq % 3
    if kind == 0:
        return "search", {"query": f"{agent} topic {seq}"}
    if kind == 1:
        return "read_file", {"path": f"notes/{agent}/{seq}.md"}
    return "summarize", {"doc_id": f"{agent}-{seq}", "words": 100}


def plan_calls(
    workers: int, calls: int, max_repeats: int, run_id: str
) -> dict[str, list[DemoCall]]:
    """Each agent's calls, in order, each dealt to worker (agent index + seq) % workers.

    The stuck agent makes one normal call, then `max_repeats + 2` identical
    calls (the last three denied), then carries on normally: a denial stops
    the loop, not the agent.
    """
    plan: dict[str, list[DemoCall]] = {}
    harmless = max(1, min(2, max_repeats - 1))  # a repeat that stays under the limit
    for index, agent in enumerate(AGENTS):
        session = f"demo-{run_id}-{agent}"
        stuck_from, stuck_to = 1, 1 + max_repeats + 2
        total = max(calls, stuck_to + 1) if agent == STUCK_AGENT else calls
        items: list[DemoCall] = []
        for seq in range(total):
            stuck = agent == STUCK_AGENT and stuck_from <= seq < stuck_to
            if stuck:
                tool, args = STUCK_TOOL, dict(STUCK_ARGS)
            elif agent != STUCK_AGENT and 2 <= seq < 2 + harmless:
                tool, args = "get_status", {"job": f"{agent}-build"}
            else:
                tool, args = _normal_call(agent, seq)
            items.append(DemoCall(
                agent=agent, session_id=session, seq=seq, worker=(index + seq) % workers,
                tool=tool, args=args, call_id=f"{agent}-{run_id}-{seq}", stuck=stuck,
            ))
        plan[agent] = items
    return plan


# -- the workers ----------------------------------------------------------------------------


def _one_call(brake: DistributedBrake, label: str, call: DemoCall, pace: float) -> DemoOutcome:
    limit = brake.settings.limit_for(call.tool) or 0
    try:
        verdict = brake.check(call.tool, call.args, session_id=call.session_id, call_id=call.call_id)
        if pace:
            time.sleep(pace)  # the tool "runs" (a denied call never gets here)
    except LoopBrakeError as error:
        return DemoOutcome(call.agent, call.seq, call.worker, label, call.tool, call.stuck,
                           False, error.count, error.max_repeats, error.hash_prefix)
    except Exception as error:  # the backend failed: reported, never a traceback
        return DemoOutcome(call.agent, call.seq, call.worker, label, call.tool, call.stuck,
                           False, 0, limit, "", error=type(error).__name__)
    return DemoOutcome(call.agent, call.seq, call.worker, label, call.tool, call.stuck,
                       True, verdict.count, verdict.max_repeats, verdict.hash_prefix)


def _serve(
    worker: int, url: str, options: dict[str, Any], tasks: Any, results: Any, *, label: str,
) -> None:
    """A worker's loop: build its own brake, answer calls until it gets None."""
    settings = dict(options)  # shared by the thread workers: never mutated
    pace = float(settings.pop("pace", 0.0))
    try:
        brake = DistributedBrake.from_url(url, on_backend_error="closed", **settings)
    except Exception as error:
        results.put(("error", worker, f"worker-{worker} could not start: {type(error).__name__}"))
        return
    try:
        results.put(("ready", worker, label))
        while True:
            call = tasks.get()
            if call is None:
                break
            results.put(("outcome", worker, _one_call(brake, label, call, pace)))
    finally:
        brake.close()


def _process_worker(
    worker: int, url: str, options: dict[str, Any], tasks: Any, results: Any
) -> None:
    # The parent reports denials; keep the library's warnings off this child's stderr
    # unless logging was configured (inherited through fork).
    log = logging.getLogger("distbrake")
    if not log.handlers and not logging.getLogger().handlers:
        log.addHandler(logging.NullHandler())
    _serve(worker, url, options, tasks, results, label=f"pid {os.getpid()}")


def _thread_worker(
    worker: int, url: str, options: dict[str, Any], tasks: Any, results: Any
) -> None:
    _serve(worker, url, options, tasks, results,
           label=f"thread {threading.current_thread().name}")


class _Fleet:
    """N workers with one task queue each and one shared result queue."""

    def __init__(self, url: str, workers: int, options: dict[str, Any], processes: bool) -> None:
        self.processes = processes
        self._handles: list[Any] = []
        if processes:
            ctx = multiprocessing.get_context()
            self.results: Any = ctx.Queue()
            self.tasks: list[Any] = [ctx.Queue() for _ in range(workers)]
            for index in range(workers):
                proc = ctx.Process(
                    target=_process_worker, name=f"distbrake-demo-{index}", daemon=True,
                    args=(index, url, options, self.tasks[index], self.results),
                )
                proc.start()
                self._handles.append(proc)
        else:
            self.results = queue.Queue()
            self.tasks = [queue.Queue() for _ in range(workers)]
            for index in range(workers):
                thread = threading.Thread(
                    target=_thread_worker, name=f"w{index}", daemon=True,
                    args=(index, url, options, self.tasks[index], self.results),
                )
                thread.start()
                self._handles.append(thread)

    def get(self) -> tuple[str, int, Any]:
        try:
            item: tuple[str, int, Any] = self.results.get(timeout=RESULT_TIMEOUT)
        except queue.Empty:
            raise RuntimeError(f"the demo workers stopped answering ({RESULT_TIMEOUT:g} s)") from None
        return item

    def close(self) -> None:
        for tasks in self.tasks:
            with contextlib.suppress(Exception):
                tasks.put(None)
        for handle in self._handles:
            handle.join(timeout=5)
            if self.processes and handle.is_alive():
                handle.terminate()
                handle.join(timeout=5)


# -- the run ----------------------------------------------------------------------------------

#: `progress(event, outcome_or_None)`: "ready" once the fleet is up, then one
#: "outcome" per call, as results arrive.
Progress = Callable[[str, DemoOutcome | None], None]


def _no_progress(event: str, outcome: DemoOutcome | None) -> None:
    return None


def _summaries(
    workers: int, labels: dict[int, str], outcomes: list[DemoOutcome]
) -> list[WorkerSummary]:
    summaries = []
    for worker in range(workers):
        mine = [o for o in outcomes if o.worker == worker]
        denied = [o for o in mine if not o.allowed and o.error is None]
        summaries.append(WorkerSummary(
            worker=worker, label=labels.get(worker, "?"), calls=len(mine),
            allowed=sum(1 for o in mine if o.allowed), denied=len(denied),
            stuck_calls=sum(1 for o in mine if o.stuck),
            denied_agents=sorted({o.agent for o in denied}),
        ))
    return summaries


def _proof(outcomes: list[DemoOutcome], max_repeats: int) -> SharedStreakProof | None:
    stuck = sorted((o for o in outcomes if o.stuck and o.error is None), key=lambda o: o.seq)
    upto: list[DemoOutcome] = []
    for outcome in stuck:
        upto.append(outcome)
        if not outcome.allowed:
            own = sum(1 for o in upto if o.worker == outcome.worker)
            order = [o.worker for o in upto]
            holds = (
                outcome.count >= max_repeats
                and own < max_repeats
                and len(set(order)) > 1
            )
            return SharedStreakProof(
                agent=outcome.agent, hash_prefix=outcome.hash_prefix, max_repeats=max_repeats,
                workers_in_order=order, denied_on=outcome.worker, shared_count=outcome.count,
                own_calls=own, holds=holds,
            )
    return None


def _drive(
    fleet: _Fleet, plan: dict[str, list[DemoCall]], workers: int, progress: Progress
) -> tuple[dict[int, str], list[DemoOutcome], list[str]]:
    """Wait for the fleet, then play every agent's calls; each agent waits for its answer."""
    labels: dict[int, str] = {}
    outcomes: list[DemoOutcome] = []
    errors: list[str] = []
    for _ in range(workers):
        kind, worker, payload = fleet.get()
        if kind == "error":
            errors.append(str(payload))
        else:
            labels[worker] = str(payload)
    if errors:
        raise ConnectionError("; ".join(errors))
    progress("ready", None)
    position = dict.fromkeys(plan, 0)

    def send(agent: str) -> bool:
        if position[agent] >= len(plan[agent]):
            return False
        call = plan[agent][position[agent]]
        fleet.tasks[call.worker].put(call)
        return True

    in_flight = sum(1 for agent in plan if send(agent))
    while in_flight:
        kind, worker, payload = fleet.get()
        if kind != "outcome":
            continue
        outcome: DemoOutcome = payload
        outcomes.append(outcome)
        if outcome.error is not None:
            errors.append(f"worker-{worker}: backend failed ({outcome.error})")
        progress("outcome", outcome)
        position[outcome.agent] += 1
        in_flight -= 1
        if send(outcome.agent):
            in_flight += 1
    return labels, outcomes, errors


def run_demo(
    url: str = "memory://", *, workers: int = 4, calls: int = 8,
    max_repeats: int | None = None, key_prefix: str | None = None,
    timeout_seconds: float | None = None, keep: bool = False, pace: float = 0.0,
    progress: Progress = _no_progress,
) -> DemoReport:
    """Run the demo fleet against `url` and return what happened.

    Sessions are named `demo-<run id>-<agent>` and cleared at the end unless
    `keep` (then `distbrake list --match 'demo-*'` shows them). `pace` is how
    long each allowed tool call "runs" (seconds), to make a live view watchable. Backend
    errors of a worker are reported in `errors`, never raised from a worker.
    """
    if workers < 2:
        raise ValueError("the demo needs at least 2 workers to show a shared streak")
    options: dict[str, Any] = {
        k: v for k, v in {
            "max_repeats": max_repeats, "key_prefix": key_prefix, "timeout_seconds": timeout_seconds,
        }.items() if v is not None
    }
    processes = parse_url(url).kind != "memory"
    # One brake in this process: fail fast when the backend is unusable, and clean up after.
    brake = DistributedBrake.from_url(url, on_backend_error="closed", **options)
    try:
        brake.ping()
        options["pace"] = pace
        limit = brake.settings.limit_for(STUCK_TOOL) or brake.settings.max_repeats
        run_id = uuid.uuid4().hex[:6]
        plan = plan_calls(workers, calls, limit, run_id)
        started = time.perf_counter()
        fleet = _Fleet(url, workers, options, processes)
        try:
            labels, outcomes, errors = _drive(fleet, plan, workers, progress)
        finally:
            fleet.close()
        elapsed = time.perf_counter() - started
        if not keep:
            for items in plan.values():
                brake.clear(items[0].session_id)
    finally:
        brake.close()
    return DemoReport(
        backend=redact_url(url) if url else "memory://",
        mode="processes" if processes else "threads",
        max_repeats=limit,
        agents=list(AGENTS),
        stuck_agent=STUCK_AGENT,
        workers=_summaries(workers, labels, outcomes),
        outcomes=outcomes,
        proof=_proof(outcomes, limit),
        elapsed_seconds=elapsed,
        errors=errors,
    )
