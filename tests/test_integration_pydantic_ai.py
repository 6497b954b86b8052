"""Pydantic AI integration: full agent runs with the real framework.

The model is Pydantic AI's own `FunctionModel`, scripted to call
`search {"q": "weather"}` again and again; no network, no keys. Brakes: the
in-process LoopBrake, DistributedBrake on the embedded backend and on a real
redis-server, and AsyncDistributedBrake (async runs only: its connections
belong to one event loop, and `run_sync` runs its own).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from distbrake import (
    ConfigurationError,
    LoopBrake,
    LoopBrakeError,
    call_hash,
    hash_prefix,
)
from distbrake.integrations.pydantic_ai import LoopBrakeCapability
from tests.adapters import Body, Run, Seen
from tests.backends import ADAPTER_BRAKES, SYNC_ADAPTER_BRAKES, next_answer

PREFIX = hash_prefix(call_hash("search", {"q": "weather"}))
FINAL = "final answer: it is sunny"

Turn = Sequence[ToolCallPart]


def calls(*ids: str, q: str = "weather") -> Turn:
    """One model turn calling `search` once per id (several ids: a parallel turn)."""
    return [ToolCallPart("search", {"q": q}, tool_call_id=i) for i in ids]


class Script:
    """A FunctionModel that plays `turns`, then answers; it records what it was sent."""

    def __init__(self, *turns: Turn) -> None:
        self.turns = turns
        self.prompts: list[list[ModelMessage]] = []
        self.model = FunctionModel(self.respond)

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        made = len(self.prompts)  # turns this script already played (history may hold more)
        self.prompts.append(list(messages))
        if made < len(self.turns):
            return ModelResponse(parts=list(self.turns[made]))
        return ModelResponse(parts=[TextPart(FINAL)])

    def returns(self) -> list[ToolReturnPart]:
        """Every tool result the model has been sent so far (in its last prompt)."""
        return [
            part for message in self.prompts[-1] if isinstance(message, ModelRequest)
            for part in message.parts if isinstance(part, ToolReturnPart)
        ]

    def refusals(self) -> list[ToolReturnPart]:
        return [part for part in self.returns() if part.outcome == "failed"]


def repeating(n: int = 3, prefix: str = "call") -> Script:
    """The model calls `search {"q": "weather"}` n times in a row, then answers."""
    return Script(*(calls(f"{prefix}_{i}") for i in range(1, n + 1)))


class Worker:
    """An agent with a `search` tool counting its real runs."""

    def __init__(self, script: Script, *capabilities: LoopBrakeCapability) -> None:
        self.script = script
        self.runs: list[str] = []
        self.agent: Agent[None, str] = Agent(script.model, capabilities=list(capabilities))

        @self.agent.tool_plain
        def search(q: str) -> str:
            """Search the web for q."""
            self.runs.append(q)
            return f"results for {q}"


class Driver:
    """The contract test's Pydantic AI: an `Agent` with the capability and a `FunctionModel` script, `run`."""

    async def run(self, brake: Any, body: Body, plan: Run, **options: Any) -> list[Seen]:
        script = Script(*(calls(i) for i in plan.ids))
        agent: Agent[None, str] = Agent(script.model, capabilities=[LoopBrakeCapability(brake, **options)])

        @agent.tool_plain
        def search(q: str) -> str:
            """Search the web for q."""
            return body(q)

        try:
            result = await agent.run("weather?", conversation_id=plan.conversation)
        finally:
            plan.asked = len(script.prompts)
        seen: list[Seen] = []
        for message in result.new_messages():
            if not isinstance(message, ModelRequest):
                continue
            returned = [part for part in message.parts if isinstance(part, ToolReturnPart)]
            prompts = [str(part.content) for part in message.parts if isinstance(part, UserPromptPart)]
            seen += [Seen(part.outcome == "failed", "\n".join([str(part.content), *prompts])) for part in returned]
        return seen


@pytest.fixture(autouse=True)
def run_sync_loop(request: pytest.FixtureRequest) -> Iterator[None]:
    """Sync tests: give `run_sync` an event loop this test owns, and close it afterwards.

    `Agent.run_sync` runs on the thread's current event loop, creating and
    setting one when there is none, and never closes it (it is kept for the
    next call; pydantic_ai/_utils.py `get_event_loop`). Left to the garbage
    collector, that loop and its self-pipe end as ResourceWarnings.
    """
    if inspect.iscoroutinefunction(request.function):
        yield  # pytest-asyncio owns the loop of async tests
        return
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        yield
    finally:
        asyncio.set_event_loop(None)
        loop.close()


def assert_refused(script: Script, call_id: str = "call_3") -> ToolReturnPart:
    """The model was sent exactly one failed result, for `call_id`, with the brake's text."""
    refusals = script.refusals()
    assert len(refusals) == 1, script.returns()
    refusal = refusals[0]
    assert refusal.tool_call_id == call_id
    assert refusal.tool_name == "search"
    text = refusal.model_response_str()  # what a provider without an error channel sends
    assert "loop brake" in text
    assert PREFIX in text
    return refusal


# -- the whole loop ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_run_sync_denies_third_call_and_finishes(kind: str, brakes: Any) -> None:
    worker = Worker(repeating(), LoopBrakeCapability(brakes(kind)))

    result = worker.agent.run_sync("weather?", conversation_id="conv-sync")

    assert worker.runs == ["weather", "weather"]
    assert_refused(worker.script)
    assert result.output == FINAL
    assert len(worker.script.prompts) == 4


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_run_sync_on_deny_raise_aborts_the_run(kind: str, brakes: Any) -> None:
    worker = Worker(repeating(), LoopBrakeCapability(brakes(kind), on_deny="raise"))

    with pytest.raises(LoopBrakeError) as caught:
        worker.agent.run_sync("weather?", conversation_id="conv-raise", run_id="r-raise")

    assert worker.runs == ["weather", "weather"]
    error = caught.value
    assert (error.tool_name, error.count, error.max_repeats) == ("search", 3, 3)
    assert error.hash_prefix == PREFIX
    assert error.session_id == "conv-raise/run/r-raise"  # the default scope: the run
    assert len(worker.script.prompts) == 3


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_run_on_deny_raise_aborts_the_run(kind: str, brakes: Any) -> None:
    worker = Worker(repeating(), LoopBrakeCapability(brakes(kind), on_deny="raise"))

    with pytest.raises(LoopBrakeError) as caught:
        await worker.agent.run("weather?", conversation_id="conv-araise")

    assert worker.runs == ["weather", "weather"]
    assert caught.value.session_id.startswith("conv-araise/run/")  # Pydantic AI's own run id


def test_repeated_denials_do_not_use_up_the_retry_budget(brakes: Any) -> None:
    """ToolFailed, not ModelRetry: with the default 1 retry, 4 denials in a row still finish."""
    worker = Worker(repeating(6), LoopBrakeCapability(brakes("loop")))

    result = worker.agent.run_sync("weather?")

    assert result.output == FINAL
    assert worker.runs == ["weather", "weather"]
    assert [p.tool_call_id for p in worker.script.refusals()] == [f"call_{i}" for i in (3, 4, 5, 6)]


def test_a_different_call_breaks_the_streak(brakes: Any) -> None:
    script = Script(calls("c1"), calls("c2"), calls("c3", q="news"), calls("c4"), calls("c5"),
                    calls("c6"))
    worker = Worker(script, LoopBrakeCapability(brakes("loop")))

    assert worker.agent.run_sync("weather?").output == FINAL

    assert worker.runs == ["weather", "weather", "news", "weather", "weather"]
    assert_refused(script, "c6")


def test_without_a_conversation_id_each_run_is_its_own_session(brakes: Any) -> None:
    """Pydantic AI gives every run a fresh conversation id unless one is passed or inherited."""
    capability = LoopBrakeCapability(brakes("loop"))
    first, second = Worker(repeating(2), capability), Worker(repeating(2), capability)

    first.agent.run_sync("weather?")
    second.agent.run_sync("weather?")

    assert (len(first.runs), len(second.runs)) == (2, 2)


def test_message_history_continues_the_conversation_streak(brakes: Any) -> None:
    capability = LoopBrakeCapability(brakes("loop"), scope="conversation")
    first, second = Worker(repeating(2, "a"), capability), Worker(repeating(1, "b"), capability)

    earlier = first.agent.run_sync("weather?")
    second.agent.run_sync("again?", message_history=earlier.all_messages())

    assert (len(first.runs), len(second.runs)) == (2, 0)
    assert_refused(second.script, "b_1")


def test_arguments_json_cannot_express_are_hashed_as_the_model_sent_them(brakes: Any) -> None:
    script = Script(*(
        [ToolCallPart("remind", {"when": "2030-01-01T09:00:00"}, tool_call_id=f"r{i}")]
        for i in (1, 2, 3)
    ))
    agent: Agent[None, str] = Agent(
        script.model, capabilities=[LoopBrakeCapability(brakes("loop"))]
    )
    runs: list[datetime] = []

    @agent.tool_plain
    def remind(when: datetime) -> str:
        """Set a reminder."""
        runs.append(when)  # validated: a datetime, which canonical JSON refuses
        return "ok"

    assert agent.run_sync("remind me").output == FINAL

    assert len(runs) == 2
    [refusal] = script.refusals()
    assert "loop brake" in refusal.model_response_str()


def test_on_deny_is_validated() -> None:
    with pytest.raises(ValueError, match="on_deny"):
        LoopBrakeCapability(LoopBrake(), on_deny="retry")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        LoopBrakeCapability(LoopBrake(), on_deny="")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="check"):
        LoopBrakeCapability(object())  # type: ignore[arg-type]


# -- one turn, several identical calls at once (hooks run concurrently) ------------------


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_parallel_identical_calls_run_sync(kind: str, brakes: Any) -> None:
    worker = Worker(Script(calls("p1", "p2", "p3")), LoopBrakeCapability(brakes(kind)))

    result = worker.agent.run_sync("weather?", conversation_id="conv-parallel")

    assert len(worker.runs) == 2
    refusals = worker.script.refusals()
    assert len(refusals) == 1
    assert refusals[0].tool_call_id in {"p1", "p2", "p3"}
    assert "loop brake" in refusals[0].model_response_str()
    assert result.output == FINAL


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_parallel_identical_calls_run(kind: str, brakes: Any) -> None:
    worker = Worker(Script(calls("p1", "p2", "p3")), LoopBrakeCapability(brakes(kind)))

    result = await worker.agent.run("weather?", conversation_id="conv-aparallel")

    assert len(worker.runs) == 2
    assert len(worker.script.refusals()) == 1
    assert result.output == FINAL


# -- a call checked twice is counted once (the tool call id) ------------------------------


@pytest.mark.parametrize("layers", ["one-brake", "two-brakes-one-redis"])
async def test_two_capabilities_count_a_call_once(
    layers: str, redis_url: str, brakes: Any
) -> None:
    first = brakes("sync-redis", redis_url)
    second = first if layers == "one-brake" else brakes("sync-redis", redis_url)
    worker = Worker(repeating(), LoopBrakeCapability(first), LoopBrakeCapability(second))

    await worker.agent.run("weather?", conversation_id="conv-twice", run_id="r-twice")

    assert worker.runs == ["weather", "weather"]  # not halved: each call counted once
    assert_refused(worker.script)
    state = first.inspect("conv-twice/run/r-twice")
    assert state is not None
    assert state.count == 3


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_two_capabilities_of_one_brake_count_parallel_calls_once(
    kind: str, brakes: Any
) -> None:
    """Interleaved parallel calls: only the first capability checks, so none is counted twice."""
    brake = brakes(kind)
    worker = Worker(
        Script(calls("p1", "p2", "p3")), LoopBrakeCapability(brake), LoopBrakeCapability(brake)
    )

    await worker.agent.run("weather?", conversation_id="conv-layers")

    assert len(worker.runs) == 2
    assert len(worker.script.refusals()) == 1



@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_tool_call_ids_repeated_every_turn_still_count(kind: str, brakes: Any) -> None:
    """Some providers number calls per turn (`search:0` each time): each turn still counts."""
    script = Script(calls("search:0"), calls("search:0"), calls("search:0"))
    worker = Worker(script, LoopBrakeCapability(brakes(kind)))

    assert worker.agent.run_sync("weather?", conversation_id="conv-reused").output == FINAL

    assert worker.runs == ["weather", "weather"]
    [refusal] = script.refusals()
    assert "loop brake" in refusal.model_response_str()


# -- warn before deny, progress-aware tools (issue 10) -------------------------------------


def last_request(prompt: list[ModelMessage]) -> ModelRequest:
    request = prompt[-1]
    assert isinstance(request, ModelRequest)
    return request


def warnings_in(prompt: list[ModelMessage]) -> list[str]:
    """The user-prompt texts in the last request of `prompt` (where a warning goes)."""
    return [
        part.content for part in last_request(prompt).parts
        if isinstance(part, UserPromptPart) and isinstance(part.content, str)
    ]


def assert_warned_then_refused(script: Script) -> None:
    """After call 1 the bare result; after call 2 the result and the warning; call 3 refused."""
    assert warnings_in(script.prompts[1]) == []
    request = last_request(script.prompts[2])
    [result] = [part for part in request.parts if isinstance(part, ToolReturnPart)]
    assert (result.tool_call_id, result.content) == ("call_2", "results for weather")
    assert result.outcome == "success"
    [warning] = warnings_in(script.prompts[2])
    assert "called 2 times in a row" in warning
    assert "the next identical call will be denied" in warning
    assert PREFIX in warning
    assert_refused(script)


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_run_sync_warns_then_denies(kind: str, brakes: Any) -> None:
    worker = Worker(repeating(), LoopBrakeCapability(brakes(kind, warn_at=2)))

    worker.agent.run_sync("weather?", conversation_id="conv-warn")

    assert worker.runs == ["weather", "weather"]
    assert_warned_then_refused(worker.script)


async def test_two_capabilities_of_one_brake_warn_once(brakes: Any) -> None:
    brake = brakes("loop", warn_at=2)
    worker = Worker(repeating(), LoopBrakeCapability(brake), LoopBrakeCapability(brake))

    await worker.agent.run("weather?")

    assert_warned_then_refused(worker.script)  # exactly one warning


POLLER = {"get_job_status": {"progress": True}}


class Poller:
    """An agent polling a progress-aware `get_job_status` that returns (or raises) its answers."""

    def __init__(self, brake: Any, answers: list[Any], polls: int) -> None:
        self.answers = iter(answers)
        self.runs = 0
        self.script = Script(*(
            [ToolCallPart("get_job_status", {"job": "j1"}, tool_call_id=f"poll_{i}")]
            for i in range(1, polls + 1)
        ))
        self.agent: Agent[None, str] = Agent(self.script.model, capabilities=[LoopBrakeCapability(brake)])

        @self.agent.tool_plain
        def get_job_status(job: str) -> str:
            """The status of a job."""
            self.runs += 1
            return str(next_answer(self.answers))

    def brake_refusals(self) -> list[str]:
        return [p.tool_call_id for p in self.script.refusals() if "loop brake" in p.model_response_str()]


async def test_a_raised_error_is_observed_as_a_result(brakes: Any) -> None:
    # Result, failure, result, ...: each differs from the one before, so the streak restarts.
    poller = Poller(brakes("sync-memory", tools=POLLER), ["running", ToolFailed("busy")] * 3, 6)

    await poller.agent.run("status?")

    assert poller.runs == 6
    assert poller.brake_refusals() == []
    assert [p.tool_call_id for p in poller.script.refusals()] == ["poll_2", "poll_4", "poll_6"]


# -- the session scope: a run (the default) or the whole conversation ----------------------

def one_search_per_turn(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Each user turn: one `search {"q": "weather"}`, then an answer."""
    last = messages[-1]
    if isinstance(last, ModelRequest) and any(isinstance(p, UserPromptPart) for p in last.parts):
        return ModelResponse(parts=[ToolCallPart("search", {"q": "weather"}, tool_call_id="call_0")])
    return ModelResponse(parts=[TextPart(FINAL)])


def test_a_session_id_callable_is_given_the_run_context(brakes: Any) -> None:
    brake = brakes("loop")
    seen: list[Any] = []

    def by_user(ctx: Any) -> str | None:
        seen.append(ctx)
        return None if ctx.run_step == 1 else f"user-{ctx.deps}"

    capability = LoopBrakeCapability(brake, session_id=by_user)
    script = repeating(4)
    agent: Agent[int, str] = Agent(script.model, deps_type=int, capabilities=[capability])
    agent.tool_plain(lambda q: f"results for {q}", name="search")

    agent.run_sync("weather?", deps=42, conversation_id="conv-callable", run_id="r-callable")

    assert len(seen) == 4 and all(type(ctx).__name__ == "RunContext" for ctx in seen)
    sessions = {state.session_id: state.count for state in brake.sessions()}
    assert sessions == {"conv-callable/run/r-callable": 1, "user-42": 3}  # step 1: None, the default
    assert_refused(script, "call_4")


def test_scope_and_session_id_are_checked_at_build_time() -> None:
    with pytest.raises(ConfigurationError, match="scope"):
        LoopBrakeCapability(LoopBrake(), scope="thread")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="session_id"):
        LoopBrakeCapability(LoopBrake(), session_id="conv-1")  # type: ignore[arg-type]
