"""The demo's script and its verdict: who calls what on which worker, and what the outcomes prove.

Three agents (sessions) send tool calls to a fleet of workers. Each agent's
calls are dealt round-robin over the workers, as a load balancer or a job
queue would, so consecutive calls of one agent run on different workers.
Two agents work normally (varied calls, one harmless repeat below the
limit); the agent "bravo" gets stuck and sends the same call again and again.

Every worker has its own brake (its own Redis client); the streak lives in
the shared store. So the stuck agent is denied on its Nth identical call in
a row by a worker that itself saw fewer than N of those calls: the count
came from the fleet, not from the worker. That is the proof the report ends
with (`SharedStreakProof`). `demo_fleet` plays the plan.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

AGENTS = ("alpha", "bravo", "charlie")
STUCK_AGENT = "bravo"
STUCK_TOOL = "search"
STUCK_ARGS: dict[str, Any] = {"query": "weather in Paris", "units": "metric"}


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
            "calls_per_agent": {a: sum(1 for o in self.outcomes if o.agent == a) for a in self.agents},
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


def min_calls(max_repeats: int) -> int:
    """The fewest calls per agent that let the stuck agent reach the limit: 1 normal + max_repeats."""
    return max_repeats + 1


def default_calls(max_repeats: int) -> int:
    """Calls per agent when --calls is not given: 8, or enough to show 3 denials and carry on."""
    return max(8, max_repeats + 4)


def plan_calls(
    workers: int, calls: int, max_repeats: int, run_id: str
) -> dict[str, list[DemoCall]]:
    """Each agent's `calls` calls (exactly that many, every agent), in order, each dealt to
    worker (agent index + seq) % workers.

    The stuck agent makes one normal call, then up to `max_repeats + 2`
    identical calls (from the `max_repeats`-th on they are denied), then
    carries on normally: a denial stops the loop, not the agent. `calls` must
    be at least `min_calls(max_repeats)`, else the stuck agent never reaches
    the limit (ValueError).
    """
    if calls < min_calls(max_repeats):
        raise ValueError(f"the demo needs at least {min_calls(max_repeats)} calls per agent "
                         f"(max_repeats {max_repeats} + 1) for the stuck agent to be denied")
    plan: dict[str, list[DemoCall]] = {}
    harmless = max(1, min(2, max_repeats - 1))  # a repeat that stays under the limit
    for index, agent in enumerate(AGENTS):
        session = f"demo-{run_id}-{agent}"
        stuck_from, stuck_to = 1, 1 + min(max_repeats + 2, calls - 1)
        items: list[DemoCall] = []
        for seq in range(calls):
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


# -- the verdict ---------------------------------------------------------------------------------


def worker_summaries(
    workers: int, labels: dict[int, str], outcomes: list[DemoOutcome]
) -> list[WorkerSummary]:
    """What each worker ran, allowed and denied."""
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


def shared_streak_proof(outcomes: list[DemoOutcome], max_repeats: int) -> SharedStreakProof | None:
    """The stuck agent's first denial and whether only a shared streak explains it (None: no denial)."""
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
