"""The adapter contract: the same scenarios over all 11 framework adapters, each run by the real framework.

Each adapter's test module gives a `Driver` (its framework's set-up: a scripted model, the tool, the runner;
see `tests.adapters.Driver`); the scenarios here are written once:

* the tool body runs twice, then the third identical call is refused the framework's way, and the model
  reads the brake's text;
* two workers (two brakes on one real Redis) share a conversation's streak;
* `warn_at` reaches the model with the tool's result;
* a progress-aware tool whose result changes is never refused (and one whose result repeats is);
* scopes: one call per run is never a loop under `scope="run"` (the default); under
  `scope="conversation"` the third run's call is refused;
* a model that ignores every refusal is halted (`max_repeats=3, halt_at=5`): the run ends the framework's
  way (an MCP server answers every later call of the session with the halt), and a second worker refuses
  that session's next call of any tool;
* the adapter's module names its extra when the framework is missing, and `import distbrake` leaves the
  framework alone.

The adapters of `SEPARATE_ENVIRONMENTS` (crewai, strands) are collected only where their framework is
installed: `.ci/run` runs their cases in their own environments (`-k <adapter>`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from distbrake import LoopBrakeError, LoopBrakeHalt, call_hash, hash_prefix
from tests.adapters import (
    ADAPTERS,
    Body,
    Driver,
    Run,
    Seen,
    collected,
    driver_of,
    import_leaves_the_framework_alone,
    names_its_extra_when_missing,
)
from tests.backends import ADAPTER_BRAKES, SYNC_ADAPTER_BRAKES, Checker, inspect_count

PREFIX = hash_prefix(call_hash("search", {"q": "weather"}))
ADAPTER_TIMEOUT = 5.0  # the adapters are tested here, not timing: a busy machine must not reach the policy


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every scenario over every adapter collected here; a scenario taking `kind` over each brake kind the
    adapter takes (`ADAPTER_BRAKES`, the sync ones for a sync-only adapter)."""
    names = [name for name in ADAPTERS if collected(name)]
    if "kind" in metafunc.fixturenames:
        metafunc.parametrize(("adapter", "kind"), [
            pytest.param(name, kind.values[0], marks=[*ADAPTERS[name].marks, *kind.marks], id=f"{name}-{kind.id}")
            for name in names
            for kind in (SYNC_ADAPTER_BRAKES if ADAPTERS[name].sync_only else ADAPTER_BRAKES)
        ])
    elif "adapter" in metafunc.fixturenames:
        metafunc.parametrize("adapter", [pytest.param(name, marks=ADAPTERS[name].marks, id=name) for name in names])


@pytest.fixture
def driver(adapter: str) -> Driver:
    return driver_of(adapter)


@pytest.fixture
def brake(adapter: str, brakes: Any, request: pytest.FixtureRequest) -> Callable[..., Any]:
    """`brake(**options)`: a brake of the test's `kind` (by default the async face, or the sync one for a
    sync-only adapter, on the test's embedded backend)."""
    kind = request.getfixturevalue("kind") if "kind" in request.fixturenames else (
        "sync-memory" if ADAPTERS[adapter].sync_only else "async-memory"
    )
    timeout = {} if kind == "loop" else {"timeout_seconds": ADAPTER_TIMEOUT}
    return lambda **options: brakes(kind, **timeout, **options)


def assert_refusal(seen: Seen, count: int = 3) -> None:
    assert seen.refused, seen
    assert "loop brake" in seen.text and PREFIX in seen.text, seen
    assert f"called {count} times in a row" in seen.text, seen


async def test_the_third_identical_call_is_refused_the_frameworks_way(
    driver: Driver, brake: Callable[..., Any], kind: str
) -> None:
    body = Body()

    seen = await driver.run(brake(), body, Run(3, "c-deny"))

    assert body.runs == ["weather", "weather"]
    assert [s.refused for s in seen] == [False, False, True]
    assert all("results for weather" in s.text and "loop brake" not in s.text for s in seen[:2])
    assert_refusal(seen[2])


async def test_two_workers_share_a_conversation_streak_through_redis(
    adapter: str, driver: Driver, brakes: Any, redis_url: str
) -> None:
    faces = ("sync", "sync") if ADAPTERS[adapter].sync_only else ("sync", "async")
    worker_a, worker_b = (
        brakes(f"{face}-redis", redis_url, timeout_seconds=ADAPTER_TIMEOUT) for face in faces
    )
    body_a, body_b = Body(), Body()

    seen_a = await driver.run(worker_a, body_a, Run(2, "c-shared"), scope="conversation")
    seen_b = await driver.run(worker_b, body_b, Run(1, "c-shared"), scope="conversation")

    assert (body_a.runs, body_b.runs) == (["weather", "weather"], [])
    assert [s.refused for s in seen_a] == [False, False]
    [refused] = seen_b
    assert_refusal(refused)


async def test_different_conversations_do_not_share_a_streak(driver: Driver, brake: Callable[..., Any]) -> None:
    shared = brake()
    body = Body()

    await driver.run(shared, body, Run(2, "c-one"), scope="conversation")
    seen = await driver.run(shared, body, Run(1, "c-two"), scope="conversation")

    assert body.runs == ["weather"] * 3
    assert [s.refused for s in seen] == [False]


async def test_warn_at_reaches_the_model_with_the_result(
    driver: Driver, brake: Callable[..., Any], kind: str
) -> None:
    body = Body()

    seen = await driver.run(brake(warn_at=2), body, Run(3, "c-warn"))

    assert body.runs == ["weather", "weather"]
    first, second, third = seen
    assert not first.refused and "called" not in first.text
    assert not second.refused
    assert "results for weather" in second.text  # the tool's own result, whole
    assert "called 2 times in a row" in second.text and PREFIX in second.text
    assert "the next identical call will be denied" in second.text
    assert_refusal(third)


async def test_shadow_mode_shows_no_warning_and_refuses_nothing(driver: Driver, brake: Callable[..., Any]) -> None:
    body = Body()

    seen = await driver.run(brake(warn_at=2, enforce=False), body, Run(3, "c-shadow"))

    assert body.runs == ["weather"] * 3
    assert [s.refused for s in seen] == [False] * 3
    assert all("called" not in s.text for s in seen)


PROGRESS = {"search": {"progress": True}}


async def test_a_progress_aware_tool_whose_result_changes_is_never_refused(
    driver: Driver, brake: Callable[..., Any], kind: str
) -> None:
    body = Body(f"{percent}% done" for percent in (0, 20, 40, 60, 80))

    seen = await driver.run(brake(tools=PROGRESS), body, Run(5, "c-progress"))

    assert len(body.runs) == 5
    assert [s.refused for s in seen] == [False] * 5


async def test_a_progress_aware_tool_whose_result_repeats_is_refused_at_the_third_call(
    driver: Driver, brake: Callable[..., Any], kind: str
) -> None:
    body = Body(["running"] * 3)

    seen = await driver.run(brake(tools=PROGRESS), body, Run(3, "c-stuck"))

    assert len(body.runs) == 2
    assert [s.refused for s in seen] == [False, False, True]


@pytest.mark.parametrize(("scope", "refused"), [("run", [False] * 3), ("conversation", [False, False, True])])
async def test_one_call_per_run_is_a_loop_only_across_the_conversation(
    driver: Driver, brake: Callable[..., Any], kind: str, scope: str, refused: list[bool]
) -> None:
    shared, body = brake(), Body()
    options: dict[str, Any] = {} if scope == "run" else {"scope": scope}  # "run": the default

    seen = [s for _ in range(3) for s in await driver.run(shared, body, Run(1, "c-turns"), **options)]

    # (seen once in CI, not reproduced since: [False] * 3 under "conversation"; the record says which check strayed)
    assert [s.refused for s in seen] == refused, (seen, body.runs, await Checker(shared).inspect("c-turns"))
    assert len(body.runs) == refused.count(False)


def test_a_missing_framework_names_the_extra_to_install(adapter: str, monkeypatch: pytest.MonkeyPatch) -> None:
    driver_of(adapter)  # the adapter's module, imported
    names_its_extra_when_missing(monkeypatch, adapter, ADAPTERS[adapter].framework, ADAPTERS[adapter].extra)


def test_import_distbrake_does_not_import_the_framework(adapter: str) -> None:
    import_leaves_the_framework_alone(ADAPTERS[adapter].framework)


async def test_a_session_id_callable_names_the_session_and_none_falls_back_to_the_scope(
    driver: Driver, brake: Callable[..., Any]
) -> None:
    shared, body = brake(), Body()
    scoped: dict[str, Any] = {"scope": "conversation"}

    await driver.run(shared, body, Run(2, "c-named"), session_id=lambda _: "tenant-7")
    await driver.run(shared, body, Run(2, "c-one"), session_id=lambda _: None, **scoped)
    other = await driver.run(shared, body, Run(1, "c-two"), session_id=lambda _: None, **scoped)
    again = await driver.run(shared, body, Run(1, "c-one"), session_id=lambda _: "", **scoped)

    assert await inspect_count(shared, "tenant-7") == 2
    assert [s.refused for s in other] == [False]  # None: the scope's session, another conversation's
    assert [s.refused for s in again] == [True]  # "": the scope's session, the first conversation's third call
    assert len(body.runs) == 5


# -- the halt: a model that ignores every refusal -------------------------------------------------------

HALT = {"max_repeats": 3, "halt_at": 5}
FOREVER = 12  # the scripted model asks for the same call this many times: it never gives up by itself


def raised_halt(raised: BaseException) -> tuple[str, str]:
    """`(text, session)` of the halt a run that raised carries: the `LoopBrakeHalt` in its exception chain
    (causes, contexts, exception groups), or the OpenAI Agents tripwire's denial (`output_info`)."""
    seen: list[BaseException] = [raised]
    while seen:
        error = seen.pop()
        if isinstance(error, LoopBrakeHalt):
            return str(error), error.session_id
        assert not isinstance(error, LoopBrakeError), f"a refusal other than the halt ended the run: {error!r}"
        info = getattr(getattr(error, "output", None), "output_info", None)
        if isinstance(info, dict) and info.get("kind") == "halt":
            return str(info["message"]), str(info["session_id"])
        seen += [e for e in (error.__cause__, error.__context__) if e is not None]
        seen += list(getattr(error, "exceptions", ()))
    raise AssertionError(f"no halt in {raised!r}")


def halted_session(text: str) -> str:
    """The session a halt text names."""
    found = re.search(r'session "(.+?)" is halted', text)
    assert found, text
    return found.group(1)


async def test_a_model_that_ignores_refusals_is_halted_and_a_second_worker_refuses_the_session(
    adapter: str, driver: Driver, brakes: Any, redis_url: str
) -> None:
    """Two workers on one real Redis: the first runs the agent (max_repeats=3, halt_at=5), the second (a brake
    with no ladder of its own: the halt is in the session's record) is then asked for another tool."""
    first_face = "sync" if ADAPTERS[adapter].sync_only else "async"
    first = brakes(f"{first_face}-redis", redis_url, timeout_seconds=ADAPTER_TIMEOUT, **HALT)
    second = brakes("sync-redis", redis_url, timeout_seconds=ADAPTER_TIMEOUT)
    body, plan = Body(), Run(FOREVER, "c-halt")

    how = ADAPTERS[adapter].halt
    if how == "raises":
        with pytest.raises(Exception) as caught:
            await driver.run(first, body, plan)
        text, session = raised_halt(caught.value)
    else:
        seen = await driver.run(first, body, plan)
        if how == "stops":  # the framework's own stop, with the halt as its text
            assert plan.stopped is not None
            text, session = plan.stopped, halted_session(plan.stopped)
        else:  # an MCP server: every call of the session from the fifth on is an error result saying so
            assert [s.refused for s in seen] == [False, False] + [True] * (FOREVER - 2)
            assert not any("is halted" in s.text for s in seen[:4])
            assert all("is halted" in s.text and "the run was stopped" in s.text for s in seen[4:])
            text, session = seen[4].text, halted_session(seen[4].text)

    assert body.runs == ["weather", "weather"]
    assert "is halted" in text and "called 5 times in a row" in text and PREFIX in text, text
    assert "weather" not in text
    if how != "answers":
        assert plan.asked is not None and plan.asked <= 6, plan.asked
    with pytest.raises(LoopBrakeHalt) as refused:
        await Checker(second).check("another_tool", {"x": 1}, session_id=session)
    assert refused.value.session_id == session
