"""LlamaIndex integration: full runs of a real `FunctionAgent` (a workflow) over braked tools.

The model is LlamaIndex's own `MockFunctionCallingLLM`, with a response
generator that plays a script of tool calls and records every message list
it is sent; no network, no keys. Agents call `acall`, so every adapter brake
kind works there; `call` (a sync caller) is driven directly with the sync ones.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import pytest
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool, ToolOutput
from workflows import Context

from distbrake import LoopBrake, LoopBrakeError, bind_session, call_hash, hash_prefix
from distbrake.integrations.llamaindex import BrakedFunctionTool, guard_tools, raise_on_denial
from tests.adapters import Body, Run, Seen, assert_kept_in_process, refuses_bad_options
from tests.backends import ADAPTER_BRAKES, SYNC_ADAPTER_BRAKES, next_answer
from tests.servers import free_port

# LlamaIndex's own warnings, not the adapter's: the workflow runtime lists a FunctionAgent's members
# (touching pydantic's deprecated `__fields__`), and a Context kept across runs skips the agent's memory.
pytestmark = [
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecationWarning"),
    pytest.mark.filterwarnings("ignore:Skipping serialization of known unserializable key"),
]

PREFIX = hash_prefix(call_hash("search", {"q": "weather"}))
FINAL = "It is sunny."


def call(name: str = "search", **args: Any) -> ToolCallBlock:
    return ToolCallBlock(tool_name=name, tool_kwargs=args or {"q": "weather"})


class Script:
    """A `MockFunctionCallingLLM` playing `turns` (tool calls, or text), then FINAL; it records its inputs."""

    def __init__(self, *turns: Sequence[ToolCallBlock] | str) -> None:
        self.turns = turns
        self.inputs: list[list[ChatMessage]] = []
        self.llm = MockFunctionCallingLLM(response_generator=self.respond)

    def respond(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        turn = len(self.inputs)
        self.inputs.append(list(messages))
        step = self.turns[turn] if turn < len(self.turns) else FINAL
        if isinstance(step, str):
            return ChatMessage(role=MessageRole.ASSISTANT, content=step)
        blocks = [block.model_copy(update={"tool_call_id": f"call_{turn}_{i}"}) for i, block in enumerate(step)]
        return ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)

    def results(self, turn: int) -> list[str]:
        """The tool results the model was sent in input `turn` (after its last assistant message)."""
        messages = self.inputs[turn]
        last = max(i for i, m in enumerate(messages) if m.role == MessageRole.ASSISTANT)
        return [m.content or "" for m in messages[last + 1:] if m.role == MessageRole.TOOL]


def repeating(n: int = 3, **args: Any) -> Script:
    return Script(*([call(**args)] for _ in range(n)))


class Tools:
    """A sync `search` and an async `get_job_status`, counting their real runs."""

    def __init__(self, answers: list[Any] | None = None) -> None:
        self.runs: list[str] = []
        self.answers = iter(answers or [])

        def search(q: str) -> str:
            """Search the web for q."""
            self.runs.append(q)
            return f"results for {q}"

        async def get_job_status(job: str) -> str:
            """The status of a job."""
            self.runs.append(job)
            return str(next_answer(self.answers))

        self.search = FunctionTool.from_defaults(search)
        self.poll = FunctionTool.from_defaults(async_fn=get_job_status)

    def agent(self, script: Script, brake: Any, **options: Any) -> FunctionAgent:
        return FunctionAgent(tools=guard_tools(brake, [self.search, self.poll], **options), llm=script.llm)


class Driver:
    """The contract test's LlamaIndex: a `FunctionAgent` over `guard_tools` copies, run in the conversation
    bound with `bind_session` (LlamaIndex names none)."""

    async def run(self, brake: Any, body: Body, plan: Run, **options: Any) -> list[Seen]:
        def search(q: str) -> str:
            """Search the web for q."""
            return body(q)

        script = repeating(len(plan.ids))
        agent = FunctionAgent(tools=guard_tools(brake, [FunctionTool.from_defaults(search)], **options), llm=script.llm)
        try:
            with bind_session(plan.conversation):
                await raise_on_denial(agent.run(user_msg="weather?"))
        finally:
            plan.asked = len(script.inputs)
        return [
            Seen(text.startswith("loop brake"), text) for turn in range(1, len(plan.ids) + 1)
            for text in script.results(turn)
        ]


def assert_refused(text: str, tool: str = "search") -> None:
    assert text.startswith(f'loop brake: tool "{tool}" called 3 times in a row')
    if tool == "search":
        assert PREFIX in text


# -- the whole loop ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_parallel_identical_calls_in_one_turn(kind: str, brakes: Any) -> None:
    tools, script = Tools(), Script([call(), call(), call()])

    await tools.agent(script, brakes(kind)).run(user_msg="weather?")

    assert len(tools.runs) == 2
    results = script.results(1)
    assert len(results) == 3
    assert sum(r.startswith("loop brake") for r in results) == 1


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_the_refusal_is_an_error_tool_output_without_the_arguments(kind: str, brakes: Any) -> None:
    tools = Tools()
    handler = tools.agent(repeating(), brakes(kind)).run(user_msg="weather?")

    outputs = [e.tool_output async for e in handler.stream_events() if isinstance(e, ToolCallResult)]
    await handler

    assert [o.is_error for o in outputs] == [False, False, True]
    assert outputs[2].raw_input == {}
    assert outputs[2].exception is None
    assert_refused(outputs[2].content)


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_on_deny_raise_ends_the_run_with_raise_on_denial(kind: str, brakes: Any) -> None:
    tools, script = Tools(), repeating()
    agent = tools.agent(script, brakes(kind), on_deny="raise")

    with bind_session("conv-raise"), pytest.raises(LoopBrakeError) as caught:
        await raise_on_denial(agent.run(user_msg="weather?"))

    error = caught.value
    assert (error.tool_name, error.count, error.max_repeats, error.hash_prefix) == ("search", 3, 3, PREFIX)
    assert error.session_id.startswith("conv-raise/run/")
    assert tools.runs == ["weather", "weather"]


async def test_on_deny_raise_alone_is_swallowed_by_the_agent() -> None:
    """LlamaIndex turns any exception a tool raises into an error result: the run goes on."""
    tools, script = Tools(), repeating()

    result = await tools.agent(script, LoopBrake(), on_deny="raise").run(user_msg="weather?")

    assert str(result) == FINAL
    assert tools.runs == ["weather", "weather"]
    assert_refused(script.results(3)[0])


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_sync_calls_are_braked(kind: str, brakes: Any) -> None:
    tools, brake = Tools(), brakes(kind)
    [search] = guard_tools(brake, [tools.search])

    outputs = [search.call(q="weather") for _ in range(3)]

    assert tools.runs == ["weather", "weather"]
    assert [o.is_error for o in outputs] == [False, False, True]
    assert_refused(outputs[2].content)
    with pytest.raises(LoopBrakeError):
        guard_tools(brake, [tools.search], on_deny="raise")[0].call(q="weather")  # the 4th in a row


def test_a_sync_call_with_an_async_brake_is_a_clear_type_error(brakes: Any) -> None:
    tools = Tools()
    [search] = guard_tools(brakes("async-memory"), [tools.search])

    with pytest.raises(TypeError, match="AsyncDistributedBrake"):
        search.call(q="weather")
    assert tools.runs == []


def test_copies_leave_the_originals_untouched_and_are_not_braked_twice() -> None:
    tools, brake = Tools(), LoopBrake()
    braked = guard_tools(brake, [tools.search])
    again = guard_tools(brake, braked)

    assert again[0] is braked[0]
    assert isinstance(braked[0], BrakedFunctionTool) and not isinstance(tools.search, BrakedFunctionTool)
    assert braked[0].metadata is tools.search.metadata
    for _ in range(4):
        assert not tools.search.call(q="weather").is_error  # the original is not braked
    with pytest.raises(TypeError, match="FunctionTool"):
        guard_tools(brake, [object()])  # type: ignore[list-item]


def test_partial_params_are_not_part_of_the_call() -> None:
    runs: list[str] = []

    def search(q: str, api_key: str) -> str:
        """Search the web for q."""
        runs.append(api_key)
        return "results"

    tool = FunctionTool.from_defaults(search, partial_params={"api_key": SECRET})
    [braked] = guard_tools(LoopBrake(), [tool])

    outputs = [braked(q="weather"), braked.call(q="weather"), braked(q="weather")]  # __call__ passes them in

    assert runs == [SECRET, SECRET]
    assert [o.is_error for o in outputs] == [False, False, True]


async def test_a_tool_taking_the_workflow_context_gets_it_and_it_is_not_hashed() -> None:
    seen: list[Any] = []

    async def lookup(ctx: Context, q: str) -> str:
        """Look q up."""
        seen.append(ctx)
        return "found"

    lookup.__annotations__["ctx"] = Context  # the class itself: LlamaIndex does not read string annotations

    brake = LoopBrake()
    sessions: list[Any] = []
    tools = guard_tools(brake, [FunctionTool.from_defaults(async_fn=lookup)], session_id=sessions.append)
    script = Script(*([call("lookup")] for _ in range(3)))

    await FunctionAgent(tools=tools, llm=script.llm).run(user_msg="?")

    assert len(seen) == 2
    assert all(isinstance(c, Context) for c in sessions) and len(sessions) == 3
    assert script.results(3)[0].startswith('loop brake: tool "lookup" called 3 times')


async def test_a_closed_policy_on_a_dead_backend_is_an_error_result_before_the_tool(brakes: Any) -> None:
    brake = brakes("sync-redis", f"redis://127.0.0.1:{free_port()}", on_backend_error="closed", timeout_seconds=0.2)
    tools, script = Tools(), repeating(1)

    await tools.agent(script, brake).run(user_msg="?")

    assert tools.runs == []
    assert "127.0.0.1" in script.results(1)[0]


# -- the session scope -----------------------------------------------------------------------


def test_options_are_validated() -> None:
    refuses_bad_options(lambda brake, **options: guard_tools(brake, [], **options))


# -- two workers sharing one real Redis ---------------------------------------------------


async def test_two_workers_on_different_runs_do_not_share_a_streak(redis_url: str, brakes: Any) -> None:
    tools_a, tools_b = Tools(), Tools()

    with bind_session("shared"):
        await tools_a.agent(repeating(2), brakes("sync-redis", redis_url)).run(user_msg="weather?")
        await tools_b.agent(repeating(2), brakes("sync-redis", redis_url)).run(user_msg="weather?")

    assert (len(tools_a.runs), len(tools_b.runs)) == (2, 2)


# -- warn before deny, progress-aware tools, arguments kept in -------------------------------


POLLER = {"get_job_status": {"progress": True}}


def polls(n: int) -> Script:
    return Script(*([call("get_job_status", job="j1")] for _ in range(n)))


async def test_a_raised_error_is_observed_as_a_result() -> None:
    # Result, failure, result, ...: each differs from the one before, so the streak restarts.
    tools, script = Tools(["running", RuntimeError("busy")] * 3), polls(6)

    await tools.agent(script, LoopBrake(tools=POLLER)).run(user_msg="status?")

    assert len(tools.runs) == 6
    assert [script.results(t)[0] for t in (2, 4, 6)] == ["busy"] * 3


async def test_a_failing_tool_is_refused_after_max_failures() -> None:
    """A tool whose call fails (LlamaIndex's error output of a raise) twice in a row: its third call is refused
    (`max_failures=2`) and never runs."""
    tools, script = Tools([RuntimeError("busy")] * 2 + ["never"]), polls(3)

    await tools.agent(script, LoopBrake(10, tools={"get_job_status": {"max_failures": 2}})).run(user_msg="?")

    assert len(tools.runs) == 2
    assert script.results(3)[0].startswith('loop brake: tool "get_job_status" failed 2 times in a row')


SECRET = "sk-live-7f3a9c2e1b"


async def test_arguments_never_leave_the_process(
    redis_url: str, brakes: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    tools, script = Tools(), repeating(q=SECRET)
    handler = tools.agent(script, brakes("sync-redis", redis_url, warn_at=2)).run(user_msg="?")
    outputs: list[ToolOutput] = [e.tool_output async for e in handler.stream_events() if isinstance(e, ToolCallResult)]
    await handler
    [raising] = guard_tools(brakes("sync-redis", redis_url), [tools.search], on_deny="raise")
    raising.call(q=SECRET), raising.call(q=SECRET)
    with pytest.raises(LoopBrakeError) as caught:
        raising.call(q=SECRET)

    refusal, warning = outputs[2], outputs[1].blocks[-1]
    shown = [refusal.model_dump_json(), warning.model_dump_json(), str(caught.value), repr(caught.value)]
    assert_kept_in_process(SECRET, shown, caplog.records, redis_url=redis_url)
