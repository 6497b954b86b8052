"""Strands Agents integration: full agent invocations with the real event loop and tool executor.

The model is a `strands.models.Model` subclass scripted to call
`search {"q": "weather"}` again and again; no network, no keys. Runs in its
own environment (`pip install -e ".[strands,test]"`: strands pins an mcp the
mcp extra cannot share); `.ci/run` runs it there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from strands import Agent, tool
from strands.hooks import BeforeToolCallEvent
from strands.models import Model
from strands.types.exceptions import EventLoopException

from distbrake import LoopBrake, LoopBrakeError, call_hash, hash_prefix
from distbrake.integrations.strands import RUN_ID_KEY, LoopBrakeHook
from tests.adapters import Body, Run, Seen, assert_kept_in_process, refuses_bad_options
from tests.backends import ADAPTER_BRAKES, SYNC_ADAPTER_BRAKES, next_answer

PREFIX = hash_prefix(call_hash("search", {"q": "weather"}))
FINAL = "final answer: it is sunny"
Turn = Sequence[tuple[str, str, dict[str, Any]]]  # (toolUseId, tool, input) of one model turn


def calls(*ids: str, tool_name: str = "search", **arguments: Any) -> Turn:
    return [(i, tool_name, arguments or {"q": "weather"}) for i in ids]


class ScriptedModel(Model):
    """Plays `turns` (tool uses; each request takes the next), then answers; records every request."""

    def __init__(self, *turns: Turn) -> None:
        self.turns = list(turns)
        self.requests: list[list[dict[str, Any]]] = []

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return {}

    def structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    async def stream(self, messages: Any, tool_specs: Any = None, system_prompt: Any = None,
                     **kwargs: Any) -> AsyncIterator[Any]:
        self.requests.append(json.loads(json.dumps(messages, default=str)))
        yield {"messageStart": {"role": "assistant"}}
        if self.turns:
            for tool_use_id, name, arguments in self.turns.pop(0):
                yield {"contentBlockStart": {"start": {"toolUse": {"toolUseId": tool_use_id, "name": name}}}}
                yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(arguments)}}}}
                yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}
            return
        yield {"contentBlockDelta": {"delta": {"text": FINAL}}}
        yield {"contentBlockStop": {}}
        yield {"messageStop": {"stopReason": "end_turn"}}

    def results(self, request: int = -1) -> list[dict[str, Any]]:
        """Every tool result in one request's last message (the last request by default)."""
        last = self.requests[request][-1]
        return [block["toolResult"] for block in last["content"] if "toolResult" in block]

    def texts(self, request: int = -1) -> list[tuple[str, str, list[str]]]:
        return [
            (r["toolUseId"], r["status"], [c["text"] for c in r["content"]]) for r in self.results(request)
        ]

    def refusals(self) -> list[str]:
        return [
            r["toolUseId"] for request in range(1, len(self.requests)) for r in self.results(request)
            if r["status"] == "error" and r["content"][0]["text"].startswith("loop brake")
        ]


def repeating(n: int = 3, prefix: str = "call") -> ScriptedModel:
    return ScriptedModel(*(calls(f"{prefix}_{i}") for i in range(1, n + 1)))


class Worker:
    """An agent with a `search` tool counting its real runs."""

    def __init__(self, model: ScriptedModel, *hooks: LoopBrakeHook, agent_id: str = "default") -> None:
        self.model = model
        self.runs: list[str] = []

        @tool
        def search(q: str) -> str:
            """Search the web for q."""
            self.runs.append(q)
            return f"results for {q}"

        self.agent = Agent(model=model, tools=[search], hooks=list(hooks), agent_id=agent_id,
                           callback_handler=None)


class Driver:
    """The contract test's Strands: an `Agent` with the hook, `invoke_async` with the conversation in its
    invocation state."""

    async def run(self, brake: Any, body: Body, plan: Run, **options: Any) -> list[Seen]:
        @tool
        def search(q: str) -> str:
            """Search the web for q."""
            return body(q)

        model = ScriptedModel(*(calls(i) for i in plan.ids))
        agent = Agent(model=model, tools=[search], hooks=[LoopBrakeHook(brake, **options)], callback_handler=None)
        try:
            await agent.invoke_async("weather?", invocation_state={"session_id": plan.conversation})
        finally:
            plan.asked = len(model.requests)
        return [
            Seen(status == "error", "\n".join(texts)) for request in range(1, len(plan.ids) + 1)
            for _, status, texts in model.texts(request)
        ]


def assert_refused(model: ScriptedModel, call_id: str = "call_3") -> str:
    """The model's next request held the refusal of `call_id`, an error result with the brake's text."""
    assert model.refusals() == [call_id]
    [(_, status, [text])] = [t for t in model.texts(-1) if t[0] == call_id]
    assert status == "error"
    assert text.startswith('loop brake: tool "search" called 3 times in a row')
    assert PREFIX in text
    return text


# -- the whole loop ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_agent_call_denies_third_call_and_finishes(kind: str, brakes: Any) -> None:
    worker = Worker(repeating(), LoopBrakeHook(brakes(kind)))

    result = worker.agent("weather?")

    assert worker.runs == ["weather", "weather"]
    assert_refused(worker.model)
    assert len(worker.model.requests) == 4
    assert str(result).strip() == FINAL


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_on_deny_raise_ends_the_invocation(kind: str, brakes: Any) -> None:
    worker = Worker(repeating(), LoopBrakeHook(brakes(kind), on_deny="raise"))

    with pytest.raises(EventLoopException) as caught:
        await worker.agent.invoke_async("weather?", invocation_state={"session_id": "conv-raise"})

    assert worker.runs == ["weather", "weather"]
    assert len(worker.model.requests) == 3
    error = caught.value.__cause__
    assert isinstance(error, LoopBrakeError)
    assert (error.tool_name, error.count, error.max_repeats, error.hash_prefix) == ("search", 3, 3, PREFIX)
    assert error.session_id.startswith("conv-raise/run/")


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_parallel_identical_calls_in_one_turn(kind: str, brakes: Any) -> None:
    worker = Worker(ScriptedModel(calls("p1", "p2", "p3")), LoopBrakeHook(brakes(kind)))

    await worker.agent.invoke_async("weather?")

    assert len(worker.runs) == 2
    assert len(worker.model.refusals()) == 1


def test_tool_use_ids_repeated_every_turn_still_count(brakes: Any) -> None:
    worker = Worker(ScriptedModel(*(calls("search:0") for _ in range(3))), LoopBrakeHook(brakes("loop")))

    worker.agent("weather?")

    assert worker.runs == ["weather", "weather"]
    assert worker.model.refusals() == ["search:0"]


# -- session scope ------------------------------------------------------------------------------


def test_the_session_is_the_agent_id_without_one_in_the_invocation_state(brakes: Any) -> None:
    brake = brakes("loop")
    Worker(repeating(2), LoopBrakeHook(brake, scope="conversation"), agent_id="researcher").agent("weather?")

    state = brake.inspect("researcher")
    assert state is not None
    assert state.count == 2


def test_session_id_callable_gets_the_event(brakes: Any) -> None:
    seen: list[BeforeToolCallEvent] = []

    def name(event: BeforeToolCallEvent) -> str:
        seen.append(event)
        return "tenant-7"

    brake = brakes("loop")
    Worker(repeating(2), LoopBrakeHook(brake, session_id=name)).agent("weather?")

    assert [e.tool_use["toolUseId"] for e in seen] == ["call_1", "call_2"]
    assert isinstance(seen[0].invocation_state[RUN_ID_KEY], str)
    state = brake.inspect("tenant-7")
    assert state is not None
    assert state.count == 2


def test_options_are_validated() -> None:
    refuses_bad_options(LoopBrakeHook, session_id=False)


# -- warn before deny, progress-aware tools, arguments ------------------------------------------------


POLLER = {"get_job_status": {"progress": True}}


class Poller:
    def __init__(self, brake: Any, answers: list[Any], polls: int) -> None:
        answers_left = iter(answers)
        self.runs = 0
        self.model = ScriptedModel(*(
            calls(f"poll_{i}", tool_name="get_job_status", job="j1") for i in range(1, polls + 1)
        ))

        @tool
        def get_job_status(job: str) -> str:
            """The status of a job."""
            self.runs += 1
            return str(next_answer(answers_left))

        self.agent = Agent(model=self.model, tools=[get_job_status], hooks=[LoopBrakeHook(brake)],
                           callback_handler=None)


async def test_a_raised_error_is_observed_as_a_result(brakes: Any) -> None:
    poller = Poller(brakes("sync-memory", tools=POLLER), ["running", RuntimeError("busy")] * 3, 6)

    await poller.agent.invoke_async("status?")

    assert poller.runs == 6
    assert poller.model.refusals() == []


async def test_a_failing_tool_is_refused_after_max_failures() -> None:
    """A tool whose call fails (an error result of a raise) twice in a row: its third call is refused
    (`max_failures=2`) and never runs."""
    poller = Poller(LoopBrake(10, tools={"get_job_status": {"max_failures": 2}}), [RuntimeError("busy")] * 2, 3)

    await poller.agent.invoke_async("status?")

    assert poller.runs == 2
    [(_, status, [text])] = [t for t in poller.model.texts(-1) if t[0] == "poll_3"]
    assert status == "error" and text.startswith('loop brake: tool "get_job_status" failed 2 times in a row')


SECRET = "sk-live-SECRET-strands-7f3a"


@pytest.mark.parametrize("on_deny", ["message", "raise"])
def test_arguments_never_appear_in_what_the_brake_logs_or_returns(
    on_deny: str, brakes: Any, caplog: pytest.LogCaptureFixture
) -> None:
    brake = brakes("sync-memory")
    worker = Worker(ScriptedModel(*(calls(f"s{i}", q=SECRET) for i in (1, 2, 3))),
                    LoopBrakeHook(brake, on_deny=on_deny))  # type: ignore[arg-type]
    caplog.set_level(logging.DEBUG)

    shown: list[str] = []
    try:
        worker.agent("weather?")
        [(_, _, [refusal])] = [t for t in worker.model.texts(-1) if t[0] == "s3"]
        shown.append(refusal)
    except EventLoopException as failure:
        shown += [str(failure), repr(failure.__cause__)]

    assert "loop brake" in shown[0]
    assert worker.runs == [SECRET, SECRET]
    assert_kept_in_process(SECRET, shown, caplog.records, brake)
