"""Google ADK integration: full runs with ADK's real `Runner` and `App(plugins=[...])`.

The model is a `BaseLlm` subclass that plays a script of function calls and
records every request ADK sends it; no network, no keys. ADK runs are async,
so every adapter brake kind works (a `DistributedBrake` in a worker thread).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.apps import App
from google.adk.events import Event
from google.adk.models import BaseLlm, LlmRequest, LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types
from pydantic import Field

from distbrake import BrakeUnavailableError, LoopBrake, LoopBrakeError, call_hash, hash_prefix
from distbrake.integrations.google_adk import WARNING_KEY, LoopBrakePlugin
from tests.adapters import Body, Run, Seen, assert_kept_in_process, refuses_bad_options
from tests.backends import ADAPTER_BRAKES, next_answer
from tests.servers import free_port

PREFIX = hash_prefix(call_hash("search", {"q": "weather"}))
FINAL = "It is sunny."
USER = "user-1"


def call(name: str = "search", call_id: str | None = None, **args: Any) -> types.Part:
    return types.Part(function_call=types.FunctionCall(name=name, args=args or {"q": "weather"}, id=call_id))


class ScriptedModel(BaseLlm):
    """Plays `script` (one entry per model turn: function-call parts, or text), then answers FINAL."""

    model: str = "scripted"
    script: list[list[types.Part] | str] = Field(default_factory=list)
    requests: list[LlmRequest] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        turn = len(self.requests)
        self.requests.append(llm_request)
        step = self.script[turn] if turn < len(self.script) else FINAL
        parts = [types.Part(text=step)] if isinstance(step, str) else step
        yield LlmResponse(content=types.Content(role="model", parts=parts))

    def responses(self, turn: int) -> list[dict[str, Any]]:
        """The function responses ADK sent in request `turn` (its last content)."""
        last = self.requests[turn].contents[-1]
        return [dict(p.function_response.response or {}) for p in last.parts or [] if p.function_response]


def repeating(n: int = 3, **args: Any) -> ScriptedModel:
    return ScriptedModel(script=[[call(**args)] for _ in range(n)])


class Worker:
    """One ADK app (agent + plugin) with a `search` tool counting its real runs, on its own session service."""

    def __init__(self, model: ScriptedModel, *plugins: LoopBrakePlugin, answers: list[Any] | None = None) -> None:
        self.model = model
        self.runs: list[str] = []
        self.answers = iter(answers or [])

        def search(q: str) -> dict[str, str]:
            """Search the web for q."""
            self.runs.append(q)
            return {"result": f"results for {q}"}

        def get_job_status(job: str) -> str:
            """The status of a job."""
            self.runs.append(job)
            return str(next_answer(self.answers))

        agent = LlmAgent(name="researcher", model=model, tools=[search, get_job_status])
        self.sessions = InMemorySessionService()
        app = App(name="app", root_agent=agent, plugins=list(plugins))
        self.runner = Runner(app=app, session_service=self.sessions)

    async def run(self, text: str = "weather?", session: str = "ticket-4711") -> list[Event]:
        if await self.sessions.get_session(app_name="app", user_id=USER, session_id=session) is None:
            await self.sessions.create_session(app_name="app", user_id=USER, session_id=session)
        message = types.Content(role="user", parts=[types.Part(text=text)])
        return [event async for event in self.runner.run_async(user_id=USER, session_id=session, new_message=message)]


class Driver:
    """The contract test's ADK: an `App` with the plugin, run by a `Runner` in the ADK session of the conversation."""

    async def run(self, brake: Any, body: Body, plan: Run, **options: Any) -> list[Seen]:
        def search(q: str) -> str:
            """Search the web for q."""
            return body(q)

        model = ScriptedModel(script=[[call(call_id=i)] for i in plan.ids])
        agent = LlmAgent(name="researcher", model=model, tools=[search])
        sessions = InMemorySessionService()
        app = App(name="app", root_agent=agent, plugins=[LoopBrakePlugin(brake, **options)])
        await sessions.create_session(app_name="app", user_id=USER, session_id=plan.conversation)
        message = types.Content(role="user", parts=[types.Part(text="weather?")])
        runner = Runner(app=app, session_service=sessions)
        try:
            [_ async for _ in runner.run_async(user_id=USER, session_id=plan.conversation, new_message=message)]
        finally:
            plan.asked = len(model.requests)
        return [
            Seen("error" in response, json.dumps(response))
            for turn in range(1, len(plan.ids) + 1) for response in model.responses(turn)
        ]


def final_text(events: list[Event]) -> str | None:
    last = events[-1].content
    return None if last is None or not last.parts else last.parts[0].text


def assert_refused(response: dict[str, Any]) -> None:
    assert list(response) == ["error"]
    assert "loop brake" in response["error"]
    assert PREFIX in response["error"]


# -- the whole loop ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_on_deny_raise_ends_the_run_with_adks_runtime_error(kind: str, brakes: Any) -> None:
    worker = Worker(repeating(), LoopBrakePlugin(brakes(kind), on_deny="raise"))

    with pytest.raises(RuntimeError, match="Error in plugin 'loop_brake'") as caught:
        await worker.run(session="conv-raise")

    error = caught.value.__cause__
    assert isinstance(error, LoopBrakeError)
    assert (error.tool_name, error.count, error.max_repeats, error.hash_prefix) == ("search", 3, 3, PREFIX)
    assert error.session_id.startswith("conv-raise/run/e-")
    assert worker.runs == ["weather", "weather"]
    assert len(worker.model.requests) == 3  # the run ended before the model saw a third result


async def test_a_different_call_breaks_the_streak() -> None:
    model = ScriptedModel(script=[[call()], [call()], [call(q="news")], [call()], [call()], [call()]])
    worker = Worker(model, LoopBrakePlugin(LoopBrake()))

    assert final_text(await worker.run()) == FINAL

    assert worker.runs == ["weather", "weather", "news", "weather", "weather"]
    assert_refused(model.responses(6)[0])


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_parallel_identical_calls_in_one_turn(kind: str, brakes: Any) -> None:
    worker = Worker(ScriptedModel(script=[[call(), call(), call()]]), LoopBrakePlugin(brakes(kind)))

    await worker.run()

    assert len(worker.runs) == 2
    responses = worker.model.responses(1)
    assert len(responses) == 3
    assert sum("error" in r for r in responses) == 1


async def test_a_call_checked_by_two_plugins_of_one_brake_is_counted_once() -> None:
    brake = LoopBrake()
    worker = Worker(repeating(), LoopBrakePlugin(brake, name="first"), LoopBrakePlugin(brake, name="second"))

    await worker.run()

    assert worker.runs == ["weather", "weather"]  # not halved: the same call id counts once
    assert_refused(worker.model.responses(3)[0])


async def test_a_closed_policy_on_a_dead_backend_ends_the_run_before_the_tool(brakes: Any) -> None:
    brake = brakes("async-redis", f"redis://127.0.0.1:{free_port()}", on_backend_error="closed", timeout_seconds=0.2)
    worker = Worker(repeating(1), LoopBrakePlugin(brake))

    with pytest.raises(RuntimeError) as caught:
        await worker.run()

    assert isinstance(caught.value.__cause__, BrakeUnavailableError)
    assert worker.runs == []


# -- the session scope -----------------------------------------------------------------------


async def test_session_id_callable_gets_the_tool_context() -> None:
    seen: list[Any] = []

    def tenant(tool_context: Any) -> str:
        seen.append(tool_context)
        return f"tenant/{tool_context.session.id}"

    brake = LoopBrake()
    worker = Worker(repeating(2), LoopBrakePlugin(brake, session_id=tenant))
    await worker.run(session="s-1")

    assert [c.function_call_id.startswith("adk-") for c in seen] == [True, True]
    state = brake.inspect("tenant/s-1")
    assert state is not None
    assert state.count == 2


def test_options_are_validated() -> None:
    refuses_bad_options(LoopBrakePlugin)


# -- two workers sharing one real Redis ---------------------------------------------------


async def test_two_workers_on_different_runs_do_not_share_a_streak(redis_url: str, brakes: Any) -> None:
    worker_a = Worker(repeating(2), LoopBrakePlugin(brakes("sync-redis", redis_url)))
    worker_b = Worker(repeating(2), LoopBrakePlugin(brakes("sync-redis", redis_url)))

    await worker_a.run(session="shared")
    await worker_b.run(session="shared")

    assert (len(worker_a.runs), len(worker_b.runs)) == (2, 2)


# -- warn before deny, progress-aware tools, arguments kept in -------------------------------


async def test_a_non_dict_result_is_kept_whole_beside_the_warning() -> None:
    model = ScriptedModel(script=[[call("get_job_status", job="j1")] for _ in range(2)])
    worker = Worker(model, LoopBrakePlugin(LoopBrake(warn_at=2)), answers=["running", "running"])

    await worker.run()

    [warned] = model.responses(2)
    assert warned["result"] == "running"
    assert "the next identical call will be denied" in warned[WARNING_KEY]


POLLER = {"get_job_status": {"progress": True}}


def polls(n: int) -> ScriptedModel:
    return ScriptedModel(script=[[call("get_job_status", job="j1")] for _ in range(n)])


async def test_a_raised_error_is_observed_as_a_result() -> None:
    """ADK ends a run whose tool raises; the raise was observed, so the next run's poll starts a new streak."""
    plugin = LoopBrakePlugin(LoopBrake(tools=POLLER), scope="conversation")
    worker = Worker(polls(3), plugin, answers=["running", ValueError("busy"), "running"])

    with pytest.raises(ValueError, match="busy"):
        await worker.run(session="conv-poll")
    await worker.run(session="conv-poll")

    assert len(worker.runs) == 3  # unobserved, the third identical poll would have been denied
    assert worker.model.responses(3) == [{"result": "running"}]  # the second run's poll


SECRET = "sk-live-7f3a9c2e1b"


async def test_arguments_never_leave_the_process(
    redis_url: str, brakes: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    worker = Worker(repeating(q=SECRET), LoopBrakePlugin(brakes("sync-redis", redis_url, warn_at=2)))
    raising = Worker(repeating(q=SECRET), LoopBrakePlugin(brakes("sync-redis", redis_url), on_deny="raise"))

    await worker.run(session="conv-secret")
    with pytest.raises(RuntimeError) as caught:
        await raising.run(session="conv-secret")

    refusal, warned = worker.model.responses(3)[0], worker.model.responses(2)[0]
    shown = [refusal["error"], warned[WARNING_KEY], str(caught.value), repr(caught.value.__cause__)]
    assert_kept_in_process(SECRET, shown, caplog.records, redis_url=redis_url)
