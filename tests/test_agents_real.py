"""Claude Code and Codex, for real: `claude -p` and `codex exec` against a scripted model that repeats one tool call.

The agents are the npm packages `@anthropic-ai/claude-code` and `@openai/codex`
(`.ci/run` installs them into AGENTS, below); a missing one fails these tests, it
never skips them. Each agent is pointed at `tests/agent_model.py` through its own
base-URL setting, and the hook is configured as the README tells a user to: Claude
Code in the project's `.claude/settings.json`, Codex in `~/.codex/hooks.json`.
`distbrake` on the agents' PATH is this checkout (a two-line wrapper).

The scripted model asks for the same shell command (which appends a line to a
file) on every turn until a tool result carries the brake's refusal. So: the
command ran exactly max_repeats - 1 times, the model read the refusal, and two
agent processes with one session id on one Redis share the streak.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.agent_model import FINAL, Script, serve
from tests.serve_process import start

ROOT = Path(__file__).resolve().parent.parent
# Where .ci/run installs the agents (npm --prefix); DISTBRAKE_AGENTS_PREFIX overrides it.
AGENTS = Path(os.environ.get("DISTBRAKE_AGENTS_PREFIX") or
              Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "distbrake-ci" / "npm-agents")
INSTALL = f"npm install --prefix {AGENTS} @anthropic-ai/claude-code @openai/codex"


def agent(name: str) -> str:
    path = AGENTS / "node_modules" / ".bin" / name
    if not path.exists():
        pytest.fail(f"{path} is missing: the real-agent tests need it (.ci/run installs it: {INSTALL})")
    return str(path)


@pytest.fixture
def model() -> Iterator[tuple[str, Script, Path]]:
    """A scripted model server (in a thread); yields its base URL, its script and the file the command appends to."""
    yield from _model(None)


def _model(limit: int | None, marker: Path | None = None) -> Iterator[tuple[str, Script, Path]]:
    marker = marker or Path(os.environ.get("TMPDIR", "/tmp")) / f"distbrake-agent-{uuid.uuid4().hex}.txt"
    server, script = serve(f"echo ran >> {marker}", limit=limit)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", script, marker
    finally:
        server.shutdown()
        server.server_close()
        marker.unlink(missing_ok=True)


def runs(marker: Path) -> int:
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def user_env(home: Path, **extra: str) -> dict[str, str]:
    """A user's environment: their own HOME, `distbrake` on PATH (this checkout), nothing of the test runner's."""
    bin_dir = home / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapper = bin_dir / "distbrake"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m distbrake "$@"\n')
    wrapper.chmod(0o755)
    node = shutil.which("node")
    path = os.pathsep.join(p for p in (str(bin_dir), os.path.dirname(node) if node else "", "/usr/bin", "/bin") if p)
    return {"PATH": path, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"), "LANG": "C.UTF-8", **extra}


COMMAND_HOOK = {"type": "command", "command": "distbrake hook claude-code"}


def claude(base_url: str, home: Path, *args: str, hook: dict[str, object] = COMMAND_HOOK,
           **env: str) -> dict[str, object]:
    """`claude -p` in a project whose .claude/settings.json runs the hook, as the README shows."""
    project = home / "project"
    (project / ".claude").mkdir(parents=True, exist_ok=True)
    (project / ".claude" / "settings.json").write_text(json.dumps({"hooks": {"PreToolUse": [
        {"matcher": "*", "hooks": [hook]}]}}))
    result = subprocess.run(
        [agent("claude"), "-p", "Append a line to the file, please.", "--allowedTools", "Bash",
         "--output-format", "json", *args],
        cwd=project, capture_output=True, text=True, timeout=180, check=False, stdin=subprocess.DEVNULL,
        env=user_env(home, ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY="sk-ant-test", DISABLE_TELEMETRY="1",
                     CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1", **env),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    found: dict[str, object] = json.loads(result.stdout)
    return found


def test_claude_code_runs_the_repeated_command_twice_and_reads_the_refusal(
    model: tuple[str, Script, Path], tmp_path: Path
) -> None:
    base_url, script, marker = model
    result = claude(base_url, tmp_path / "home")
    assert runs(marker) == 2  # max_repeats - 1
    assert result["result"] == FINAL and result["is_error"] is False
    denials = result["permission_denials"]
    assert isinstance(denials, list) and [d["tool_name"] for d in denials] == ["Bash"]
    assert len(script.refusals_seen) == 1
    assert 'loop brake: tool "Bash" called 3 times in a row with identical arguments' in script.refusals_seen[0]
    assert "echo ran" not in script.refusals_seen[0]  # the arguments never reach the refusal


def test_codex_runs_the_repeated_command_twice_and_reads_the_refusal(
    model: tuple[str, Script, Path], tmp_path: Path
) -> None:
    base_url, script, marker = model
    home = tmp_path / "home"
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    project = home / "project"
    project.mkdir()
    (codex_home / "config.toml").write_text(
        'model = "gpt-test"\nmodel_provider = "scripted"\napproval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n\n[model_providers.scripted]\nname = "scripted"\n'
        f'base_url = "{base_url}/v1"\nwire_api = "responses"\nenv_key = "SCRIPTED_API_KEY"\n'
    )
    (codex_home / "hooks.json").write_text(json.dumps({"hooks": {"PreToolUse": [
        {"hooks": [{"type": "command", "command": "distbrake hook codex"}]}]}}))
    # `codex exec` runs only hooks the user trusted (interactively: /hooks); automation that vets
    # its hooks passes --dangerously-bypass-hook-trust, as here.
    result = subprocess.run(
        [agent("codex"), "exec", "--dangerously-bypass-hook-trust", "--skip-git-repo-check",
         "Append a line to the file, please."],
        cwd=project, capture_output=True, text=True, timeout=180, check=False, stdin=subprocess.DEVNULL,
        env=user_env(home, CODEX_HOME=str(codex_home), SCRIPTED_API_KEY="sk-test"),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert runs(marker) == 2
    assert FINAL in result.stdout
    assert len(script.refusals_seen) == 1
    assert 'loop brake: tool "Bash" called 3 times in a row with identical arguments' in script.refusals_seen[0]


def test_two_claude_processes_with_one_session_share_the_streak_in_redis(tmp_path: Path, redis_url: str) -> None:
    """Two machines (two HOMEs) run `claude -p --session-id S` against one Redis: one streak, across both."""
    session = str(uuid.uuid4())
    first_model = _model(limit=1)  # the first agent asks for the command once, then answers
    base_url, _, marker = next(first_model)
    try:
        claude(base_url, tmp_path / "machine-1", "--session-id", session, DISTBRAKE_URL=redis_url)
        assert runs(marker) == 1
        second = _model(None, marker)  # the same command: the same call
        base_url_2, script_2, _ = next(second)
        try:
            result = claude(base_url_2, tmp_path / "machine-2", "--session-id", session, DISTBRAKE_URL=redis_url)
            assert runs(marker) == 2  # the session's second identical call ran on machine 2; its third was denied
            assert result["result"] == FINAL
            assert 'called 3 times in a row' in script_2.refusals_seen[0]
        finally:
            second.close()
    finally:
        first_model.close()
    assert not (tmp_path / "machine-1" / ".cache" / "distbrake").exists()  # nothing local: the streak is in Redis


def test_claude_code_http_hook_on_distbrake_serve(model: tuple[str, Script, Path], tmp_path: Path) -> None:
    """Claude Code's `type: "http"` hook POSTs to `distbrake serve` (one endpoint for a team): same outcome."""
    base_url, script, marker = model
    with start(tmp_path, env={"DISTBRAKE_SERVE_TOKEN": "team-token"}) as server:
        hook = {"type": "http", "url": f"{server.url}/v1/hooks/claude-code",
                "headers": {"Authorization": "Bearer $DISTBRAKE_SERVE_TOKEN"},
                "allowedEnvVars": ["DISTBRAKE_SERVE_TOKEN"]}
        result = claude(base_url, tmp_path / "home", hook=hook, DISTBRAKE_SERVE_TOKEN="team-token")
        metrics = httpx.get(f"{server.url}/metrics", headers={"Authorization": "Bearer team-token"}, timeout=10).text
    assert runs(marker) == 2
    assert result["result"] == FINAL
    assert 'called 3 times in a row' in script.refusals_seen[0]
    assert 'distbrake_serve_requests_total{endpoint="hooks/claude-code",outcome="denied"} 1.0' in metrics
