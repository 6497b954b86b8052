"""LangChain 1.x / LangGraph integration: full agent loops with the real framework.

The model is LangChain's own fake chat model, scripted to call
`search {"q": "weather"}` again and again; no network, no keys. Brakes: the
in-process LoopBrake, DistributedBrake on the embedded backend and on a real
redis-server, and AsyncDistributedBrake (async runs only).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatResult
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command
from pydantic import Field

from distbrake import (
    AsyncDistributedBrake,
    ConfigurationError,
    LoopBrake,
    LoopBrakeError,
    bind_session,
    call_hash,
    hash_prefix,
)
from distbrake.integrations.langchain import LoopBrakeMiddleware, tool_call_wrappers
from tests.adapters import Body, Run, Seen
from tests.backends import ADAPTER_BRAKES, SYNC_ADAPTER_BRAKES, memory_url, next_answer

ROOT = Path(__file__).resolve().parents[1]
PREFIX = hash_prefix(call_hash("search", {"q": "weather"}))
FINAL = "final answer: it is sunny"
INPUT: Any = {"messages": [{"role": "user", "content": "weather?"}]}


def config(thread_id: str, run_id: uuid.UUID | None = None) -> Any:
    found: dict[str, Any] = {"configurable": {"thread_id": thread_id}}
    if run_id is not None:
        found["run_id"] = run_id
    return found


# -- the scripted model, the tool, the brakes ------------------------------------------


class ScriptedModel(FakeMessagesListChatModel):
    """LangChain's fake list model, usable by `create_agent`, recording every prompt."""

    prompts: list[list[BaseMessage]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self  # create_agent always binds the tools; the script ignores them

    def _generate(
        self, messages: list[BaseMessage], stop: list[str] | None = None,
        run_manager: Any = None, **kwargs: Any,
    ) -> ChatResult:
        self.prompts.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)

    def refusals(self) -> list[ToolMessage]:
        """The error ToolMessages in the last prompt the model received."""
        return [m for m in self.prompts[-1] if isinstance(m, ToolMessage) and m.status == "error"]


def calls(*ids: str, q: str = "weather") -> AIMessage:
    """One model turn calling `search` once per id (several ids: a parallel turn)."""
    return AIMessage(
        content="",
        tool_calls=[{"name": "search", "args": {"q": q}, "id": i, "type": "tool_call"} for i in ids],
    )


def model(*turns: AIMessage) -> ScriptedModel:
    return ScriptedModel(responses=[*turns, AIMessage(content=FINAL)])


def repeating(n: int = 3, prefix: str = "call") -> ScriptedModel:
    """A model that calls `search {"q": "weather"}` n times in a row, then answers."""
    return model(*(calls(f"{prefix}_{i}") for i in range(1, n + 1)))


class Search:
    """The tool, counting how many times its body really ran."""

    def __init__(self) -> None:
        self.runs: list[str] = []

        @tool
        def search(q: str) -> str:
            """Search the web for q."""
            self.runs.append(q)
            return f"results for {q}"

        self.tool: BaseTool = search


@pytest.fixture
def search() -> Search:
    return Search()


class Driver:
    """The contract test's LangChain: `create_agent` with the middleware, run by `ainvoke` in a thread."""

    async def run(self, brake: Any, body: Body, plan: Run, **options: Any) -> list[Seen]:
        @tool
        def search(q: str) -> str:
            """Search the web for q."""
            return body(q)

        scripted = model(*(calls(i) for i in plan.ids))
        agent = create_agent(scripted, [search], middleware=[LoopBrakeMiddleware(brake, **options)])
        try:
            result = await agent.ainvoke(INPUT, config(plan.conversation))
        finally:
            plan.asked = len(scripted.prompts)
        return [
            Seen(m.status == "error", str(m.content)) for m in result["messages"] if isinstance(m, ToolMessage)
        ]


def assert_refused(scripted: ScriptedModel, call_id: str = "call_3") -> ToolMessage:
    """The model's last prompt held exactly one refusal, for `call_id`, with the brake's text."""
    refusals = scripted.refusals()
    assert len(refusals) == 1, refusals
    refusal = refusals[0]
    assert refusal.tool_call_id == call_id
    assert refusal.name == "search"
    assert isinstance(refusal.content, str)
    assert "loop brake" in refusal.content
    assert PREFIX in refusal.content
    return refusal


# -- create_agent: the whole loop -------------------------------------------------------


def braked_agent(search: Search, brake: Any, scripted: Any = None, **options: Any) -> tuple[Any, Any]:
    """(the scripted model, by default repeating search; a create_agent graph with the brake's middleware)."""
    scripted = repeating() if scripted is None else scripted
    return scripted, create_agent(scripted, [search.tool], middleware=[LoopBrakeMiddleware(brake, **options)])


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_agent_invoke_denies_third_call_and_finishes(
    kind: str, brakes: Callable[..., Any], search: Search
) -> None:
    scripted, agent = braked_agent(search, brakes(kind))

    result = agent.invoke(INPUT, config("t-sync"))

    assert search.runs == ["weather", "weather"]
    assert_refused(scripted)
    assert result["messages"][-1].content == FINAL
    assert len(scripted.prompts) == 4  # 3 tool turns, then the final answer


@pytest.mark.parametrize("streamed", ["stream", "astream"])
async def test_agent_stream_and_astream_deny_third_call(
    brakes: Callable[..., Any], search: Search, streamed: str
) -> None:
    scripted, agent = braked_agent(search, brakes("sync-memory" if streamed == "stream" else "async-memory"))

    if streamed == "stream":
        chunks = list(agent.stream(INPUT, config("t-stream"), stream_mode="updates"))
    else:
        chunks = [chunk async for chunk in agent.astream(INPUT, config("t-astream"))]

    assert search.runs == ["weather", "weather"]
    assert_refused(scripted)
    assert chunks


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_agent_invoke_on_deny_raise_aborts_the_run(
    kind: str, brakes: Callable[..., Any], search: Search
) -> None:
    scripted, agent = braked_agent(search, brakes(kind), on_deny="raise")

    with pytest.raises(LoopBrakeError) as caught:
        agent.invoke(INPUT, config("t-raise"))

    assert search.runs == ["weather", "weather"]
    error = caught.value
    assert (error.tool_name, error.count, error.max_repeats) == ("search", 3, 3)
    assert error.hash_prefix == PREFIX
    assert error.session_id.startswith("t-raise/run/")  # the thread's run (the user turn)
    assert len(scripted.prompts) == 3  # the model never got a 4th turn


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_agent_ainvoke_on_deny_raise_aborts_the_run(
    kind: str, brakes: Callable[..., Any], search: Search
) -> None:
    _scripted, agent = braked_agent(search, brakes(kind), on_deny="raise")

    with pytest.raises(LoopBrakeError) as caught:
        await agent.ainvoke(INPUT, config("t-araise"))

    assert search.runs == ["weather", "weather"]
    assert caught.value.session_id.startswith("t-araise/run/")
    assert caught.value.hash_prefix == PREFIX


def test_a_different_call_breaks_the_streak(brakes: Callable[..., Any], search: Search) -> None:
    scripted = model(
        calls("c1"), calls("c2"), calls("c3", q="news"), calls("c4"), calls("c5"), calls("c6"),
    )
    agent = create_agent(scripted, [search.tool], middleware=[LoopBrakeMiddleware(brakes("loop"))])

    result = agent.invoke(INPUT, config("t-streak"))

    assert search.runs == ["weather", "weather", "news", "weather", "weather"]
    assert_refused(scripted, "c6")
    assert result["messages"][-1].content == FINAL


@pytest.mark.parametrize(("scope", "session"), [("run", "run/"), ("conversation", "default")])
def test_without_a_thread_id_the_session_is_the_run_or_default(
    scope: Any, session: str, brakes: Callable[..., Any], search: Search
) -> None:
    middleware = LoopBrakeMiddleware(brakes("loop"), on_deny="raise", scope=scope)
    agent = create_agent(repeating(), [search.tool], middleware=[middleware])

    with pytest.raises(LoopBrakeError) as caught:
        agent.invoke(INPUT)

    assert caught.value.session_id.startswith(session)


def test_without_a_thread_id_a_bound_session_stands_for_it(brakes: Callable[..., Any], search: Search) -> None:
    middleware = LoopBrakeMiddleware(brakes("loop"), on_deny="raise")
    agent = create_agent(repeating(), [search.tool], middleware=[middleware])

    with bind_session("ticket-9"), pytest.raises(LoopBrakeError) as caught:
        agent.invoke(INPUT)

    assert caught.value.session_id.startswith("ticket-9/run/")


def test_sync_run_with_an_async_brake_is_a_clear_type_error(search: Search) -> None:
    brake = AsyncDistributedBrake.from_url(memory_url())
    agent = create_agent(repeating(), [search.tool], middleware=[LoopBrakeMiddleware(brake)])

    with pytest.raises(TypeError, match="AsyncDistributedBrake"):
        agent.invoke(INPUT, config("t-type"))

    assert search.runs == []  # refused before the first tool body


def test_on_deny_is_validated() -> None:
    with pytest.raises(ValueError, match="on_deny"):
        LoopBrakeMiddleware(LoopBrake(), on_deny="ignore")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        tool_call_wrappers(LoopBrake(), on_deny="warn")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="check"):
        LoopBrakeMiddleware(object())  # type: ignore[arg-type]


# -- two workers sharing one real Redis ---------------------------------------------------


async def test_two_async_workers_share_one_runs_streak_through_redis(
    redis_url: str, brakes: Callable[..., Any]
) -> None:
    search_a, search_b = Search(), Search()
    model_b = repeating(1, "b")
    worker_a = create_agent(
        repeating(2, "a"), [search_a.tool],
        middleware=[LoopBrakeMiddleware(brakes("sync-redis", redis_url))],
    )
    brake_b = AsyncDistributedBrake.from_url(redis_url)
    worker_b = create_agent(model_b, [search_b.tool], middleware=[LoopBrakeMiddleware(brake_b)])
    run = uuid.uuid4()  # one run (LangGraph's run_id) continued by a second worker
    try:
        await worker_a.ainvoke(INPUT, config("shared-async", run))
        await worker_b.ainvoke(INPUT, config("shared-async", run))
    finally:
        await brake_b.aclose()

    assert (len(search_a.runs), len(search_b.runs)) == (2, 0)
    assert_refused(model_b, "b_1")


# Worker B in its own process: nothing but Redis is shared with this one.
WORKER = """
import json, sys
from langchain.agents import create_agent
from distbrake import DistributedBrake
from distbrake.integrations.langchain import LoopBrakeMiddleware
from tests.test_integration_langchain import INPUT, Search, config, repeating

url, thread = sys.argv[1:]
search, scripted = Search(), repeating(1, "b")
with DistributedBrake.from_url(url) as brake:
    middleware = LoopBrakeMiddleware(brake, scope="conversation")
    agent = create_agent(scripted, [search.tool], middleware=[middleware])
    result = agent.invoke(INPUT, config(thread))
print(json.dumps({
    "runs": len(search.runs),
    "refusals": [str(m.content) for m in scripted.refusals()],
    "final": result["messages"][-1].content,
}))
"""


def test_a_worker_process_continues_the_thread_streak(
    redis_url: str, brakes: Callable[..., Any], search: Search
) -> None:
    worker_a = create_agent(
        repeating(2, "a"), [search.tool],
        middleware=[LoopBrakeMiddleware(brakes("sync-redis", redis_url), scope="conversation")],
    )
    worker_a.invoke(INPUT, config("shared-process"))

    done = subprocess.run(
        [sys.executable, "-c", WORKER, redis_url, "shared-process"],
        capture_output=True, text=True, timeout=60, check=False, cwd=ROOT,
    )

    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(search.runs) == 2
    assert report["runs"] == 0
    [refusal] = report["refusals"]
    assert "loop brake" in refusal
    assert PREFIX in refusal
    assert report["final"] == FINAL


# -- one turn, several identical calls at once --------------------------------------------


def parallel_turn() -> ScriptedModel:
    return model(calls("p1", "p2", "p3"))


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_parallel_identical_calls_invoke(
    kind: str, brakes: Callable[..., Any], search: Search
) -> None:
    scripted, agent = braked_agent(search, brakes(kind), parallel_turn())

    result = agent.invoke(INPUT, config("t-parallel"))

    assert len(search.runs) == 2
    refusals = scripted.refusals()
    assert len(refusals) == 1
    assert refusals[0].tool_call_id in {"p1", "p2", "p3"}
    assert "loop brake" in str(refusals[0].content)
    assert result["messages"][-1].content == FINAL


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_parallel_identical_calls_ainvoke(
    kind: str, brakes: Callable[..., Any], search: Search
) -> None:
    scripted, agent = braked_agent(search, brakes(kind), parallel_turn())

    result = await agent.ainvoke(INPUT, config("t-aparallel"))

    assert len(search.runs) == 2
    assert len(scripted.refusals()) == 1
    assert result["messages"][-1].content == FINAL


# -- plain LangGraph: ToolNode(wrap_tool_call=..., awrap_tool_call=...) ---------------------


def wrapped_graph(search: Search, brake: Any) -> tuple[ScriptedModel, Any]:
    """(the scripted model repeating search, the classic graph whose ToolNode has the brake's wrappers)."""
    scripted = repeating()
    wrap, awrap = tool_call_wrappers(brake)
    return scripted, graph(scripted, ToolNode([search.tool], wrap_tool_call=wrap, awrap_tool_call=awrap))


def graph(scripted: ScriptedModel, node: ToolNode) -> Any:
    """The classic agent graph: model -> tools_condition -> ToolNode -> model."""

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [scripted.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile()


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_tool_node_wrappers_invoke(kind: str, brakes: Callable[..., Any], search: Search) -> None:
    scripted, app = wrapped_graph(search, brakes(kind))

    result = app.invoke(INPUT, config("tn-sync"))

    assert search.runs == ["weather", "weather"]
    assert_refused(scripted)
    assert result["messages"][-1].content == FINAL


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_tool_node_wrappers_ainvoke(
    kind: str, brakes: Callable[..., Any], search: Search
) -> None:
    scripted, app = wrapped_graph(search, brakes(kind))

    result = await app.ainvoke(INPUT, config("tn-async"))

    assert search.runs == ["weather", "weather"]
    assert_refused(scripted)
    assert result["messages"][-1].content == FINAL


def test_tool_node_on_deny_raise_propagates(brakes: Callable[..., Any], search: Search) -> None:
    wrap, awrap = tool_call_wrappers(brakes("sync-memory"), on_deny="raise")
    app = graph(repeating(), ToolNode([search.tool], wrap_tool_call=wrap, awrap_tool_call=awrap))

    with pytest.raises(LoopBrakeError):
        app.invoke(INPUT, config("tn-raise"))

    assert len(search.runs) == 2


# -- a call passing two braked layers is counted once (the tool call id) -------------------

Wrap = Callable[[ToolCallRequest, Callable[[ToolCallRequest], Any]], Any]
AWrap = Callable[[ToolCallRequest, Callable[[ToolCallRequest], Awaitable[Any]]], Awaitable[Any]]


def stacked(outer: Wrap, inner: Wrap) -> Wrap:
    def wrap(request: ToolCallRequest, execute: Callable[[ToolCallRequest], Any]) -> Any:
        return outer(request, lambda r: inner(r, execute))

    return wrap


def astacked(outer: AWrap, inner: AWrap) -> AWrap:
    async def awrap(
        request: ToolCallRequest, execute: Callable[[ToolCallRequest], Awaitable[Any]]
    ) -> Any:
        return await outer(request, lambda r: inner(r, execute))

    return awrap


@pytest.mark.parametrize("layers", ["one-brake", "two-brakes-one-redis"])
def test_two_wrappers_count_a_call_once(
    layers: str, brakes: Callable[..., Any], redis_url: str, search: Search
) -> None:
    first = brakes("sync-redis", redis_url) if layers != "one-brake" else brakes("loop")
    second = brakes("sync-redis", redis_url) if layers != "one-brake" else first
    (outer, _), (inner, _) = tool_call_wrappers(first), tool_call_wrappers(second)
    scripted = repeating()
    app = graph(scripted, ToolNode([search.tool], wrap_tool_call=stacked(outer, inner)))

    run = uuid.uuid4()
    app.invoke(INPUT, config("tn-twice", run))

    assert search.runs == ["weather", "weather"]  # not halved: each call counted once
    assert_refused(scripted)
    state = first.inspect(f"tn-twice/run/{run}")
    assert state is not None
    assert state.count == 3


async def test_two_async_wrappers_count_a_call_once(
    redis_url: str, brakes: Callable[..., Any], search: Search
) -> None:
    (_, outer), (_, inner) = (
        tool_call_wrappers(brakes("sync-redis", redis_url)),
        tool_call_wrappers(brakes("sync-redis", redis_url)),
    )
    scripted = repeating()
    app = graph(scripted, ToolNode([search.tool], awrap_tool_call=astacked(outer, inner)))

    await app.ainvoke(INPUT, config("tn-atwice"))

    assert search.runs == ["weather", "weather"]
    assert_refused(scripted)


def test_two_middlewares_in_one_agent_count_a_call_once(
    brakes: Callable[..., Any], search: Search
) -> None:
    url = memory_url()
    scripted = repeating()
    agent = create_agent(
        scripted, [search.tool],
        middleware=[
            LoopBrakeMiddleware(brakes("sync-memory", url), name="fleet-brake"),
            LoopBrakeMiddleware(brakes("sync-memory", url), name="team-brake"),
        ],
    )

    agent.invoke(INPUT, config("t-two"))

    assert search.runs == ["weather", "weather"]
    assert_refused(scripted)


def two_layers(search: Search, brake: Any) -> tuple[ScriptedModel, Any]:
    """(a parallel turn of three identical calls, a create_agent graph with two middleware layers of `brake`)."""
    scripted = parallel_turn()
    middleware = [LoopBrakeMiddleware(brake, name="outer"), LoopBrakeMiddleware(brake)]
    return scripted, create_agent(scripted, [search.tool], middleware=middleware)


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_two_layers_of_one_brake_count_parallel_calls_once_invoke(
    kind: str, brakes: Callable[..., Any], search: Search
) -> None:
    scripted, agent = two_layers(search, brakes(kind))

    agent.invoke(INPUT, config("t-layers"))

    assert len(search.runs) == 2
    assert len(scripted.refusals()) == 1


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_two_layers_of_one_brake_count_parallel_calls_once_ainvoke(
    kind: str, brakes: Callable[..., Any], search: Search
) -> None:
    """Interleaved parallel calls: only the outer layer checks, so none is counted twice."""
    scripted, agent = two_layers(search, brakes(kind))

    await agent.ainvoke(INPUT, config("t-alayers"))

    assert len(search.runs) == 2
    assert len(scripted.refusals()) == 1


async def test_tool_node_stacked_wrappers_of_one_brake_parallel(
    brakes: Callable[..., Any], search: Search
) -> None:
    brake, scripted = brakes("sync-memory"), parallel_turn()
    (_, outer), (_, inner) = tool_call_wrappers(brake), tool_call_wrappers(brake)
    app = graph(scripted, ToolNode([search.tool], awrap_tool_call=astacked(outer, inner)))

    await app.ainvoke(INPUT, config("tn-alayers"))

    assert len(search.runs) == 2
    assert len(scripted.refusals()) == 1


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_tool_call_ids_repeated_every_turn_still_count(
    kind: str, brakes: Callable[..., Any], search: Search
) -> None:
    """Some providers number calls per turn (`search:0` each time): each turn still counts."""
    scripted = model(calls("search:0"), calls("search:0"), calls("search:0"))
    agent = create_agent(scripted, [search.tool], middleware=[LoopBrakeMiddleware(brakes(kind))])

    agent.invoke(INPUT, config("t-reused"))

    assert search.runs == ["weather", "weather"]
    assert_refused(scripted, "search:0")


async def test_tool_call_ids_repeated_every_turn_still_count_in_a_tool_node(
    brakes: Callable[..., Any], search: Search
) -> None:
    scripted = model(calls("call_0"), calls("call_0"), calls("call_0"))
    wrap, awrap = tool_call_wrappers(brakes("async-memory"))
    app = graph(scripted, ToolNode([search.tool], wrap_tool_call=wrap, awrap_tool_call=awrap))

    await app.ainvoke(INPUT, config("tn-reused"))

    assert search.runs == ["weather", "weather"]
    assert_refused(scripted, "call_0")


# -- warn before deny, progress-aware tools (issue 10) ----------------------------------


def tool_messages(prompt: list[BaseMessage]) -> list[ToolMessage]:
    return [m for m in prompt if isinstance(m, ToolMessage)]


def assert_warned_then_refused(scripted: ScriptedModel) -> None:
    """Prompt 2 (after call 1) has the bare result; prompt 3 (after call 2) the result and the warning."""
    [first] = tool_messages(scripted.prompts[1])
    assert first.content == "results for weather"
    second = tool_messages(scripted.prompts[2])[-1]
    assert second.tool_call_id == "call_2"
    assert second.status == "success"
    assert isinstance(second.content, str)
    result, warning = second.content.split("\n\n")
    assert result == "results for weather"  # the tool's own result, whole
    assert "called 2 times in a row" in warning
    assert "the next identical call will be denied" in warning
    assert PREFIX in warning
    assert_refused(scripted)


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_agent_invoke_warns_then_denies(kind: str, brakes: Callable[..., Any], search: Search) -> None:
    scripted, agent = braked_agent(search, brakes(kind, warn_at=2))

    agent.invoke(INPUT, config("t-warn"))

    assert search.runs == ["weather", "weather"]
    assert_warned_then_refused(scripted)


def test_a_list_content_gets_the_warning_as_its_own_block(brakes: Callable[..., Any]) -> None:
    @tool(response_format="content_and_artifact")
    def search(q: str) -> tuple[list[dict[str, str]], dict[str, int]]:
        """Search the web for q."""
        return [{"type": "text", "text": f"results for {q}"}], {"hits": 2}

    scripted = repeating()
    agent = create_agent(
        scripted, [search], middleware=[LoopBrakeMiddleware(brakes("loop", warn_at=2))]
    )
    agent.invoke(INPUT, config("t-blocks"))

    second = tool_messages(scripted.prompts[2])[-1]
    assert second.artifact == {"hits": 2}
    result, warning = second.content
    assert result == {"type": "text", "text": "results for weather"}
    assert isinstance(warning, dict)
    assert "called 2 times in a row" in warning["text"]


POLLER = {"get_job_status": {"progress": True}}


class Poller:
    """A progress-aware `get_job_status` returning (or raising) the next of its answers."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = iter(answers)
        self.runs = 0

        @tool
        def get_job_status(job: str) -> str:
            """The status of a job."""
            self.runs += 1
            return str(next_answer(self.answers))

        self.tool: BaseTool = get_job_status


def polling(n: int) -> ScriptedModel:
    return model(*(
        AIMessage(content="", tool_calls=[
            {"name": "get_job_status", "args": {"job": "j1"}, "id": f"poll_{i}", "type": "tool_call"}
        ])
        for i in range(1, n + 1)
    ))


@pytest.mark.parametrize("face", ["sync", "async"])
async def test_a_raised_error_is_observed_as_a_result(face: str, brakes: Callable[..., Any]) -> None:
    # Result, error, result, ...: each differs from the one before, so the streak restarts.
    poller, scripted = Poller(["running", ValueError("backend busy")] * 3), polling(6)
    wrap, awrap = tool_call_wrappers(brakes("sync-memory", tools=POLLER))
    node = ToolNode([poller.tool], wrap_tool_call=wrap, awrap_tool_call=awrap, handle_tool_errors=True)
    app = graph(scripted, node)

    if face == "sync":
        app.invoke(INPUT, config("tn-poll-raise"))
    else:
        await app.ainvoke(INPUT, config("tn-apoll-raise"))

    assert poller.runs == 6
    statuses = [m.status for m in tool_messages(scripted.prompts[-1])]
    assert statuses == ["success", "error"] * 3  # the tool's own errors, never a refusal
    assert all("loop brake" not in str(m.content) for m in tool_messages(scripted.prompts[-1]))


@pytest.mark.parametrize("face", ["sync", "async"])
async def test_tool_errors_are_failures_for_max_failures(face: str) -> None:
    """A tool error (the error `ToolMessage` a `ToolNode(handle_tool_errors=True)` makes of a raise) is a
    failed call: two in a row refuse the third call (`max_failures=2`), which never runs."""
    poller, scripted = Poller([ValueError("backend down")] * 2 + ["never"]), polling(3)
    wrap, awrap = tool_call_wrappers(LoopBrake(10, tools={"get_job_status": {"max_failures": 2}}))
    app = graph(scripted, ToolNode([poller.tool], wrap_tool_call=wrap, awrap_tool_call=awrap, handle_tool_errors=True))

    if face == "sync":
        app.invoke(INPUT, config("tn-failing"))
    else:
        await app.ainvoke(INPUT, config("tn-afailing"))

    assert poller.runs == 2
    messages = tool_messages(scripted.prompts[-1])
    assert [m.status for m in messages] == ["error"] * 3
    assert 'tool "get_job_status" failed 2 times in a row' in str(messages[2].content)


# -- the session scope: a run (the default) or the whole conversation ----------------------

DAYS = ("monday", "tuesday", "wednesday")


def week(middleware: LoopBrakeMiddleware) -> tuple[Search, list[str | None]]:
    """One thread, three user turns, each making one identical `search`: each turn's tool status."""
    search = Search()
    scripted = model(*(m for i in range(3) for m in (calls(f"d{i}"), AIMessage(content=f"a{i}"))))
    agent = create_agent(scripted, [search.tool], middleware=[middleware], checkpointer=InMemorySaver())
    statuses: list[str | None] = []
    for day in DAYS:
        result = agent.invoke({"messages": [{"role": "user", "content": day}]}, config("week"))
        statuses.append(next(m.status for m in reversed(result["messages"]) if isinstance(m, ToolMessage)))
    return search, statuses


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_one_search_per_user_turn_is_not_a_loop_by_default(
    kind: str, brakes: Callable[..., Any]
) -> None:
    search, statuses = week(LoopBrakeMiddleware(brakes(kind)))

    assert statuses == ["success", "success", "success"]
    assert search.runs == ["weather"] * 3


def test_a_run_resumed_after_an_interrupt_keeps_its_streak(brakes: Callable[..., Any]) -> None:
    """Each approval resumes the run in a new invocation: the user turn, and so the streak, is the same."""
    search, scripted = Search(), repeating()
    approval = HumanInTheLoopMiddleware(interrupt_on={"search": True})
    agent = create_agent(
        scripted, [search.tool], middleware=[approval, LoopBrakeMiddleware(brakes("sync-memory"))],
        checkpointer=InMemorySaver(),
    )
    result = agent.invoke(INPUT, config("t-approve"))
    resumes = 0
    while "__interrupt__" in result:
        result = agent.invoke(Command(resume={"decisions": [{"type": "approve"}]}), config("t-approve"))
        resumes += 1

    assert resumes == 3
    assert search.runs == ["weather", "weather"]
    assert_refused(scripted)
    assert result["messages"][-1].content == FINAL


def test_scope_conversation_counts_across_user_turns(brakes: Callable[..., Any]) -> None:
    search, statuses = week(LoopBrakeMiddleware(brakes("sync-memory"), scope="conversation"))

    assert statuses == ["success", "success", "error"]
    assert search.runs == ["weather"] * 2


def test_a_session_id_callable_is_given_the_request(brakes: Callable[..., Any]) -> None:
    brake = brakes("loop")
    seen: list[Any] = []

    def by_user(request: ToolCallRequest) -> str | None:
        seen.append(request)
        return None if request.tool_call["id"] == "call_1" else "user-42"

    scripted = repeating(4)
    agent = create_agent(scripted, [Search().tool], middleware=[LoopBrakeMiddleware(brake, session_id=by_user)])
    agent.invoke(INPUT, config("t-callable"))

    assert all(isinstance(r, ToolCallRequest) for r in seen) and len(seen) == 4
    sessions = {state.session_id: state.count for state in brake.sessions()}
    assert sessions.pop("user-42") == 3  # calls 2-4: the third is refused
    [(fallback, count)] = sessions.items()  # call 1: None, so the default rule (the run)
    assert fallback.startswith("t-callable/run/") and count == 1
    assert_refused(scripted, "call_4")


def test_scope_and_session_id_are_checked_at_build_time() -> None:
    for build in (LoopBrakeMiddleware, tool_call_wrappers):
        with pytest.raises(ConfigurationError, match="scope"):
            build(LoopBrake(), scope="thread")  # type: ignore[operator]
        with pytest.raises(TypeError, match="session_id"):
            build(LoopBrake(), session_id="t-1")  # type: ignore[operator]
