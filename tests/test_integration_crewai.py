"""CrewAI integration: full crew kickoffs with the real executor on its native function-calling path.

The model is a `BaseLLM` subclass that supports function calling and is
scripted to call `search {"q": "weather"}` again and again; no network, no
keys; `cache=False` unless a test is about the cache. CrewAI's hooks are
synchronous: the sync brakes only. Runs in its own environment (`pip install
-e ".[crewai,test]"`: crewai pins an mcp the mcp extra cannot share); `.ci/run`
runs it there.
"""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OTEL_SDK_DISABLED", "true")
with warnings.catch_warnings():
    warnings.simplefilter("ignore", ImportWarning)  # crewai 1.15 warns about its own package layout on import
    import crewai  # noqa: F401

import asyncio
import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from crewai import Agent, Crew, Task
from crewai.hooks import InterceptionPoint, get_hooks, register_before_tool_call_hook
from crewai.hooks import unregister_before_tool_call_hook as unregister_before
from crewai.hooks.dispatch import scoped_hooks, unregister
from crewai.llms.base_llm import BaseLLM
from crewai.tools import tool

from distbrake import AsyncDistributedBrake, LoopBrake, LoopBrakeError, call_hash, hash_prefix
from distbrake.integrations.crewai import LoopBrakeAborted, install_hooks
from tests.adapters import Body, Run, Seen, assert_kept_in_process, refuses_bad_options
from tests.backends import SYNC_ADAPTER_BRAKES

# CrewAI 1.15 reads its own deprecated agent fields while running a crew (function_calling_llm,
# allow_code_execution, ...); its warnings come through crewai/__init__.py's wrapper of warnings.warn.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:crewai")

PREFIX = hash_prefix(call_hash("search", {"q": "weather"}))
FINAL = "final answer: it is sunny"
BLOCKED = "Tool execution blocked by hook"
Turn = Sequence[tuple[str, str, dict[str, Any]]]  # (call id, tool, arguments) of one model turn
POINTS = list(InterceptionPoint)


def calls(*ids: str, tool_name: str = "search", **arguments: Any) -> Turn:
    return [(i, tool_name, arguments or {"q": "weather"}) for i in ids]


class ScriptedLLM(BaseLLM):
    """Native function calling: plays `turns` (each request takes the next), then answers."""

    def __init__(self, *turns: Turn) -> None:
        super().__init__(model="scripted")
        self._turns = list(turns)
        self._requests: list[list[dict[str, Any]]] = []

    def supports_function_calling(self) -> bool:
        return True

    def get_input_tokens_count(self, messages: Any, tools: Any = None, response_model: Any = None) -> int:
        return 1  # no "approximate token count" warning on every call

    def call(self, messages: Any, tools: Any = None, callbacks: Any = None, available_functions: Any = None,
             from_task: Any = None, from_agent: Any = None, response_model: Any = None) -> Any:
        self._requests.append(json.loads(json.dumps(messages, default=str)))
        if self._turns:
            return [
                {"id": i, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
                for i, name, arguments in self._turns.pop(0)
            ]
        return FINAL

    @property
    def requests(self) -> list[list[dict[str, Any]]]:
        return self._requests

    def add(self, turn: Turn) -> None:
        self._turns.append(turn)

    def results(self, request: int = -1) -> list[tuple[str, str]]:
        """(call id, content) of the tool messages in one request (the last by default)."""
        return [(m["tool_call_id"], m["content"]) for m in self._requests[request] if m.get("role") == "tool"]

    def refusals(self) -> list[str]:
        return [i for i, text in self.results() if text.startswith("loop brake")]


def repeating(n: int = 3, prefix: str = "call") -> ScriptedLLM:
    return ScriptedLLM(*(calls(f"{prefix}_{i}") for i in range(1, n + 1)))


class Worker:
    """A one-agent, one-task crew with a `search` tool counting its real runs."""

    def __init__(self, llm: ScriptedLLM, cache: bool = False) -> None:
        self.llm = llm
        self.runs: list[str] = []
        self.body: Body | None = None  # the contract test's tool body, else "results for <q>"

        @tool("search")
        def search(q: str) -> str:
            """Search the web for q."""
            self.runs.append(q)
            return f"results for {q}" if self.body is None else self.body(q)

        agent = Agent(role="researcher", goal="answer", backstory="careful", llm=llm, tools=[search],
                      cache=cache, verbose=False)
        self.crew = Crew(agents=[agent], tasks=[Task(description="weather?", expected_output="an answer",
                                                     agent=agent)], cache=cache)

    def kickoff(self) -> str:
        return str(self.crew.kickoff().raw)


class Driver:
    """The contract test's CrewAI: one crew per conversation (CrewAI's conversation is the crew), kicked off
    once per run (in a worker thread: kickoff is sync) with the brake's hooks installed around it."""

    def __init__(self) -> None:
        self.crews: dict[str, Worker] = {}

    async def run(self, brake: Any, body: Body, plan: Run, **options: Any) -> list[Seen]:
        worker = self.crews.setdefault(plan.conversation, Worker(ScriptedLLM()))
        worker.body = body
        for i in plan.ids:
            worker.llm.add(calls(i))

        def kickoff() -> None:
            with install_hooks(brake, **options):
                worker.kickoff()

        asked = len(worker.llm.requests)  # one crew per conversation: its model's earlier runs
        try:
            await asyncio.to_thread(kickoff)
        finally:
            plan.asked = len(worker.llm.requests) - asked
        return [Seen(text.startswith("loop brake"), text) for i, text in worker.llm.results() if i in plan.ids]


@pytest.fixture(autouse=True)
def hooks_restored() -> Iterator[None]:
    """Every test leaves CrewAI's global hooks exactly as it found them."""
    before = {point: get_hooks(point) for point in POINTS}
    yield
    assert {point: get_hooks(point) for point in POINTS} == before


def assert_refused(llm: ScriptedLLM, call_id: str = "call_3") -> str:
    assert llm.refusals() == [call_id], llm.results()
    [text] = [t for i, t in llm.results() if i == call_id]
    assert text.startswith('loop brake: tool "search" called 3 times in a row')
    assert PREFIX in text
    return text


# -- the whole loop ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_on_deny_raise_ends_the_kickoff(kind: str, brakes: Any) -> None:
    worker = Worker(repeating())
    with install_hooks(brakes(kind), on_deny="raise"), pytest.raises(LoopBrakeError) as caught:
        worker.kickoff()

    assert worker.runs == ["weather", "weather"]
    assert len(worker.llm.requests) == 3  # the model was not called again
    error = caught.value
    assert isinstance(error, LoopBrakeAborted)
    assert (error.tool_name, error.count, error.max_repeats, error.hash_prefix) == ("search", 3, 3, PREFIX)
    assert error.session_id.startswith(f"{worker.crew.id}/run/")


@pytest.mark.parametrize("kind", SYNC_ADAPTER_BRAKES)
def test_parallel_identical_calls_in_one_turn(kind: str, brakes: Any) -> None:
    worker = Worker(ScriptedLLM(calls("p1", "p2", "p3")))
    with install_hooks(brakes(kind)):
        assert worker.kickoff() == FINAL

    assert len(worker.runs) == 2
    assert len(worker.llm.refusals()) == 1
    assert not any(text.startswith(BLOCKED) for _, text in worker.llm.results())


def test_the_trap_any_other_exception_in_a_hook_is_swallowed_and_the_tool_runs() -> None:
    """Why the hook raises HookAborted: a plain LoopBrakeError in a before hook fails open."""
    brake = LoopBrake()

    def naive(context: Any) -> None:
        brake.check(context.tool_name, dict(context.tool_input), session_id="naive")

    worker = Worker(repeating())
    register_before_tool_call_hook(naive)
    try:
        assert worker.kickoff() == FINAL
    finally:
        unregister_before(naive)
    assert worker.runs == ["weather"] * 3  # denied by the brake, run anyway by CrewAI
    state = brake.inspect("naive")
    assert state is not None
    assert state.count == 3


def test_without_the_after_hook_the_model_would_read_only_blocked_by_hook(brakes: Any) -> None:
    worker = Worker(repeating())
    others = get_hooks(InterceptionPoint.POST_TOOL_CALL)
    hooks = install_hooks(brakes("loop"))
    try:
        [after_hook] = [h for h in get_hooks(InterceptionPoint.POST_TOOL_CALL) if h not in others]
        unregister(InterceptionPoint.POST_TOOL_CALL, after_hook)
        worker.kickoff()
    finally:
        hooks.dispose()
    [(_, text)] = [r for r in worker.llm.results() if r[0] == "call_3"]
    assert text.startswith(BLOCKED)
    assert worker.runs == ["weather", "weather"]


def test_a_backend_error_under_the_closed_policy_blocks_the_call(brakes: Any) -> None:
    brake = brakes("sync-redis", "redis://127.0.0.1:1/0", on_backend_error="closed", timeout_seconds=0.5)
    worker = Worker(repeating(1))
    with install_hooks(brake):
        worker.kickoff()
    assert worker.runs == []  # failed closed, not open
    [(_, text)] = worker.llm.results()
    assert text.startswith(BLOCKED)


def test_an_async_brake_is_refused_up_front() -> None:
    brake = AsyncDistributedBrake.from_url("memory://crewai-async")
    with pytest.raises(TypeError, match="synchronous"):
        install_hooks(brake)


def test_dispose_restores_the_hooks_exactly(brakes: Any) -> None:
    def mine(context: Any) -> None:
        return None

    register_before_tool_call_hook(mine)
    try:
        before = {point: get_hooks(point) for point in POINTS}
        hooks = install_hooks(brakes("loop"))
        assert len(get_hooks(InterceptionPoint.PRE_TOOL_CALL)) == len(before[InterceptionPoint.PRE_TOOL_CALL]) + 1
        hooks.dispose()
        hooks.dispose()  # idempotent
        assert {point: get_hooks(point) for point in POINTS} == before
    finally:
        unregister_before(mine)

    worker = Worker(repeating())
    worker.kickoff()
    assert worker.runs == ["weather"] * 3  # disposed: nothing braked


def test_scoped_hooks_brake_only_inside_their_block(brakes: Any) -> None:
    inside, outside = Worker(repeating()), Worker(repeating())
    with scoped_hooks():
        install_hooks(brakes("loop"), scoped=True)
        inside.kickoff()
    outside.kickoff()

    assert inside.runs == ["weather", "weather"]
    assert_refused(inside.llm)
    assert outside.runs == ["weather"] * 3
    with pytest.raises(RuntimeError):
        install_hooks(LoopBrake(), scoped=True)  # CrewAI: no scoped_hooks() block


def test_a_cached_repeat_still_counts_and_a_denied_call_never_reaches_the_cache(brakes: Any) -> None:
    worker = Worker(repeating(), cache=True)
    with install_hooks(brakes("loop")):
        worker.kickoff()

    assert worker.runs == ["weather"]  # the second came from CrewAI's cache
    assert_refused(worker.llm)  # and still counted: the third is denied


# -- session scope ------------------------------------------------------------------------------


def test_session_id_callable_gets_the_hook_context(brakes: Any) -> None:
    seen: list[Any] = []

    def name(context: Any) -> str:
        seen.append((context.tool_name, context.crew, context.agent))
        return "tenant-7"

    brake = brakes("loop")
    worker = Worker(repeating(2))
    with install_hooks(brake, session_id=name):
        worker.kickoff()

    assert [(t, c) for t, c, _ in seen] == [("search", worker.crew)] * 2
    state = brake.inspect("tenant-7")
    assert state is not None
    assert state.count == 2


def test_options_are_validated() -> None:
    refuses_bad_options(install_hooks, session_id=False)


# -- warn before deny, progress-aware tools, arguments ------------------------------------------------


SECRET = "sk-live-SECRET-crewai-7f3a"


@pytest.mark.parametrize("on_deny", ["message", "raise"])
def test_arguments_never_appear_in_what_the_brake_logs_or_returns(
    on_deny: str, brakes: Any, caplog: pytest.LogCaptureFixture
) -> None:
    brake = brakes("sync-memory")
    worker = Worker(ScriptedLLM(*(calls(f"s{i}", q=SECRET) for i in (1, 2, 3))))
    caplog.set_level(logging.DEBUG)

    shown: list[str] = []
    with install_hooks(brake, on_deny=on_deny):  # type: ignore[arg-type]
        try:
            worker.kickoff()
            [(_, refusal)] = [r for r in worker.llm.results() if r[0] == "s3"]
            shown.append(refusal)
        except LoopBrakeError as error:
            shown += [str(error), repr(error)]

    assert "loop brake" in shown[0]
    assert worker.runs == [SECRET, SECRET]
    assert_kept_in_process(SECRET, shown, caplog.records, brake)


class ReActLLM(BaseLLM):
    """No native function calling: CrewAI's ReAct text path, `search` `calls` times, then an answer."""

    def __init__(self, calls: int) -> None:
        super().__init__(model="scripted-react")
        self._calls = calls
        self._requests: list[list[dict[str, Any]]] = []

    def supports_function_calling(self) -> bool:
        return False

    def get_input_tokens_count(self, messages: Any, tools: Any = None, response_model: Any = None) -> int:
        return 1

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> Any:
        self._requests.append(json.loads(json.dumps(messages, default=str)))
        if len(self._requests) <= self._calls:
            return 'Thought: search\nAction: search\nAction Input: {"q": "weather"}'
        return f"Thought: done\nFinal Answer: {FINAL}"

    def observations(self) -> list[str]:
        return [m["content"].partition("\nObservation: ")[2] for m in self._requests[-1]
                if m.get("role") == "assistant" and "\nObservation: " in m["content"]]


def test_on_the_react_path_crewais_reuse_guard_answers_the_second_call_and_the_brake_the_third(
    brakes: Any,
) -> None:
    """The before hook runs first: the guard's answer to an immediate repeat is still counted."""
    llm = ReActLLM(3)
    worker = Worker(ScriptedLLM())
    worker.crew.agents[0].llm = llm
    with install_hooks(brakes("loop")):
        assert worker.kickoff() == FINAL

    first, second, third = llm.observations()
    assert worker.runs == ["weather"]  # the second call never reached the tool
    assert first == "results for weather"
    assert second.startswith("I tried reusing the same input")  # CrewAI's own guard
    assert third.startswith('loop brake: tool "search" called 3 times in a row')
