"""OpenAI Agents SDK: `loop_brake_guardrail` / `attach_loop_brake`, on every brake kind.

Offline: `agents.testing.ScriptedModel` plays the model, tracing is disabled,
no API key is needed.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from agents import (
    Agent,
    FunctionTool,
    RunConfig,
    Runner,
    ToolGuardrailFunctionOutput,
    ToolInputGuardrailData,
    ToolInputGuardrailTripwireTriggered,
    ToolOutputText,
    WebSearchTool,
    function_tool,
    tool_input_guardrail,
)
from agents.exceptions import UserError
from agents.run_config import ToolExecutionConfig
from agents.testing import ScriptedModel, assistant_message, function_call

from distbrake import (
    ConfigurationError,
    LoopBrake,
    bind_session,
    call_hash,
    hash_prefix,
)
from distbrake.integrations.openai_agents import (
    GUARDRAIL_NAME,
    attach_loop_brake,
    loop_brake_guardrail,
    tool_arguments,
)
from tests.adapters import Body, Run, Seen
from tests.backends import AnyBrake as Brake
from tests.backends import inspect_count, next_answer, session_names

ARGS = {"q": "weather"}
PREFIX = hash_prefix(call_hash("search", ARGS))


@pytest.fixture(autouse=True)
def no_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    # Belt and braces: every run also passes RunConfig(tracing_disabled=True).
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)


def config(group_id: str | None = "conv-1", **options: Any) -> RunConfig:
    return RunConfig(group_id=group_id, tracing_disabled=True, **options)


# -- an agent with one counted tool -------------------------------------------------


class Search:
    """Builds `search` function tools that count how often their body ran."""

    def __init__(self) -> None:
        self.runs = 0

    def tool(self, *guardrails: Any, needs_approval: bool = False) -> FunctionTool:
        def search(q: str) -> str:
            """Search the web."""
            self.runs += 1
            return f"results for {q}"

        return function_tool(
            search, tool_input_guardrails=list(guardrails) or None, needs_approval=needs_approval
        )


class Driver:
    """The contract test's OpenAI Agents SDK: an agent braked by `attach_loop_brake`, a `ScriptedModel`,
    `Runner.run` in the conversation `RunConfig.group_id` names."""

    async def run(self, brake: Any, body: Body, plan: Run, **options: Any) -> list[Seen]:
        def search(q: str) -> str:
            """Search the web."""
            return body(q)

        model = ScriptedModel([*(calls(i) for i in plan.ids), [assistant_message("final answer")]])
        agent = Agent(name="researcher", model=model, tools=[function_tool(search)])
        attach_loop_brake(agent, brake, **options)
        try:
            await Runner.run(agent, "weather?", run_config=config(plan.conversation))
        finally:
            plan.asked = len(model.calls)
        seen = outputs(model)
        return [Seen(seen[i].startswith("loop brake"), seen[i]) for i in plan.ids]


def calls(*call_ids: str, arguments: Any = ARGS) -> list[Any]:
    return [function_call("search", arguments, call_id=call_id) for call_id in call_ids]


def one_call_per_turn(n: int = 3) -> ScriptedModel:
    turns: list[Any] = [calls(f"call_{i}") for i in range(1, n + 1)]
    return ScriptedModel([*turns, [assistant_message("final answer")]])


def outputs(model: ScriptedModel) -> dict[str, str]:
    """call_id -> function_call_output the model saw on its last call."""
    last = model.last_call
    assert last is not None
    found: dict[str, str] = {}
    for item in last.input:
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            found[item["call_id"]] = str(item["output"])
    return found


def assert_refusal(text: str, count: int = 3) -> None:
    assert "loop brake" in text
    assert PREFIX in text
    assert f"called {count} times in a row" in text


# -- the full loop ------------------------------------------------------------------


async def test_third_identical_call_is_rejected_and_the_run_goes_on(
    make_brake: Callable[..., Brake],
) -> None:
    brake = make_brake()
    search = Search()
    model = ScriptedModel([
        calls("call_1"),
        calls("call_2", arguments='{ "q" : "weather" }'),  # other spelling, same call
        calls("call_3"),
        [assistant_message("final answer")],
    ])
    agent = Agent(name="researcher", model=model, tools=[search.tool(loop_brake_guardrail(brake))])
    result = await Runner.run(agent, "weather?", run_config=config())
    assert result.final_output == "final answer"
    assert search.runs == 2
    seen = outputs(model)
    assert seen["call_1"] == seen["call_2"] == "results for weather"
    assert_refusal(seen["call_3"])
    behaviors = [r.output.behavior["type"] for r in result.tool_input_guardrail_results]
    assert behaviors == ["allow", "allow", "reject_content"]
    assert [r.guardrail.get_name() for r in result.tool_input_guardrail_results] == [
        GUARDRAIL_NAME
    ] * 3
    info = result.tool_input_guardrail_results[2].output.output_info
    assert info["hash_prefix"] == PREFIX
    assert info["session_id"].startswith("conv-1/run/")  # the default scope: this run
    assert model.remaining_steps == 0
    assert await inspect_count(brake, info["session_id"]) == 3


async def test_on_deny_raise_aborts_the_run(make_brake: Callable[..., Brake]) -> None:
    brake = make_brake()
    search = Search()
    model = one_call_per_turn()
    agent = Agent(name="researcher", model=model, tools=[search.tool()])
    attach_loop_brake(agent, brake, on_deny="raise")
    with pytest.raises(ToolInputGuardrailTripwireTriggered) as raised:
        await Runner.run(agent, "weather?", run_config=config())
    assert raised.value.guardrail.get_name() == GUARDRAIL_NAME
    info = raised.value.output.output_info
    assert (info["code"], info["kind"]) == ("LOOP_BRAKE", "repeat")
    assert (info["tool_name"], info["count"], info["max_repeats"]) == ("search", 3, 3)
    assert info["hash_prefix"] == PREFIX
    assert_refusal(info["message"])
    assert search.runs == 2
    assert model.remaining_steps == 1  # the final answer was never asked for


async def test_three_identical_calls_in_one_turn(make_brake: Callable[..., Brake]) -> None:
    """The SDK runs a turn's calls concurrently; each check is atomic, so one is refused."""
    brake = make_brake()
    search = Search()
    model = ScriptedModel([calls("call_1", "call_2", "call_3"), [assistant_message("done")]])
    agent = Agent(name="researcher", model=model, tools=[search.tool(loop_brake_guardrail(brake))])
    result = await Runner.run(agent, "weather?", run_config=config())
    assert result.final_output == "done"
    assert search.runs == 2
    seen = outputs(model)
    refused = [text for text in seen.values() if "loop brake" in text]
    assert len(seen) == 3
    assert len(refused) == 1
    assert_refusal(refused[0])


async def test_sync_runner() -> None:
    # Runner.run_sync needs no running loop: run it in a worker thread.
    brake = LoopBrake()
    search = Search()
    model = one_call_per_turn()
    agent = Agent(name="researcher", model=model, tools=[search.tool(loop_brake_guardrail(brake))])

    def run_sync() -> Any:
        # run_sync keeps the thread's default loop open for reuse: give it one we close.
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            return Runner.run_sync(agent, "weather?", run_config=config())
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    result = await asyncio.to_thread(run_sync)
    assert result.final_output == "final answer"
    assert search.runs == 2


# -- sessions -----------------------------------------------------------------------


@dataclass
class AppContext:
    session_id: str | None = None
    user: str = "alice"


async def run_once(brake: Brake, scope: Any = "run", **run: Any) -> None:
    model = ScriptedModel([calls("call_1"), [assistant_message("ok")]])
    guardrail = loop_brake_guardrail(brake, scope=scope)
    agent = Agent(name="a", model=model, tools=[Search().tool(guardrail)])
    await Runner.run(agent, "hi", **run)


def run_session(conversation: str | None) -> str:
    """A pattern for the run-scoped session of `conversation` (a run id is 32 hex digits)."""
    return ("" if conversation is None else re.escape(conversation) + "/") + "run/[0-9a-f]{32}"


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        ({"context": AppContext("ctx-attr"), "run_config": config()}, "ctx-attr"),
        ({"context": {"session_id": "ctx-key"}, "run_config": config()}, "ctx-key"),
        ({"context": AppContext(), "run_config": config("conv-9")}, "conv-9"),
        ({"context": {"session_id": 42}, "run_config": config()}, "42"),
        ({"run_config": config(None)}, "default"),
    ],
    ids=["context-attribute", "context-key", "group-id", "int-id", "default"],
)
async def test_default_session(run: dict[str, Any], expected: str) -> None:
    by_conversation, by_run = LoopBrake(), LoopBrake()
    await run_once(by_conversation, "conversation", **run)
    await run_once(by_run, **run)
    assert [s.session_id for s in by_conversation.sessions()] == [expected]
    [session] = [s.session_id for s in by_run.sessions()]
    assert re.fullmatch(run_session(None if expected == "default" else expected), session)


async def test_bound_session_is_the_last_fallback() -> None:
    by_conversation, by_run = LoopBrake(), LoopBrake()
    with bind_session("bound"):
        for brake, scope in ((by_conversation, "conversation"), (by_run, "run")):
            await run_once(brake, scope, run_config=config(None))
            await run_once(brake, scope, run_config=config("conv-2"))
    assert sorted(s.session_id for s in by_conversation.sessions()) == ["bound", "conv-2"]
    bound, conv = sorted(s.session_id for s in by_run.sessions())
    assert re.fullmatch(run_session("bound"), bound)
    assert re.fullmatch(run_session("conv-2"), conv)


async def test_session_id_overrides_and_none_falls_back() -> None:
    brake = LoopBrake()
    seen: list[str] = []

    def by_user(data: ToolInputGuardrailData) -> str | None:
        seen.append(data.context.tool_call_id)
        context = data.context.context
        return f"user:{context.user}" if isinstance(context, AppContext) else None

    for context in (AppContext("ignored"), None):
        model = ScriptedModel([calls("call_1"), [assistant_message("ok")]])
        tool = Search().tool(loop_brake_guardrail(brake, session_id=by_user))
        agent = Agent(name="a", model=model, tools=[tool])
        await Runner.run(agent, "hi", context=context, run_config=config("conv-3"))
    assert seen == ["call_1", "call_1"]
    fallback, chosen = sorted(s.session_id for s in brake.sessions())
    assert chosen == "user:alice"
    assert re.fullmatch(run_session("conv-3"), fallback)  # None: the default rule


# -- approval: the guardrail runs twice for one call ----------------------------------


async def test_pre_approval_guardrails_count_each_call_once(
    make_brake: Callable[..., Brake],
) -> None:
    brake = make_brake()
    search = Search()
    model = one_call_per_turn()
    checked: list[str] = []

    @tool_input_guardrail
    def audit(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        checked.append(data.context.tool_call_id)
        return ToolGuardrailFunctionOutput.allow()

    agent = Agent(
        name="careful",
        model=model,
        tools=[search.tool(audit, loop_brake_guardrail(brake), needs_approval=True)],
    )
    run_config = config(tool_execution=ToolExecutionConfig(pre_approval_tool_input_guardrails=True))
    result = await Runner.run(agent, "weather?", run_config=run_config)
    approvals = 0
    while result.interruptions:
        state = result.to_state()
        for item in result.interruptions:
            state.approve(item)
            approvals += 1
        result = await Runner.run(agent, state, run_config=run_config)
    # call_1 and call_2: checked before approval and again after it, counted once each;
    # call_3 is refused before it is even put to the approver.
    assert approvals == 2
    assert checked == ["call_1", "call_1", "call_2", "call_2", "call_3"]
    assert result.final_output == "final answer"
    assert search.runs == 2
    assert_refusal(outputs(model)["call_3"])
    [session] = await session_names(brake)  # one run, however often it was resumed
    assert re.fullmatch(run_session("conv-1"), session)
    assert await inspect_count(brake, session) == 3


# -- attach_loop_brake and the argument parsing ---------------------------------------


async def test_attach_loop_brake_appends_once_per_brake() -> None:
    @tool_input_guardrail
    def audit(data: ToolInputGuardrailData) -> ToolGuardrailFunctionOutput:
        return ToolGuardrailFunctionOutput.allow()

    brake, other = LoopBrake(), LoopBrake()
    search, plain = Search().tool(audit), Search().tool()
    hosted = WebSearchTool()
    agent = Agent(name="a", tools=[search, plain, hosted])
    assert attach_loop_brake(agent, brake) is agent
    attach_loop_brake(agent, brake)  # again: no second guardrail on the same brake
    assert [g.get_name() for g in search.tool_input_guardrails or []] == ["audit", GUARDRAIL_NAME]
    assert [g.get_name() for g in plain.tool_input_guardrails or []] == [GUARDRAIL_NAME]
    attach_loop_brake(agent, other, name="second_brake")
    assert [g.get_name() for g in plain.tool_input_guardrails or []] == [
        GUARDRAIL_NAME,
        "second_brake",
    ]
    assert not hasattr(hosted, "tool_input_guardrails")


def test_on_deny_is_checked() -> None:
    with pytest.raises(ValueError, match="on_deny"):
        loop_brake_guardrail(LoopBrake(), on_deny="ignore")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("raw", "hashed"),
    [
        ('{"q":"weather"}', ARGS),
        ('{ "q" : "weather" }', ARGS),
        ("", {}),
        ("  ", {}),
        ("not json", "not json"),
        ('{"q": NaN}', '{"q": NaN}'),  # not JSON either: hashed as it is
        ("[1, 2]", [1, 2]),
    ],
)
def test_tool_arguments(raw: str, hashed: Any) -> None:
    assert tool_arguments(raw) == hashed


# -- warn before deny, progress-aware tools (issue 10) ------------------------------


def outputs_of(model: ScriptedModel, turn: int) -> dict[str, Any]:
    """call_id -> function_call_output in the input of the model's call number `turn` (from 0)."""
    found: dict[str, Any] = {}
    for item in model.calls[turn].input:
        if isinstance(item, dict) and item.get("type") == "function_call_output":
            found[item["call_id"]] = item["output"]
    return found


async def test_a_structured_output_gets_the_warning_as_its_own_text() -> None:
    def search(q: str) -> list[ToolOutputText]:
        """Search the web."""
        return [ToolOutputText(text=f"results for {q}")]

    model = one_call_per_turn()
    agent = attach_loop_brake(
        Agent(name="researcher", model=model, tools=[function_tool(search)]), LoopBrake(warn_at=2)
    )
    await Runner.run(agent, "weather?", run_config=config())
    output, warning = outputs_of(model, 2)["call_2"]
    assert output["text"] == "results for weather"
    assert "called 2 times in a row" in warning["text"]


POLLER = {"get_job_status": {"progress": True}}


class Poller:
    """A progress-aware `get_job_status` tool returning (or raising) its answers, polled `polls` times."""

    def __init__(self, brake: Brake, answers: list[Any], polls: int, **tool: Any) -> None:
        self.answers = iter(answers)
        self.runs = 0

        def get_job_status(job: str) -> str:
            """The status of a job."""
            self.runs += 1
            return str(next_answer(self.answers))

        turns: list[Any] = [
            [function_call("get_job_status", {"job": "j1"}, call_id=f"poll_{i}")]
            for i in range(1, polls + 1)
        ]
        self.model = ScriptedModel([*turns, [assistant_message("done")]])
        self.agent = attach_loop_brake(
            Agent(name="poller", model=self.model, tools=[function_tool(get_job_status, **tool)]),
            brake,
        )

    async def refusals(self) -> list[str]:
        await Runner.run(self.agent, "status?", run_config=config())
        return [call_id for call_id, output in outputs(self.model).items() if "loop brake" in output]


@pytest.mark.parametrize("failure", ["default", "none"])
async def test_a_raised_error_is_observed_as_a_result(failure: str) -> None:
    # Result, error, result, ...: each differs from the one before, so the streak restarts.
    answers: list[Any] = ["running", RuntimeError("backend busy")] * 3
    brake = LoopBrake(tools=POLLER)
    if failure == "default":  # the SDK turns the exception into an error text the model reads
        poller = Poller(brake, answers, 6)
        assert await poller.refusals() == []
        assert poller.runs == 6
        return
    poller = Poller(brake, answers, 2, failure_error_function=None)
    with pytest.raises(UserError, match="backend busy"):  # observed, re-raised, wrapped by the SDK
        await poller.refusals()
    assert poller.runs == 2
    [state] = brake.sessions()
    assert state.count == 1  # the error differed from the result before: the streak restarted


# -- the session scope: a run (the default) or the whole conversation ----------------------

DAYS = ("monday", "tuesday", "wednesday")


async def week(brake: Brake, streamed: bool = False, **options: Any) -> tuple[Search, list[str]]:
    """One conversation, three user turns (three runs), each making one identical `search`."""
    search = Search()
    turns = [[step] for i in range(3) for step in (*calls(f"call_{i}"), assistant_message(f"a{i}"))]
    model = ScriptedModel(turns)
    agent = attach_loop_brake(Agent(name="assistant", model=model, tools=[search.tool()]), brake, **options)
    history: list[Any] = []
    behaviors: list[str] = []
    for day in DAYS:
        turn: Any = [*history, {"role": "user", "content": day}]
        if streamed:
            result: Any = Runner.run_streamed(agent, turn, run_config=config("week"))
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, turn, run_config=config("week"))
        history = result.to_input_list()
        behaviors += [r.output.behavior["type"] for r in result.tool_input_guardrail_results]
    return search, behaviors


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_scope_conversation_counts_across_user_turns(streamed: bool) -> None:
    search, behaviors = await week(LoopBrake(), streamed, scope="conversation")

    assert behaviors == ["allow", "allow", "reject_content"]
    assert search.runs == 2


async def test_run_streamed_is_a_run_too() -> None:
    search, behaviors = await week(LoopBrake(), streamed=True)

    assert behaviors == ["allow", "allow", "allow"]
    assert search.runs == 3


def test_scope_and_session_id_are_checked_at_build_time() -> None:
    agent = Agent(name="a", tools=[Search().tool()])
    for build in (lambda **o: loop_brake_guardrail(LoopBrake(), **o),
                  lambda **o: attach_loop_brake(agent, LoopBrake(), **o)):
        with pytest.raises(ConfigurationError, match="scope"):
            build(scope="thread")
        with pytest.raises(TypeError, match="session_id"):
            build(session_id="conv-1")
    assert agent.tools[0].tool_input_guardrails is None  # nothing attached by a failed build


async def test_one_streamed_run_is_one_streak() -> None:
    search = Search()
    agent = attach_loop_brake(Agent(name="a", model=one_call_per_turn(), tools=[search.tool()]), LoopBrake())
    result = Runner.run_streamed(agent, "weather?", run_config=config())
    async for _ in result.stream_events():
        pass

    assert [r.output.behavior["type"] for r in result.tool_input_guardrail_results] == [
        "allow", "allow", "reject_content",
    ]
    assert search.runs == 2
