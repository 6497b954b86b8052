"""The operator's stop from the real CLI and hooks (issue 24.3), in subprocesses against a real redis-server.

`distbrake block`/`unblock` (sessions, --match, --all), what `list`,
`inspect`, `stats` and `top` show of halted and blocked sessions and of the
kill switch (text and JSON), `clear` lifting a halt, `distbrake hook`
honouring the switch (Redis and the streak file), and the metrics' and span
events' outcome `halted`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from distbrake import DistributedBrake, LoopBrake, LoopBrakeError, LoopBrakeHalt
from distbrake.model import Halt
from distbrake.streakfile import StreakFile
from tests import hook_events
from tests.backends import Checker
from tests.metric_points import OtelMetrics, PrometheusMetrics, checks
from tests.test_cli import as_json, run
from tests.test_hook import hook_env, out
from tests.test_hook import run as run_hook
from tests.test_operator import first_allowed, first_refusal

ESCAPE = "\x1b[2J"


def cli(url: str, *args: str) -> Any:
    return run("--url", url, "--key-prefix", "ops", *args)


async def test_block_list_inspect_stats_top_unblock_and_clear(redis_url: str) -> None:
    worker = DistributedBrake.from_url(redis_url, key_prefix="ops", otel=False, halt_at=4)
    for _ in range(2):
        worker.check("search", {"q": 1}, session_id="s1")
    worker.check("fetch", {}, session_id="s2")
    refusals = []
    for _ in range(4):  # 1, 2 allowed; 3 denied (max_repeats); 4 halts the session (halt_at)
        try:
            worker.check("search", {"q": 9}, session_id="r1")
        except LoopBrakeError as error:
            refusals.append(error)
    assert [type(e).__name__ for e in refusals] == ["LoopBrakeError", "LoopBrakeHalt"]
    blocked = cli(redis_url, "block", "s1", "ghost", "--reason", f"loop on search{ESCAPE}", "--ttl", "15m",
                  "--who", "oncall")
    assert blocked.returncode == 0, blocked.stderr
    assert blocked.stdout.startswith("blocked 2 session(s) under prefix 'ops'") and "15m00s" in blocked.stdout
    with pytest.raises(LoopBrakeHalt) as caught:
        worker.check("other", {}, session_id="s1")
    assert (caught.value.who, caught.value.reason) == ("oncall", f"loop on search{ESCAPE}")

    listed = as_json(cli(redis_url, "list", "--json"))
    rows = {row["session_id"]: row for row in listed["sessions"]}
    assert [row["session_id"] for row in listed["sessions"]][:3] == sorted(
        ["s1", "ghost", "r1"], key=lambda s: -rows[s]["count"])  # halted first
    assert listed["halted"] == 3 and listed["kill_switch"] is None
    assert rows["s1"]["state"] == "blocked" and rows["s1"]["halt"]["who"] == "oncall"
    assert rows["s1"]["halt"]["reason"] == f"loop on search{ESCAPE}" and rows["s1"]["halt"]["by"] == "operator"
    assert 0 < rows["s1"]["ttl_seconds"] <= 900 and rows["s1"]["count"] == 2
    assert rows["ghost"]["count"] == 0 and rows["ghost"]["halted"] is True
    assert rows["r1"]["state"] == "halted" and rows["r1"]["halt"]["by"] == "rule"
    assert (rows["r1"]["halt"]["kind"], rows["r1"]["halt"]["limit"]) == ("repeat", 4)
    assert rows["s2"]["halted"] is False and rows["s2"]["halt"] is None and rows["s2"]["state"] == "ok"
    text = cli(redis_url, "list").stdout
    assert "BLOCKED by oncall: loop on search\\x1b[2J" in text and ESCAPE not in text
    assert "HALTED (repeat)" in text and "3 halted or blocked" in text

    inspected = cli(redis_url, "inspect", "s1")
    assert "REFUSED: the session is halted" in inspected.stdout and "BLOCKED by oncall" in inspected.stdout
    shown = as_json(cli(redis_url, "inspect", "r1", "--json"))
    assert shown["halted"] and shown["halt"]["tool_name"] == "search" and shown["halt"]["count"] == 4

    worker.close()  # its fleet view (the halted checks) is written
    stats = as_json(cli(redis_url, "stats", "--json"))
    assert {s["session_id"] for s in stats["halted_sessions"]} == {"s1", "ghost", "r1"}
    assert stats["tools"]["search"]["halted"] >= 1 and stats["tools"]["other"]["halted"] == 1
    assert stats["kill_switch"] is None
    stats_text = cli(redis_url, "stats").stdout
    assert "halted and blocked sessions" in stats_text and ESCAPE not in stats_text
    top = as_json(cli(redis_url, "top", "--json"))
    assert {s["session_id"] for s in top["halted_sessions"]} == {"s1", "ghost", "r1"}
    assert {s["session_id"]: s["state"] for s in top["streaks"]}["s1"] == "blocked"
    assert "BLOCKED" in cli(redis_url, "top").stdout

    assert as_json(cli(redis_url, "unblock", "s2", "--json"))["unblocked"] == 0  # not halted: left alone
    assert cli(redis_url, "unblock", "--match", "s*").stdout.startswith("lifted 1 halt(s)")
    assert as_json(cli(redis_url, "inspect", "s2", "--json"))["count"] == 1
    assert as_json(cli(redis_url, "clear", "ghost", "--json"))["cleared"] == 1  # clear lifts a halt
    assert as_json(cli(redis_url, "unblock", "r1", "--json"))["unblocked"] == 1
    assert as_json(cli(redis_url, "list", "--json"))["halted"] == 0


async def test_block_all_is_the_kill_switch_and_unblock_all_lifts_it(redis_url: str) -> None:
    worker = Checker(DistributedBrake.from_url(redis_url, key_prefix="ops", otel=False))
    await worker.check("search", {}, session_id="before")
    refused = cli(redis_url, "block", "--all")
    assert refused.returncode == 2 and "without --yes" in refused.stderr
    assert worker.brake.kill_switch() is None
    done = as_json(cli(redis_url, "block", "--all", "--yes", "--reason", "incident 42", "--ttl", "1h", "--json"))
    assert done["all"] is True and done["ttl_seconds"] == 3600 and done["reason"] == "incident 42"
    error = await first_refusal(worker)
    assert (error.halt_rule, error.reason) == ("kill", "incident 42") and error.who
    assert "KILL SWITCH SET by" in cli(redis_url, "list").stdout
    stats = as_json(cli(redis_url, "stats", "--json"))
    assert stats["kill_switch"]["reason"] == "incident 42" and 3500 < stats["kill_switch"]["ttl_seconds"] <= 3600
    assert as_json(cli(redis_url, "inspect", "nobody", "--json"))["kill_switch"]["kind"] == "kill"
    assert "KILL SWITCH SET" in cli(redis_url, "top").stdout
    assert as_json(cli(redis_url, "unblock", "--all", "--json"))["was_set"] is True
    assert cli(redis_url, "unblock", "--all").stdout.startswith("kill switch was not set")
    assert await first_allowed(worker) == 1
    await worker.close()


@pytest.mark.parametrize(("args", "said"), [
    (("block",), "name at least one SESSION"),
    (("block", "--all", "s1"), "not both"),
    (("unblock",), "name at least one SESSION"),
    (("unblock", "--all", "--match", "x"), "not both"),
    (("block", "s1", "--ttl", "soon"), "--ttl"),
    (("block", "s1", "--ttl", "0"), "--ttl"),
])
def test_usage_errors(args: tuple[str, ...], said: str) -> None:
    result = run(*args)
    assert result.returncode == 2 and said in result.stderr


def test_memory_url_blocks_within_the_process_and_says_so() -> None:
    result = run("--url", "memory://", "block", "s1", "--json")
    assert result.returncode == 0 and as_json(result)["blocked"] == 1 and as_json(result)["who"]
    text = run("--url", "memory://", "unblock", "--all")
    assert text.returncode == 0 and "memory:// is private to this process" in text.stderr


def test_the_hook_honours_the_kill_switch_on_redis_and_in_the_streak_file(tmp_path: Path, redis_url: str) -> None:
    env = hook_env(tmp_path, DISTBRAKE_URL=redis_url)
    assert out(run_hook("claude-code", hook_events.claude_pre(session="h1", call="a"), env)) == ""
    operator = DistributedBrake.from_url(redis_url, otel=False)
    operator.block_all(reason="hooks too", who="ops")
    answer = json.loads(out(run_hook("claude-code", hook_events.claude_pre(session="h2", call="b"), env)))
    assert answer["continue"] is False and "every session was stopped by ops: hooks too" in answer["stopReason"]
    operator.unblock_all()
    assert out(run_hook("claude-code", hook_events.claude_pre(session="h2", call="c"), env)) == ""
    operator.close()

    light = hook_env(tmp_path)  # no DISTBRAKE_*: the light path, on the user's streak file
    store = StreakFile(str(tmp_path / "cache" / "distbrake" / "streaks.sqlite3"))
    store.set_kill(Halt("kill", 1.0, reason="laptop"), None)
    answer = json.loads(out(run_hook("claude-code", hook_events.claude_pre(session="h3", call="d"), light)))
    assert answer["continue"] is False and "every session was stopped: laptop" in answer["stopReason"]
    assert store.clear_kill() is True
    assert out(run_hook("claude-code", hook_events.claude_pre(session="h3", call="e"), light)) == ""
    store.close()


@pytest.mark.parametrize("exporter", ["otel", "prometheus"])
def test_a_halted_check_is_the_outcome_halted_and_a_span_event_halted(exporter: str) -> None:
    metrics = OtelMetrics() if exporter == "otel" else PrometheusMetrics()
    spans = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(spans))
    brake = LoopBrake(max_repeats=2, **metrics.options)
    brake.check("search", {"q": 1}, session_id="s")
    with pytest.raises(LoopBrakeError) as denied:
        brake.check("search", {"q": 1}, session_id="s")
    assert not isinstance(denied.value, LoopBrakeHalt)
    brake.block("s", reason="stop")
    with tracer.get_tracer("host").start_as_current_span("agent-step"), pytest.raises(LoopBrakeHalt):
        brake.check("fetch", {"q": 2}, session_id="s", call_id="call-3")
    brake.block_all()
    with pytest.raises(LoopBrakeHalt):
        brake.check("fetch", {"q": 3}, session_id="other")
    points = {k: v for k, v in metrics.points().items() if k[0] == "distbrake.checks"}
    assert points == {checks("search", "allowed", "in-process"): 1, checks("search", "denied", "in-process"): 1,
                      checks("fetch", "halted", "in-process"): 2}
    events = [(event.name, dict(event.attributes or {})) for span in spans.get_finished_spans()
              for event in span.events]
    assert [(name, a["gen_ai.guardrail.result.type"], a["gen_ai.tool.call.id"]) for name, a in events] == (
        [("gen_ai.guardrail.result", "halted", "call-3")] if exporter == "otel" else [])  # (events: OTel only)


def test_the_demo_shows_the_ladder_and_an_operators_block() -> None:
    text = run("demo", "--workers", "3")
    assert text.returncode == 0, text.stderr
    lines = [line.strip() for line in text.stdout.splitlines()]
    steps = [next(i for i, line in enumerate(lines) if want in line) for want in (
        "warned agent bravo: search", "denied agent bravo: search", "HALTED agent bravo: search",
        "operator: distbrake block demo-", "refused agent charlie: its session is blocked by the operator")]
    assert steps == sorted(steps)  # warn, deny, halt, then the operator's block and its refusal
    data = as_json(run("demo", "--workers", "3", "--json"))
    assert data["warned"] >= 1 and data["denied"] == 2 and all(d["agent"] == "bravo" for d in data["denials"])
    assert {(h["agent"], h["halt"]) for h in data["halted"]} == {("bravo", "repeat"), ("charlie", "block")}
