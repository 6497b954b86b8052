"""Call ids: a replay is recognised within the replay window (the brake's timeout), never later.

Hosts that number their calls afresh every turn send `call_0` each time: the
same id a second or more later is a new call, so such a host is still braked,
while a lost-reply retry and the same call passing two seams (both within
the window) stay counted once. Real time passes between the turns here (the
rule is about time); nothing asserts on how long anything took.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from distbrake import AsyncDistributedBrake, DistributedBrake, LoopBrake, LoopBrakeError
from tests.backends import Checker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_in_process_a_reused_call_id_turns_later_is_a_new_call() -> None:
    clock = Clock()
    brake = LoopBrake(clock=clock)
    counts = []
    for _turn in range(2):
        verdict = brake.check("search", {"q": "weather"}, session_id="s", call_id="call_0")
        counts.append((verdict.count, verdict.replayed))
        again = brake.check("search", {"q": "weather"}, session_id="s", call_id="call_0")  # a second seam
        counts.append((again.count, again.replayed))
        clock.now += 1.0
    assert counts == [(1, False), (1, True), (2, False), (2, True)]
    with pytest.raises(LoopBrakeError, match="called 3 times in a row"):
        brake.check("search", {"q": "weather"}, session_id="s", call_id="call_0")


def make(flavour: str, url: str, **options: Any) -> Checker:
    if flavour == "sync":
        return Checker(DistributedBrake.from_url(url, **options))
    return Checker(AsyncDistributedBrake.from_url(url, **options))


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_a_host_reusing_call_0_every_turn_is_denied_at_the_limit(flavour: str, redis_url: str) -> None:
    brake = make(flavour, redis_url, timeout_seconds=0.5)  # the replay window: a loaded machine stays inside it
    try:
        outcomes = []
        for turn in range(3):
            if turn:
                await asyncio.sleep(0.6)  # the next user turn comes later than the replay window
            outcomes.append(await brake.count("search", {"q": "weather"}, session_id="s", call_id="call_0"))
            # within the window: the same host call at a second seam, counted once
            outcomes.append(await brake.count("search", {"q": "weather"}, session_id="s", call_id="call_0"))
    finally:
        await brake.close()
    print(f"\n{flavour}: call_0 in three turns, each checked twice: {outcomes}")
    assert outcomes == [1, 1, 2, 2, -3, -3]


async def test_turns_a_second_apart_with_the_default_timeout(redis_url: str) -> None:
    """The default replay window is the default timeout (0.5 s): turns a second apart are new calls."""
    brake = DistributedBrake.from_url(redis_url)
    try:
        counts = []
        for turn in range(3):
            if turn:
                time.sleep(1.0)
            try:
                counts.append(brake.check("search", {"q": "weather"}, session_id="s", call_id="call_0").count)
            except LoopBrakeError as error:  # the third turn
                counts.append(-error.count)
    finally:
        brake.close()
    assert counts == [1, 2, -3]
