"""Microsoft Agent Framework integration: full `Agent.run`s with the real function-invocation loop.

The model is a `BaseChatClient` with the framework's own `FunctionInvocationLayer`,
scripted to call `search {"q": "weather"}` again and again; no network, no
keys. Every brake kind of `ADAPTER_BRAKES` (the middleware is async).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from agent_framework import (
    Agent,
    AgentSession,
    BaseChatClient,
    ChatResponse,
    Content,
    FunctionInvocationContext,
    FunctionInvocationLayer,
    FunctionMiddleware,
    Message,
    MiddlewareFailure,
    tool,
)

from distbrake import LoopBrake, LoopBrakeError, call_hash, hash_prefix
from distbrake.integrations.agent_framework import LoopBrakeMiddleware
from tests.adapters import Body, Run, Seen, assert_kept_in_process, refuses_bad_options
from tests.backends import ADAPTER_BRAKES, next_answer

PREFIX = hash_prefix(call_hash("search", {"q": "weather"}))
FINAL = "final answer: it is sunny"
Turn = Sequence[tuple[str, str, dict[str, Any]]]  # (call id, tool, arguments) of one model turn


def calls(*ids: str, tool_name: str = "search", **arguments: Any) -> Turn:
    """One model turn calling `tool_name` once per id (several ids: a parallel turn)."""
    return [(i, tool_name, arguments or {"q": "weather"}) for i in ids]


class ScriptedClient(FunctionInvocationLayer[Any], BaseChatClient[Any]):
    """A chat client that plays `turns`, then answers; it records every request it was sent."""

    def __init__(self, *turns: Turn) -> None:
        super().__init__()
        self.turns = list(turns)
        self.requests: list[list[Message]] = []

    async def _inner_get_response(self, *, messages: Any, stream: bool, options: Any, **kwargs: Any) -> Any:
        made = len(self.requests)
        self.requests.append(list(messages))
        if made < len(self.turns):
            contents = [
                Content.from_function_call(call_id=i, name=name, arguments=arguments)
                for i, name, arguments in self.turns[made]
            ]
            return ChatResponse(messages=[Message(role="assistant", contents=contents)])
        return ChatResponse(messages=[Message(role="assistant", contents=[FINAL])])

    def results(self, request: int = -1) -> list[tuple[str, str]]:
        """(call id, result text) of every function result in one request (the last by default)."""
        return [
            (str(c.call_id), str(c.result)) for m in self.requests[request] for c in m.contents
            if c.type == "function_result"
        ]

    def refusals(self, request: int = -1) -> list[str]:
        return [i for i, text in self.results(request) if text.startswith("loop brake")]


def repeating(n: int = 3, prefix: str = "call") -> ScriptedClient:
    return ScriptedClient(*(calls(f"{prefix}_{i}") for i in range(1, n + 1)))


class Worker:
    """An agent with a `search` tool counting its real runs."""

    def __init__(self, client: ScriptedClient, *middleware: Any) -> None:
        self.client = client
        self.runs: list[str] = []

        @tool
        def search(q: str) -> str:
            """Search the web for q."""
            self.runs.append(q)
            return f"results for {q}"

        self.agent = Agent(client=client, tools=[search], middleware=list(middleware))

    async def ask(self, session: AgentSession | None = None, text: str = "weather?") -> str:
        return (await self.agent.run(text, session=session)).text


class Driver:
    """The contract test's Agent Framework: an `Agent` with the middleware, `run` in the conversation's
    `AgentSession`."""

    async def run(self, brake: Any, body: Body, plan: Run, **options: Any) -> list[Seen]:
        @tool
        def search(q: str) -> str:
            """Search the web for q."""
            return body(q)

        client = ScriptedClient(*(calls(i) for i in plan.ids))
        agent = Agent(client=client, tools=[search], middleware=[LoopBrakeMiddleware(brake, **options)])
        try:
            await agent.run("weather?", session=AgentSession(session_id=plan.conversation))
        finally:
            plan.asked = len(client.requests)
        return [Seen(text.startswith("loop brake"), text) for _, text in client.results()]


def assert_refused(client: ScriptedClient, call_id: str = "call_3") -> str:
    """The model's last request holds exactly one refusal, for `call_id`, with the brake's text."""
    [refused] = [text for i, text in client.results() if i == call_id]
    assert refused.startswith("loop brake: tool \"search\" called 3 times in a row"), client.results()
    assert PREFIX in refused
    assert client.refusals() == [call_id]
    return refused


# -- the whole loop ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_on_deny_raise_ends_the_run_with_middleware_failure(kind: str, brakes: Any) -> None:
    worker = Worker(repeating(), LoopBrakeMiddleware(brakes(kind), on_deny="raise"))

    with pytest.raises(MiddlewareFailure) as caught:
        await worker.ask(AgentSession(session_id="conv-raise"))

    assert worker.runs == ["weather", "weather"]
    assert len(worker.client.requests) == 3  # the model never got a third result
    error = caught.value.__cause__
    assert isinstance(error, LoopBrakeError)
    assert (error.tool_name, error.count, error.max_repeats, error.hash_prefix) == ("search", 3, 3, PREFIX)
    assert str(error) in str(caught.value)


class RaisingBrake(FunctionMiddleware):
    """What the adapter does not do: raise the brake's error from the middleware."""

    def __init__(self, brake: LoopBrake) -> None:
        self.brake = brake

    async def process(self, context: FunctionInvocationContext, call_next: Callable[[], Awaitable[None]]) -> None:
        self.brake.check(context.function.name, dict(context.arguments), session_id="s")
        await call_next()


async def test_the_trap_a_raised_denial_shows_the_model_only_function_failed(brakes: Any) -> None:
    """Why the adapter sets `context.result`: the loop hides a raised error's text from the model."""
    raising = Worker(repeating(), RaisingBrake(LoopBrake()))
    assert await raising.ask() == FINAL
    assert raising.runs == ["weather", "weather"]
    [(_, hidden)] = [r for r in raising.client.results() if r[0] == "call_3"]
    assert hidden == "Error: Function failed."  # the model never learns why

    adapter = Worker(repeating(), LoopBrakeMiddleware(brakes("loop")))
    assert await adapter.ask() == FINAL
    assert_refused(adapter.client)


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_parallel_identical_calls_in_one_turn(kind: str, brakes: Any) -> None:
    worker = Worker(ScriptedClient(calls("p1", "p2", "p3")), LoopBrakeMiddleware(brakes(kind)))

    assert await worker.ask(AgentSession(session_id="conv-parallel")) == FINAL

    assert len(worker.runs) == 2
    assert len(worker.client.refusals()) == 1


async def test_call_ids_repeated_every_turn_still_count(brakes: Any) -> None:
    worker = Worker(ScriptedClient(*(calls("search:0") for _ in range(3))), LoopBrakeMiddleware(brakes("loop")))

    assert await worker.ask() == FINAL

    assert worker.runs == ["weather", "weather"]
    assert worker.client.refusals() == ["search:0"]


async def test_a_different_call_breaks_the_streak(brakes: Any) -> None:
    client = ScriptedClient(calls("c1"), calls("c2"), calls("c3", q="news"), calls("c4"), calls("c5"))
    worker = Worker(client, LoopBrakeMiddleware(brakes("loop")))

    assert await worker.ask() == FINAL

    assert worker.runs == ["weather", "weather", "news", "weather", "weather"]
    assert client.refusals() == []


# -- session scope ------------------------------------------------------------------------------


async def test_session_id_callable_gets_the_invocation_context(brakes: Any) -> None:
    seen: list[FunctionInvocationContext] = []

    def name(context: FunctionInvocationContext) -> str:
        seen.append(context)
        return "tenant-7"

    brake = brakes("loop")
    worker = Worker(repeating(2), LoopBrakeMiddleware(brake, session_id=name))
    await worker.ask()

    assert len(seen) == 2
    assert seen[0].function.name == "search"
    state = brake.inspect("tenant-7")
    assert state is not None
    assert state.count == 2


def test_options_are_validated() -> None:
    refuses_bad_options(LoopBrakeMiddleware)


# -- warn before deny, progress-aware tools, arguments ------------------------------------------------


POLLER = {"get_job_status": {"progress": True}}


class Poller:
    """An agent polling a progress-aware `get_job_status` that returns (or raises) its answers."""

    def __init__(self, brake: Any, answers: list[Any], polls: int) -> None:
        answers_left = iter(answers)
        self.runs = 0
        self.client = ScriptedClient(*(
            calls(f"poll_{i}", tool_name="get_job_status", job="j1") for i in range(1, polls + 1)
        ))

        @tool
        def get_job_status(job: str) -> str:
            """The status of a job."""
            self.runs += 1
            return str(next_answer(answers_left))

        self.agent = Agent(client=self.client, tools=[get_job_status], middleware=[LoopBrakeMiddleware(brake)])


async def test_a_raised_error_is_observed_as_a_result(brakes: Any) -> None:
    poller = Poller(brakes("sync-memory", tools=POLLER), ["running", RuntimeError("busy")] * 3, 6)

    await poller.agent.run("status?")

    assert poller.runs == 6  # result, failure, result, ...: each differs from the one before
    assert poller.client.refusals() == []


SECRET = "sk-live-SECRET-af-7f3a"


@pytest.mark.parametrize("on_deny", ["message", "raise"])
async def test_arguments_never_appear_in_what_the_brake_logs_or_returns(
    on_deny: str, brakes: Any, caplog: pytest.LogCaptureFixture
) -> None:
    brake = brakes("sync-memory")
    worker = Worker(
        ScriptedClient(*(calls(f"s{i}", q=SECRET) for i in (1, 2, 3))),
        LoopBrakeMiddleware(brake, on_deny=on_deny),  # type: ignore[arg-type]
    )
    caplog.set_level(logging.DEBUG)

    shown: list[str] = []
    try:
        await worker.ask(AgentSession(session_id="conv-secret"))
        [refusal] = [text for i, text in worker.client.results() if i == "s3"]
        shown.append(refusal)
    except MiddlewareFailure as failure:
        shown += [str(failure), repr(failure.__cause__)]

    assert "loop brake" in shown[0]
    assert worker.runs == [SECRET, SECRET]
    assert_kept_in_process(SECRET, shown, caplog.records, brake)


# -- a call checked by two layers is counted once ----------------------------------------------------


@pytest.mark.parametrize("layers", ["one-brake", "two-brakes-one-redis"])
async def test_two_middlewares_count_a_call_once(layers: str, redis_url: str, brakes: Any) -> None:
    first = brakes("sync-redis", redis_url, warn_at=2)
    second = first if layers == "one-brake" else brakes("sync-redis", redis_url, warn_at=2)
    worker = Worker(repeating(), LoopBrakeMiddleware(first, session_id=lambda _: "twice"),
                    LoopBrakeMiddleware(second, session_id=lambda _: "twice"))

    assert await worker.ask() == FINAL

    assert worker.runs == ["weather", "weather"]  # not halved: each call counted once
    assert_refused(worker.client)
    state = first.inspect("twice")
    assert state is not None
    assert state.count == 3
    [(_, warned)] = worker.client.results(2)[1:]
    warnings = 1 if layers == "one-brake" else 2  # one per brake object: each counted the call once
    assert warned.count("the next identical call will be denied") == warnings
