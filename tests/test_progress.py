"""Progress-aware tools (issue 10.4): a poller whose result changes is not stuck; one whose result repeats is.

On every brake kind, through the wrappers (which observe results by
themselves) and through `check` + `observe`; and across two worker
processes sharing one real redis-server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from distbrake import ConfigurationError, DistributedBrake, LoopBrake, LoopBrakeError
from tests.backends import ALL_BRAKES, Brakes, face

POLLER = {"get_job_status": {"progress": True}}
# Brakes here get a generous timeout: the tests read records back, so no check may fall to the policy on a busy machine.


@pytest.fixture(params=ALL_BRAKES)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def poll(brake: Any, kind: str, results: list[Any]) -> list[int]:
    """Call a braked poller once per result (it returns that result); the counts seen, negative when denied."""
    answers = iter(results)
    counts: list[int] = []
    if face(kind) == "async":
        @brake.guard("get_job_status")
        async def get_job_status(job: str) -> Any:
            return next(answers)
    else:
        @brake.guard("get_job_status")
        def get_job_status(job: str) -> Any:
            return next(answers)

    for _ in results:
        try:
            if face(kind) == "async":
                await get_job_status("j1")
            else:
                get_job_status("j1")
        except LoopBrakeError as error:
            counts.append(-error.count)
            next(answers)
            continue
        state = await _maybe(brake.inspect("default")) if hasattr(brake, "inspect") else None
        counts.append(state.count if state is not None else 0)
    return counts


async def _maybe(value: Any) -> Any:
    return await value if hasattr(value, "__await__") else value


async def test_a_poller_whose_result_changes_is_never_denied(kind: str, brakes: Brakes) -> None:
    brake = brakes(kind, tools=POLLER, timeout_seconds=10.0)
    counts = await poll(brake, kind, [{"done": i} for i in range(30)])
    print(f"\n{kind}: 30 polls, 30 different results: counts {sorted(set(counts))}")
    assert all(count > 0 for count in counts)
    assert counts == [1] * 30  # each changed result restarts the streak: the next poll is checked as 2


async def test_a_poller_whose_result_repeats_is_denied_at_its_limit(kind: str, brakes: Brakes) -> None:
    brake = brakes(kind, tools=POLLER, timeout_seconds=10.0)
    counts = await poll(brake, kind, [{"done": False}] * 4)
    assert counts == [1, 2, -3, -4]


async def test_checks_see_1_2_2_2_with_changing_results(kind: str, brakes: Brakes) -> None:
    brake = brakes(kind, tools=POLLER, timeout_seconds=10.0)
    seen = []
    for i in range(5):
        verdict = await _maybe(brake.check("get_job_status", {"job": "j1"}, session_id="s"))
        seen.append(verdict.count)
        await _maybe(brake.observe(verdict, {"pct": i * 20}))
    assert seen == [1, 2, 2, 2, 2]


async def test_a_tool_that_raises_counts_its_exception_type(kind: str, brakes: Brakes) -> None:
    brake = brakes(kind, tools=POLLER, timeout_seconds=10.0)
    seen = []
    for _ in range(3):
        try:
            verdict = await _maybe(brake.check("get_job_status", {"job": "j1"}, session_id="s"))
        except LoopBrakeError as error:
            seen.append(-error.count)
            continue
        seen.append(verdict.count)
        await _maybe(brake.observe(verdict, TimeoutError("the job service timed out")))
    assert seen == [1, 2, -3]


async def test_an_observation_is_ignored_once_the_streak_moved_on(kind: str, brakes: Brakes) -> None:
    brake = brakes(kind, tools=POLLER, timeout_seconds=10.0)
    first = await _maybe(brake.check("get_job_status", {"job": "j1"}, session_id="s"))
    await _maybe(brake.observe(first, {"pct": 0}))
    second = await _maybe(brake.check("get_job_status", {"job": "j1"}, session_id="s"))
    await _maybe(brake.check("other", {}, session_id="s"))  # the streak moved on
    await _maybe(brake.observe(second, {"pct": 50}))  # too late: ignored
    again = await _maybe(brake.check("get_job_status", {"job": "j1"}, session_id="s"))
    assert (first.count, second.count, again.count) == (1, 2, 1)


async def test_a_new_streak_never_compares_with_an_earlier_streaks_result(kind: str, brakes: Brakes) -> None:
    # The second streak's first poll is never observed (denied by another rule, or its worker died):
    # its second poll has no earlier result of its own streak, so it restarts nothing.
    brake = brakes(kind, tools=POLLER, timeout_seconds=10.0)
    first = await _maybe(brake.check("get_job_status", {"job": "j1"}, session_id="s"))
    await _maybe(brake.observe(first, {"pct": 10}))
    await _maybe(brake.check("other", {}, session_id="s"))  # a new streak
    await _maybe(brake.check("get_job_status", {"job": "j1"}, session_id="s"))  # never observed
    second = await _maybe(brake.check("get_job_status", {"job": "j1"}, session_id="s"))
    await _maybe(brake.observe(second, {"pct": 90}))
    with pytest.raises(LoopBrakeError) as denied:
        await _maybe(brake.check("get_job_status", {"job": "j1"}, session_id="s"))
    assert (second.count, denied.value.count) == (2, 3)


async def test_other_tools_pay_nothing(kind: str, brakes: Brakes) -> None:
    brake = brakes(kind, tools=POLLER, timeout_seconds=10.0)
    verdict = await _maybe(brake.check("search", {"q": 1}, session_id="s"))
    assert verdict.observe_token is None


def test_a_progress_tool_needs_a_limit_of_at_least_3() -> None:
    with pytest.raises(ConfigurationError, match=r"tools\['poll'\]\.progress needs max_repeats >= 3"):
        LoopBrake(tools={"poll": {"progress": True, "max_repeats": 2}})


WORKER = """
import json, sys
from distbrake import DistributedBrake, LoopBrakeError
brake = DistributedBrake.from_url(sys.argv[1], tools={"get_job_status": {"progress": True}})
for line in sys.stdin:
    result = json.loads(line)
    try:
        verdict = brake.check("get_job_status", {"job": "j1"}, session_id="poller")
    except LoopBrakeError as error:
        print(-error.count, flush=True)
        continue
    brake.observe(verdict, result)
    print(verdict.count, flush=True)
"""


def two_workers(url: str, results: list[Any]) -> list[int]:
    """Polls alternating between two worker processes on one Redis; the count each poll got."""
    workers = [
        subprocess.Popen([sys.executable, "-c", WORKER, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
        for _ in range(2)
    ]
    counts = []
    try:
        for i, result in enumerate(results):
            worker = workers[i % 2]
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.write(json.dumps(result) + "\n")
            worker.stdin.flush()
            counts.append(int(worker.stdout.readline()))
    finally:
        for worker in workers:
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.close()
            worker.wait(timeout=30)
            worker.stdout.close()
    return counts


def test_two_worker_processes_share_the_pollers_streak(redis_url: str) -> None:
    changing = two_workers(redis_url, [{"pct": i} for i in range(30)])
    with DistributedBrake.from_url(redis_url) as brake:
        assert brake.clear("poller")
    stuck = two_workers(redis_url, [{"pct": 0}] * 4)
    print(f"\ntwo workers, one Redis: changing results -> counts {sorted(set(changing))}; "
          f"the same result -> {stuck}")
    assert changing == [1] + [2] * 29
    assert stuck == [1, 2, -3, -4]
