"""Claude Agent SDK integration: the SDK's real `query()` and `ClaudeSDKClient` with the brake's hooks.

The CLI is `tests.claude_cli.ScriptedCLI`, a public `Transport` that speaks the
SDK's control protocol: the SDK registers the hooks at `initialize` and
answers each `hook_callback` request with the brake's hooks, exactly as it
does for the real CLI. The hooks are async, so every adapter brake kind works.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, query

from distbrake import LoopBrake, call_hash, hash_prefix
from distbrake.integrations.claude_agent_sdk import loop_brake_hooks
from tests.adapters import Body, Run, Seen, assert_kept_in_process, refuses_bad_options
from tests.backends import ADAPTER_BRAKES, next_answer
from tests.claude_cli import ScriptedCLI, ToolUse
from tests.servers import free_port

PREFIX = hash_prefix(call_hash("search", {"q": "weather"}))
SEARCH: ToolUse = ("search", {"q": "weather"})


class Tools:
    """The bodies the scripted CLI runs, counting their real runs."""

    def __init__(self, answers: list[Any] | None = None) -> None:
        self.runs: list[str] = []
        self.answers = iter(answers or [])

    def search(self, q: str) -> str:
        self.runs.append(q)
        return f"results for {q}"

    def get_job_status(self, job: str) -> str:
        self.runs.append(job)
        return str(next_answer(self.answers))

    def cli(self, *script: list[ToolUse] | str) -> ScriptedCLI:
        return ScriptedCLI(list(script), {"search": self.search, "get_job_status": self.get_job_status})


class Driver:
    """The contract test's Claude Agent SDK: `query()` with the hooks, over a scripted CLI whose Claude Code
    session is the conversation."""

    async def run(self, brake: Any, body: Body, plan: Run, **options: Any) -> list[Seen]:
        cli = ScriptedCLI([[SEARCH] for _ in plan.ids], {"search": body}, session_id=plan.conversation)
        result = await run(cli, loop_brake_hooks(brake, **options))
        plan.asked = len(cli.model_inputs) + (0 if cli.stop_reasons else 1)  # a stop ends the turn unanswered
        plan.stopped = result.result if cli.stop_reasons else None
        return [
            Seen(bool(block["is_error"]), "\n".join([block["content"], *(c["text"] for c in contexts)]))
            for block, *contexts in cli.model_inputs
        ]


def repeating(tools: Tools, n: int = 3, use: ToolUse = SEARCH) -> ScriptedCLI:
    return tools.cli(*([use] for _ in range(n)))


async def run(cli: ScriptedCLI, hooks: Any, prompt: str = "weather?") -> ResultMessage:
    messages = [m async for m in query(prompt=prompt, options=ClaudeAgentOptions(hooks=hooks), transport=cli)]
    result = messages[-1]
    assert isinstance(result, ResultMessage)
    return result


def assert_refused(block: dict[str, Any], tool: str = "search") -> None:
    assert block["is_error"] is True
    assert block["content"].startswith(f'loop brake: tool "{tool}" called 3 times in a row')
    if tool == "search":
        assert PREFIX in block["content"]


# -- the whole loop ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ADAPTER_BRAKES)
async def test_on_deny_raise_stops_the_run_with_continue_false(kind: str, brakes: Any) -> None:
    tools = Tools()
    cli = tools.cli([SEARCH], [SEARCH], [SEARCH], [SEARCH], "never reached")

    result = await run(cli, loop_brake_hooks(brakes(kind), on_deny="raise"))

    assert tools.runs == ["weather", "weather"]
    assert_refused(cli.model_inputs[2][0])
    [stop] = cli.stop_reasons
    assert stop.startswith('loop brake: tool "search" called 3 times') and PREFIX in stop
    assert result.result == stop
    assert len(cli.model_inputs) == 3  # the run stopped at the refused call


async def test_the_hook_input_names_session_call_and_run() -> None:
    brake = LoopBrake()
    tools = Tools()
    cli = repeating(tools, 2)

    await run(cli, loop_brake_hooks(brake))

    pre = [h for h in cli.hook_inputs if h["hook_event_name"] == "PreToolUse"]
    assert len({h["tool_use_id"] for h in pre}) == 2
    state = brake.inspect(f"sess-1/run/{pre[0]['prompt_id']}")
    assert state is not None
    assert state.count == 2


async def test_a_matcher_limits_the_brake_to_some_tools() -> None:
    tools = Tools(["running"] * 4)
    cli = repeating(tools, 4, ("get_job_status", {"job": "j1"}))

    await run(cli, loop_brake_hooks(LoopBrake(), matcher="search"))

    assert len(tools.runs) == 4


async def test_one_tool_use_seen_by_two_hook_lists_of_one_brake_counts_once() -> None:
    brake = LoopBrake()
    first, second = loop_brake_hooks(brake), loop_brake_hooks(brake)
    hooks = {event: [*first[event], *second[event]] for event in first}
    tools = Tools()
    cli = repeating(tools)

    await run(cli, hooks)

    assert tools.runs == ["weather", "weather"]  # the tool use id: counted once, not halved
    assert_refused(cli.model_inputs[2][0])


@pytest.mark.parametrize("face", ["sync", "async"])
async def test_a_closed_policy_on_a_dead_backend_denies_rather_than_fails_open(face: str, brakes: Any) -> None:
    """A raising hook is no decision to the CLI, which runs the tool: the brake's error is a deny instead."""
    dead = f"redis://127.0.0.1:{free_port()}"
    brake = brakes(f"{face}-redis", dead, on_backend_error="closed", timeout_seconds=0.2)
    tools = Tools()
    cli = repeating(tools, 1)

    await run(cli, loop_brake_hooks(brake))

    assert tools.runs == []
    [refusal] = cli.model_inputs[0]
    assert refusal["is_error"] is True and "127.0.0.1" in refusal["content"]


# -- the session scope -----------------------------------------------------------------------


async def test_session_id_callable_gets_the_hook_input() -> None:
    seen: list[dict[str, Any]] = []

    def tenant(data: dict[str, Any]) -> str:
        seen.append(data)
        return f"tenant/{data['session_id']}"

    brake = LoopBrake()
    await run(repeating(Tools(), 2), loop_brake_hooks(brake, session_id=tenant))

    assert [d["hook_event_name"] for d in seen] == ["PreToolUse", "PreToolUse"]
    state = brake.inspect("tenant/sess-1")
    assert state is not None
    assert state.count == 2


def test_options_are_validated() -> None:
    refuses_bad_options(loop_brake_hooks)


# -- two workers sharing one real Redis ---------------------------------------------------


async def test_two_workers_on_different_prompts_do_not_share_a_streak(redis_url: str, brakes: Any) -> None:
    tools_a, tools_b = Tools(), Tools()

    await run(repeating(tools_a, 2), loop_brake_hooks(brakes("sync-redis", redis_url)))
    await run(repeating(tools_b, 2), loop_brake_hooks(brakes("sync-redis", redis_url)))

    assert (len(tools_a.runs), len(tools_b.runs)) == (2, 2)


# -- warn before deny, progress-aware tools, arguments kept in -------------------------------


POLLER = {"get_job_status": {"progress": True}}
POLL: ToolUse = ("get_job_status", {"job": "j1"})


async def test_a_failed_use_is_observed_as_a_result() -> None:
    # Result, failure, result, ...: each differs from the one before, so the streak restarts.
    tools = Tools(["running", RuntimeError("busy")] * 3)
    cli = repeating(tools, 6, POLL)

    await run(cli, loop_brake_hooks(LoopBrake(tools=POLLER)))

    assert len(tools.runs) == 6
    assert [cli.model_inputs[t][0]["content"] for t in (1, 3, 5)] == ["Error: busy"] * 3


SECRET = "sk-live-7f3a9c2e1b"


async def test_arguments_never_leave_the_process(
    redis_url: str, brakes: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    tools = Tools()
    cli = repeating(tools, 3, ("search", {"q": SECRET}))

    await run(cli, loop_brake_hooks(brakes("sync-redis", redis_url, warn_at=2), on_deny="raise"))

    shown = [repr(cli.model_inputs[1][1:]), repr(cli.model_inputs[2]), *cli.stop_reasons]
    assert_kept_in_process(SECRET, shown, caplog.records, redis_url=redis_url)
