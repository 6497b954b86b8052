"""The demo's fleet: workers with a brake each (processes on Redis, threads on memory://) playing the plan.

Against a real Redis URL the workers are processes (`multiprocessing`); on
`memory://` (the embedded store, private to one process) they are threads.
Each agent waits for the answer to one call before it sends the next.
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
from typing import Any

from ..errors import LoopBrakeError
from ..redis.sync import DistributedBrake
from ..settings import BrakeSettings
from .demo_plan import (
    AGENTS,
    STUCK_AGENT,
    STUCK_TOOL,
    DemoCall,
    DemoOutcome,
    DemoReport,
    plan_calls,
    shared_streak_proof,
    worker_summaries,
)

RESULT_TIMEOUT = 30.0  # longest wait for one result before the demo gives up

#: `progress(event, outcome_or_None)`: "ready" once the fleet is up, then one
#: "outcome" per call, as results arrive.
Progress = Callable[[str, DemoOutcome | None], None]


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
    worker: int, settings: BrakeSettings, pace: float, tasks: Any, results: Any, *, label: str,
) -> None:
    """A worker's loop: build its own brake, answer calls until it gets None."""
    try:
        brake = DistributedBrake.from_url(settings=settings)
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
    worker: int, settings: BrakeSettings, pace: float, tasks: Any, results: Any
) -> None:
    # The parent reports denials; keep the library's warnings off this child's stderr
    # unless logging was configured (inherited through fork).
    log = logging.getLogger("distbrake")
    if not log.handlers and not logging.getLogger().handlers:
        log.addHandler(logging.NullHandler())
    _serve(worker, settings, pace, tasks, results, label=f"pid {os.getpid()}")


def _thread_worker(
    worker: int, settings: BrakeSettings, pace: float, tasks: Any, results: Any
) -> None:
    _serve(worker, settings, pace, tasks, results,
           label=f"thread {threading.current_thread().name}")


class _Fleet:
    """N workers (processes or threads) with one task queue each and one shared result queue."""

    def __init__(self, settings: BrakeSettings, workers: int, pace: float, processes: bool) -> None:
        self.processes = processes
        context = multiprocessing.get_context() if processes else None
        new_queue: Callable[[], Any] = context.Queue if context else queue.Queue
        self.results: Any = new_queue()
        self.tasks: list[Any] = [new_queue() for _ in range(workers)]
        self._handles: list[Any] = []
        for index in range(workers):
            args = (index, settings, pace, self.tasks[index], self.results)
            handle = (
                context.Process(target=_process_worker, name=f"distbrake-demo-{index}",
                                daemon=True, args=args) if context
                else threading.Thread(target=_thread_worker, name=f"w{index}", daemon=True, args=args)
            )
            handle.start()
            self._handles.append(handle)

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


def _no_progress(event: str, outcome: DemoOutcome | None) -> None:
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
    settings: BrakeSettings, *, workers: int = 4, calls: int = 8, keep: bool = False,
    pace: float = 0.0, progress: Progress = _no_progress,
) -> DemoReport:
    """Run the demo fleet on the backend of `settings` (its brakes fail closed) and return what happened.

    Sessions are named `demo-<run id>-<agent>` and cleared at the end unless
    `keep` (then `distbrake list --match 'demo-*'` shows them). `pace` is how
    long each allowed tool call "runs" (seconds), to make a live view watchable. Backend
    errors of a worker are reported in `errors`, never raised from a worker.
    """
    if workers < 2:
        raise ValueError("the demo needs at least 2 workers to show a shared streak")
    settings = settings.model_copy(update={"on_backend_error": "closed"})  # the URL stays parsed
    processes = settings.parsed_url.kind != "memory"
    # One brake in this process: fail fast when the backend is unusable, and clean up after.
    brake = DistributedBrake.from_url(settings=settings)
    try:
        brake.ping()
        limit = settings.limit_for(STUCK_TOOL) or settings.max_repeats
        run_id = uuid.uuid4().hex[:6]
        plan = plan_calls(workers, calls, limit, run_id)
        started = time.perf_counter()
        fleet = _Fleet(settings, workers, pace, processes)
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
        backend=settings.shown_url,
        mode="processes" if processes else "threads",
        max_repeats=limit,
        agents=list(AGENTS),
        stuck_agent=STUCK_AGENT,
        workers=worker_summaries(workers, labels, outcomes),
        outcomes=outcomes,
        proof=shared_streak_proof(outcomes, limit),
        elapsed_seconds=elapsed,
        errors=errors,
    )
