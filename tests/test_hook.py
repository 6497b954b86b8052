"""`distbrake hook <host>`: each host's documented events in, each host's documented answers out, in real processes.

The payloads are the hosts' documented examples (tests/hook_events.py cites each source); the
answers' field names are each host's documented output (distbrake/hosts/*.py cite them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from distbrake import BrakeSettings, LoopBrake, LoopBrakeError
from distbrake.filebrake import FileBrake
from distbrake.streakfile import DEFAULT_MAX_REPEATS, DEFAULT_PREFIX, DEFAULT_TIMEOUT, DEFAULT_TTL, StreakFile
from tests import hook_events

ROOT = Path(__file__).resolve().parent.parent
SECRET = "sk-live-DO-NOT-LEAK-4242"


def hook_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a hook process: a private cache directory, no DISTBRAKE_* of the caller's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISTBRAKE_", "DSH_"))}
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), PYTHONPATH=str(ROOT), **extra)
    return env


def run(host: str, event: Any, env: dict[str, str], *options: str) -> subprocess.CompletedProcess[str]:
    data = event if isinstance(event, (str, bytes)) else json.dumps(event)
    return subprocess.run(
        [sys.executable, "-m", "distbrake", "hook", host, *options], input=data if isinstance(data, bytes)
        else data.encode(), env=env, capture_output=True, timeout=60, check=False,
    )  # type: ignore[return-value]


def out(result: Any) -> str:
    return bytes(result.stdout).decode()


def err(result: Any) -> str:
    return bytes(result.stderr).decode()


def test_claude_code_denies_the_third_identical_call_in_its_own_shape(tmp_path: Path) -> None:
    env = hook_env(tmp_path)
    answers = [run("claude-code", hook_events.claude_pre(call=f"toolu_{i}"), env) for i in range(4)]
    assert [a.returncode for a in answers] == [0, 0, 0, 0]
    assert [out(a) for a in answers[:2]] == ["", ""]  # no decision: the user's permission rules still apply
    for count, answer in zip((3, 4), answers[2:], strict=True):
        reply = json.loads(out(answer))
        assert reply == {"hookSpecificOutput": {
            "hookEventName": "PreToolUse", "permissionDecision": "deny",
            "permissionDecisionReason": reply["hookSpecificOutput"]["permissionDecisionReason"]}}
        reason = reply["hookSpecificOutput"]["permissionDecisionReason"]
        assert reason.startswith(f'loop brake: tool "Bash" called {count} times in a row with identical arguments')
        assert "npm test" not in reason
    assert all(err(a) == "" for a in answers)


def test_the_same_tool_use_id_again_is_counted_once(tmp_path: Path) -> None:
    env = hook_env(tmp_path)
    # --timeout is also the replay window: a loaded machine may take longer than 0.5 s between two hook processes
    answers = [run("claude-code", hook_events.claude_pre(call="toolu_same"), env, "--timeout", "60") for _ in range(4)]
    assert [out(a) for a in answers] == ["", "", "", ""]


def test_codex_answers_like_claude_code_and_scope_run_uses_turn_id(tmp_path: Path) -> None:
    env = hook_env(tmp_path)
    first = [run("codex", hook_events.codex_pre(call=f"c{i}", turn="turn-1"), env, "--scope", "run") for i in range(2)]
    other_turn = run("codex", hook_events.codex_pre(call="c9", turn="turn-2"), env, "--scope", "run")
    third = run("codex", hook_events.codex_pre(call="c3", turn="turn-1"), env, "--scope", "run")
    assert [out(a) for a in [*first, other_turn]] == ["", "", ""]
    reply = json.loads(out(third))["hookSpecificOutput"]
    assert reply["permissionDecision"] == "deny" and reply["hookEventName"] == "PreToolUse"
    assert "called 3 times in a row" in reply["permissionDecisionReason"]


def test_gemini_denies_with_decision_and_reason(tmp_path: Path) -> None:
    env = hook_env(tmp_path)
    answers = [run("gemini", hook_events.gemini_pre(), env) for _ in range(3)]
    assert [json.loads(out(a)) for a in answers[:2]] == [{}, {}]
    reply = json.loads(out(answers[2]))
    assert reply["decision"] == "deny" and reply["reason"].startswith('loop brake: tool "run_shell_command" called 3')
    assert answers[2].returncode == 0


@pytest.mark.parametrize("event", [hook_events.cursor_pre, hook_events.cursor_shell, hook_events.cursor_mcp])
def test_cursor_denies_with_permission_and_agent_message(tmp_path: Path, event: Any) -> None:
    env = hook_env(tmp_path)
    answers = [run("cursor", event() | ({"tool_use_id": f"tool-{i}"} if "tool_use_id" in event() else {}), env)
               for i in range(3)]
    assert [json.loads(out(a)) for a in answers[:2]] == [{}, {}]
    reply = json.loads(out(answers[2]))
    assert reply["permission"] == "deny"
    assert reply["agent_message"] == reply["user_message"] and reply["agent_message"].startswith("loop brake: tool")
    if event is hook_events.cursor_pre:
        assert reply["decision"] == "deny" and reply["reason"] == reply["agent_message"]


def test_cursor_sessions_are_conversations(tmp_path: Path) -> None:
    env = hook_env(tmp_path)
    for _ in range(2):
        assert json.loads(out(run("cursor", hook_events.cursor_shell("conv-A"), env))) == {}
    assert json.loads(out(run("cursor", hook_events.cursor_shell("conv-B"), env))) == {}
    assert json.loads(out(run("cursor", hook_events.cursor_shell("conv-A"), env)))["permission"] == "deny"


@pytest.mark.parametrize("host", ["claude-code", "codex", "gemini"])
def test_post_tool_events_are_answered_and_do_not_count(tmp_path: Path, host: str) -> None:
    env = hook_env(tmp_path)
    def event(kind: Any, i: int) -> dict[str, Any]:
        found: dict[str, Any] = kind()
        return found | {"tool_use_id": f"call-{i}"} if "tool_use_id" in found else found

    for i in range(2):
        assert run(host, event(hook_events.PRE[host], i), env).returncode == 0
        answer = run(host, event(hook_events.POST[host], i), env)
        assert answer.returncode == 0 and err(answer) == "" and out(answer) in ("", "{}\n")
    assert "deny" in out(run(host, event(hook_events.PRE[host], 3), env))


BAD_INPUTS = {
    "not JSON": (b"{not json", "the event is not JSON"),
    "not UTF-8": (b"\xff\xfe{}", "the event is not JSON"),
    "an array": (b"[1, 2]", "the event is a JSON list, not an object"),
    "another event": (json.dumps({"hook_event_name": "Stop", "session_id": SECRET}).encode(), "'Stop' is not a tool"),
    "a missing session": (json.dumps({"hook_event_name": "PreToolUse", "tool_name": "Bash",
                                      "tool_input": {"command": SECRET}}).encode(), "no 'session_id' field"),
    "a number as tool name": (json.dumps({**hook_events.claude_pre(), "tool_name": 7}).encode(),
                              "'tool_name' field is"),
    "a huge tool_input": (json.dumps({**hook_events.claude_pre(), "tool_input": {"content": SECRET * 200_000}})
                          .encode(), "larger than 4 MiB"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_allowed_with_one_stderr_line_and_never_echoed(tmp_path: Path, case: str) -> None:
    data, said = BAD_INPUTS[case]
    answer = run("claude-code", data, hook_env(tmp_path))
    assert answer.returncode == 0 and out(answer) == ""
    line = err(answer)
    assert line.count("\n") == 1 and line.startswith("distbrake hook: ") and line.endswith("; allowed\n"), line
    assert said in line and SECRET not in line


def test_on_error_deny_is_fail_closed(tmp_path: Path) -> None:
    answer = run("claude-code", b"{not json", hook_env(tmp_path), "--on-error", "deny")
    reply = json.loads(out(answer))["hookSpecificOutput"]
    assert answer.returncode == 0 and reply["permissionDecision"] == "deny"
    assert "--on-error deny" in reply["permissionDecisionReason"]
    gemini = run("gemini", b"[]", hook_env(tmp_path), "--on-error=deny")
    assert json.loads(out(gemini))["decision"] == "deny"


def test_a_streak_file_it_cannot_write_follows_on_error(tmp_path: Path) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    store = str(blocked / "streaks.sqlite3")
    answer = run("claude-code", hook_events.claude_pre(), hook_env(tmp_path), "--store", store)
    assert answer.returncode == 0 and out(answer) == ""
    assert err(answer).startswith("distbrake hook: the check failed (") and err(answer).endswith("; allowed\n")
    closed = run("claude-code", hook_events.claude_pre(), hook_env(tmp_path), "--store", store, "--on-error", "deny")
    assert json.loads(out(closed))["hookSpecificOutput"]["permissionDecision"] == "deny"


def test_the_light_path_imports_no_pydantic_redis_or_click(tmp_path: Path) -> None:
    probe = (
        "import io, sys\n"
        f"sys.argv = ['distbrake', 'hook', 'claude-code']\n"
        f"sys.stdin = io.TextIOWrapper(io.BytesIO({json.dumps(hook_events.claude_pre()).encode()!r}))\n"
        "from distbrake.__main__ import main\n"
        "try:\n    main()\nexcept SystemExit as done:\n    code = done.code\n"
        "heavy = [m for m in ('pydantic', 'redis', 'fakeredis', 'click', 'rich') if m in sys.modules]\n"
        "print('HEAVY', heavy, code)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], env=hook_env(tmp_path), capture_output=True, text=True,
                            timeout=60, check=True)
    assert "HEAVY [] 0" in result.stdout


def test_the_light_defaults_are_the_settings_defaults() -> None:
    fields = BrakeSettings.model_fields
    assert fields["max_repeats"].default == DEFAULT_MAX_REPEATS
    assert fields["ttl_seconds"].default == DEFAULT_TTL
    assert fields["timeout_seconds"].default == DEFAULT_TIMEOUT
    assert fields["key_prefix"].default == DEFAULT_PREFIX


WORKER = """
import sys
from distbrake.hosts.run import HookOptions, run_hook
store, name = sys.argv[1], sys.argv[2]
import json
# a generous lock wait: this proves the count is atomic; on a loaded machine a process holding the
# lock can be descheduled for longer than the default 0.5 s (the hook would then allow, and say so)
options = HookOptions(max_repeats=100_000, store=store, timeout=30)
for i in range(50):
    event = {"session_id": "shared", "hook_event_name": "PreToolUse", "tool_name": "Bash",
             "tool_input": {"command": "ls"}, "tool_use_id": f"{name}-{i}"}
    answer = run_hook("claude-code", json.dumps(event).encode(), options, environ={})
    assert answer.stdout == "" and answer.stderr == "", answer
"""


def test_concurrent_hook_processes_count_exactly(tmp_path: Path) -> None:
    """8 processes x 50 hook calls on one session, through the hook's own code: the count is 400, exactly."""
    store = tmp_path / "streaks.sqlite3"
    env = hook_env(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(store), f"w{n}"], env=env) for n in range(8)]
    assert [p.wait(timeout=240) for p in procs] == [0] * 8
    rows = StreakFile(store).rows("shared")
    assert [(row.count, row.tool) for row in rows] == [(400, "Bash")]


def test_redis_hooks_in_two_processes_share_the_streak(tmp_path: Path, redis_url: str) -> None:
    env = hook_env(tmp_path, DISTBRAKE_URL=redis_url)
    first = run("claude-code", hook_events.claude_pre(session="team", call="a"), env)
    second = run("codex", hook_events.codex_pre(session="team", call="b") | {"tool_input": {
        "command": "npm test", "description": "Run the test suite"}}, env)
    third = run("claude-code", hook_events.claude_pre(session="team", call="c"), env)
    assert (out(first), out(second)) == ("", "")
    assert "called 3 times in a row" in json.loads(out(third))["hookSpecificOutput"]["permissionDecisionReason"]
    assert not (tmp_path / "cache").exists()  # nothing was written to the local streak file


def test_warn_at_reaches_claude_as_additional_context(tmp_path: Path) -> None:
    env = hook_env(tmp_path, DISTBRAKE_WARN_AT="2")
    assert out(run("claude-code", hook_events.claude_pre(call="1"), env)) == ""
    warned = json.loads(out(run("claude-code", hook_events.claude_pre(call="2"), env)))
    assert warned["hookSpecificOutput"]["additionalContext"].startswith("loop brake")
    assert "permissionDecision" not in warned["hookSpecificOutput"]


def test_file_brake_judges_like_the_in_process_brake(tmp_path: Path) -> None:
    """The same rules, the same verdicts: one sequence through FileBrake and LoopBrake (warn, cycles, replays)."""
    options: dict[str, Any] = {"max_repeats": 4, "warn_at": 2, "max_cycle_period": 2, "cycle_repeats": 3}
    file_brake, memory = FileBrake(tmp_path / "s.sqlite3", **options), LoopBrake(**options)
    calls = [("a", 1, "x1"), ("a", 1, "x2"), ("a", 1, "x2"), ("a", 1, "x3"), ("a", 1, "x4"), ("b", 2, None),
             ("a", 1, None), ("b", 2, None), ("a", 1, None), ("b", 2, None), ("a", 1, None), ("c", 3, None)]

    def outcome(brake: Any, tool: str, args: int, call_id: str | None) -> tuple[Any, ...]:
        try:
            v = brake.check(tool, args, session_id="s", call_id=call_id)
        except LoopBrakeError as error:
            return ("denied", error.kind, error.count, str(error))
        return ("allowed", v.count, v.warning, v.replayed)

    assert [outcome(file_brake, *c) for c in calls] == [outcome(memory, *c) for c in calls]
    assert file_brake.inspect("s") is not None and file_brake.inspect("s").count == 1  # type: ignore[union-attr]


def test_self_test_passes_for_every_host(tmp_path: Path) -> None:
    for host in ("claude-code", "codex", "gemini", "cursor"):
        result = subprocess.run([sys.executable, "-m", "distbrake", "hook", host, "--self-test"],
                                env=hook_env(tmp_path), capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stdout + result.stderr
        assert result.stdout.startswith(f"hook {host}: ok (2 identical calls allowed, call 3 denied")
    assert StreakFile(tmp_path / "cache" / "distbrake" / "streaks.sqlite3").rows() == []  # cleared afterwards


def test_doctor_checks_a_hook_end_to_end(tmp_path: Path) -> None:
    good = subprocess.run([sys.executable, "-m", "distbrake", "doctor", "--hook", "claude-code", "--json"],
                          env=hook_env(tmp_path), capture_output=True, text=True, timeout=120, check=False)
    assert good.returncode == 0, good.stdout + good.stderr
    finding = json.loads(good.stdout)["checks"][-1]
    assert finding["name"] == "hook claude-code" and finding["status"] == "ok"
    not_a_dir = tmp_path / "not-a-dir"
    not_a_dir.write_text("")  # the cache directory cannot be made: every hook call fails open, so the test fails
    bad = subprocess.run([sys.executable, "-m", "distbrake", "doctor", "--hook", "codex", "--json"],
                         env={**hook_env(tmp_path), "XDG_CACHE_HOME": str(not_a_dir)}, capture_output=True,
                         text=True, timeout=120, check=False)
    assert bad.returncode == 4
    finding = json.loads(bad.stdout)["checks"][-1]
    assert finding["status"] == "fail" and "--self-test" in finding["fix"]


class HaltingBrake:
    """A brake whose check raises the ladder's halt (kind "halt"): what every host answers then."""

    def check(self, tool: str, args: object, **ids: object) -> None:
        raise LoopBrakeError(tool, 9, 3, "ab" * 6, "s", kind="halt")


def test_a_halt_ends_the_turn_where_the_host_can() -> None:
    """Protocol level only: the halt itself (issue 24) is not in this branch, so no brake raises it end to end."""
    from distbrake.hosts import HookEvent, host
    from distbrake.hosts.run import decide

    decision = decide(HaltingBrake(), HookEvent("pre", "PreToolUse", "Bash", {}, "s"), "s")
    assert decision is not None and decision.verb == "halt"
    claude = json.loads(host("claude-code").answer("PreToolUse", decision).stdout)
    assert claude["continue"] is False and claude["stopReason"] == decision.message
    assert claude["hookSpecificOutput"]["permissionDecision"] == "deny"
    codex = json.loads(host("codex").answer("PreToolUse", decision).stdout)
    assert codex["continue"] is False and codex["hookSpecificOutput"]["permissionDecision"] == "deny"
    gemini = json.loads(host("gemini").answer("BeforeTool", decision).stdout)
    assert gemini == {"decision": "deny", "reason": decision.message, "continue": False,
                      "stopReason": decision.message}
    cursor = json.loads(host("cursor").answer("preToolUse", decision).stdout)
    assert cursor["permission"] == "deny"  # Cursor's tool events cannot end the conversation


def halt_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A hook's environment with the ladder: denied from the 3rd identical call, halted at the 5th."""
    return hook_env(tmp_path, DISTBRAKE_MAX_REPEATS="3", DISTBRAKE_HALT_AT="5", **extra)


def assert_halts_claude(answers: list[Any], session: str) -> str:
    """Five identical Claude Code calls: two allowed, two denied, the fifth halted with Claude's stop."""
    assert [out(a) for a in answers[:2]] == ["", ""]
    denied = [json.loads(out(a)) for a in answers[2:4]]
    assert all("continue" not in d and d["hookSpecificOutput"]["permissionDecision"] == "deny" for d in denied)
    halted = json.loads(out(answers[4]))
    assert halted["continue"] is False  # Claude Code stops the turn
    assert halted["hookSpecificOutput"]["permissionDecision"] == "deny"
    stop = str(halted["stopReason"])
    assert stop == halted["hookSpecificOutput"]["permissionDecisionReason"]
    assert f'session "{session}" is halted' in stop and "called 5 times in a row" in stop
    assert "npm test" not in stop
    return stop


@pytest.mark.parametrize("store", ["file", "redis"])
def test_a_halted_session_stops_claude_and_every_later_call_of_any_tool(
    tmp_path: Path, store: str, request: pytest.FixtureRequest
) -> None:
    """Each answer is its own hook process, on the user's streak file or on one Redis (as two machines would)."""
    env = halt_env(tmp_path, **({"DISTBRAKE_URL": request.getfixturevalue("redis_url")} if store == "redis" else {}))
    answers = [run("claude-code", hook_events.claude_pre(session="loop", call=f"toolu_{i}"), env) for i in range(5)]
    assert_halts_claude(answers, "loop")
    other = hook_events.claude_pre(session="loop", call="toolu_other") | {
        "tool_name": "Read", "tool_input": {"file_path": "/etc/hosts"}}
    again = json.loads(out(run("claude-code", other, env)))
    assert again["continue"] is False and 'session "loop" is halted' in again["stopReason"]
    codex = json.loads(out(run("codex", hook_events.codex_pre(session="loop"), env)))  # another host, same file
    assert codex["continue"] is False and 'session "loop" is halted' in codex["stopReason"]
    gemini = json.loads(out(run("gemini", hook_events.gemini_pre(session="loop"), env)))
    assert gemini["decision"] == "deny" and gemini["continue"] is False and "is halted" in gemini["stopReason"]
    cursor = json.loads(out(run("cursor", hook_events.cursor_pre(conversation="loop"), env)))
    assert cursor["permission"] == "deny" and "is halted" in cursor["agent_message"]  # Cursor cannot stop
    fresh = run("claude-code", hook_events.claude_pre(session="another", call="toolu_x"), env)
    assert out(fresh) == ""  # other sessions go on


def test_claude_codes_failed_tool_uses_count_for_max_failures(tmp_path: Path) -> None:
    """`PostToolUseFailure` is a failed call: two in a row refuse the tool's next call (`max_failures=2`), whatever
    its arguments; a `PostToolUse` between resets the count."""
    env = hook_env(tmp_path, DISTBRAKE_MAX_REPEATS="10", DISTBRAKE_TOOLS='{"Bash": {"max_failures": 2}}')

    def use(call: str, command: str, outcome: str) -> str:
        pre = hook_events.claude_pre(session="flaky", call=call) | {"tool_input": {"command": command}}
        answer = out(run("claude-code", pre, env))
        if not answer:
            post = pre | ({"hook_event_name": "PostToolUseFailure", "error": "exit 1"} if outcome == "fail" else
                          {"hook_event_name": "PostToolUse", "tool_response": {"stdout": "ok"}})
            assert out(run("claude-code", post, env)) == ""
        return answer

    assert [use("a", "make", "fail"), use("b", "make", "ok"), use("c", "make -j2", "fail"),
            use("d", "make -j4", "fail")] == ["", "", "", ""]
    refused = json.loads(use("e", "make -j8", "fail"))["hookSpecificOutput"]["permissionDecisionReason"]
    assert refused.startswith('loop brake: tool "Bash" failed 2 times in a row'), refused


def test_key_prefixes_keep_apart_in_the_streak_file(tmp_path: Path) -> None:
    env = hook_env(tmp_path)
    for i in range(2):
        assert out(run("claude-code", hook_events.claude_pre(call=f"a{i}"), env, "--key-prefix", "team-a")) == ""
    assert out(run("claude-code", hook_events.claude_pre(call="b0"), env, "--key-prefix", "team-b")) == ""
    assert "deny" in out(run("claude-code", hook_events.claude_pre(call="a2"), env, "--key-prefix", "team-a"))


def test_an_id_holding_a_lone_surrogate_is_stored_and_fails_no_other_check(tmp_path: Path) -> None:
    # JSON (and so a hook event or an HTTP body) may hold "\ud800", which SQLite cannot store as text: it failed
    # the whole transaction, so every check batched with it (distbrake serve) was lost.
    from distbrake.model import Rules

    store = StreakFile(tmp_path / "s.sqlite3")
    digest = "ab" * 32
    batch = [("s1", digest, None, "ok", Rules(3)), ("s2\ud800", digest, None, "bad\ud800", Rules(3))]
    assert [count for count, *_ in store.step_many(batch)] == [1, 1]
    assert [count for count, *_ in store.step_many(batch)] == [2, 2]
    assert {row.session for row in store.rows()} == {"s1", "s2\\xed\\xa0\\x80"}
    assert store.step("s3", digest, "c\udc00", "t", Rules(3))[:2] == (1, False)
    assert store.step("s3", digest, "c\udc00", "t", Rules(3))[:2] == (1, True)  # the same call id: a replay
    brake = FileBrake(tmp_path / "f.sqlite3")
    assert [brake.check("t\ud800", {}, session_id="x\udc00").count for _ in range(2)] == [1, 2]
    assert brake.clear("x\udc00")
