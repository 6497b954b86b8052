"""README.md is true: every ```python block runs as printed, every CLI transcript exits as shown.

Python blocks are found by pytest-examples (`find_examples`) and each runs as
a user would run it: saved as a script and started with `python` in a fresh
process, in an empty directory, with no `DISTBRAKE_*` variable. A block runs
on what it names: `memory://` needs nothing; the placeholder
`redis://localhost:6379/0` ("your Redis") is replaced by the suite's own
redis-server (never the Redis on 6379), and the test checks that the server
really ran the brake's script. Every block runs with
`DISTBRAKE_ON_BACKEND_ERROR=closed`, so a block that silently lost its Redis
fails instead of passing on the `local` fallback; a block that shows the
fallback says `on_backend_error="local"` itself.

Fence settings (after the language, as pytest-examples reads them; GitHub
shows none of them):

* `output="below"`: the block's output (stdout and stderr, as a terminal
  shows them) must equal the ```text block that follows it;
* `name="NAME"`: a block a transcript runs first (`console after="NAME"`);
* `test="skip" reason="..."`: a deliberately partial block, not run. There
  are few, and each says why;
* `env="crewai"` / `env="strands"`: a block for a framework that cannot share
  the main environment (see `SEPARATE_ENVIRONMENTS` in conftest.py). It runs
  in that framework's own environment, where this module runs only the
  blocks of that environment (`.ci/run` runs them there and fails on a skip);
  the main environment runs every other block.

Transcripts (```console blocks) are made by `tests/transcripts.py`, which
reads their commands from the README; here the same commands run in README
order against the suite's server, and each must exit as its `[exit N]` says.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pytest_examples import CodeExample, find_examples

from tests import transcripts
from tests.conftest import SEPARATE_ENVIRONMENTS
from tests.servers import RedisServer

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TEXT = README.read_text(encoding="utf-8")
PLACEHOLDER = transcripts.PLACEHOLDER
MAX_PARTIAL = 2
BLOCK_TIMEOUT = 180.0

EXAMPLES = [e for e in find_examples(README) if e.prefix.split()[:1] == ["python"]]
COMPLETE = [e for e in EXAMPLES if e.prefix_settings().get("test") != "skip"]
PARTIAL = [e for e in EXAMPLES if e.prefix_settings().get("test") == "skip"]
# This environment: the one separate framework installed here, else "main".
HERE = next((name for name in SEPARATE_ENVIRONMENTS if importlib.util.find_spec(name) is not None), "main")
RUNNABLE = [e for e in COMPLETE if e.prefix_settings().get("env", "main") == HERE]


def block_id(example: CodeExample) -> str:
    return f"line{example.start_line}"


def script_calls(server: RedisServer) -> int:
    """EVAL + EVALSHA calls the server has served so far."""
    stats = server.info("commandstats")
    return sum(
        int(re.search(r"calls=(\d+)", stats.get(f"cmdstat_{name}", "calls=0")).group(1))  # type: ignore[union-attr]
        for name in ("evalsha", "eval")
    )


def output_below(example: CodeExample) -> str:
    """The ```text block right after the example (only blank lines between)."""
    fences = transcripts.fences(TEXT)
    following = [f for f in fences if f.start > example.end_index]
    assert following, f"{example}: output=\"below\" but no block follows"
    after = following[0]
    between = TEXT[example.end_index : after.start]
    assert after.language == "text", f"{example}: the block after it is {after.language!r}, not text"
    assert between.strip("`\n ").startswith("text") and not between.strip("`\n ")[4:].strip(), (
        f"{example}: prose between the block and its output"
    )
    return after.body


def run_block(source: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    script = workdir / "example.py"
    script.write_text(source, encoding="utf-8")
    env = transcripts.command_env()
    env["DISTBRAKE_ON_BACKEND_ERROR"] = "closed"
    env.pop("OPENAI_API_KEY", None)
    return subprocess.run(
        [sys.executable, str(script)], cwd=workdir, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=BLOCK_TIMEOUT,
        check=False,
    )


@pytest.mark.parametrize("example", RUNNABLE, ids=block_id)
def test_python_block_runs_as_printed(
    example: CodeExample, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    source = example.source
    server: RedisServer | None = None
    url = PLACEHOLDER
    if PLACEHOLDER in source:
        url = request.getfixturevalue("redis_url") + "/0"
        server = request.getfixturevalue("redis_server")
        source = source.replace(PLACEHOLDER, url)
    before = script_calls(server) if server is not None else 0

    done = run_block(source, tmp_path)

    assert done.returncode == 0, f"{example} failed (exit {done.returncode}):\n{done.stdout}"
    if server is not None:
        assert script_calls(server) > before, f"{example} names Redis but never ran the brake's script on it"
    if example.prefix_settings().get("output") == "below":
        assert done.stdout.replace(url, PLACEHOLDER) == output_below(example)


def test_python_blocks_are_found_and_partial_ones_are_few_and_say_why() -> None:
    assert len(EXAMPLES) == TEXT.count("\n```python")
    assert len(RUNNABLE) >= 8
    elsewhere = {e.prefix_settings().get("env", "main") for e in COMPLETE} - {"main"}
    assert elsewhere == set(SEPARATE_ENVIRONMENTS), elsewhere  # each names a separate environment, and has a block
    assert len(PARTIAL) <= MAX_PARTIAL, [str(e) for e in PARTIAL]
    for example in PARTIAL:
        assert example.prefix_settings().get("reason"), f"{example}: a partial block must say why"


def test_python_blocks_pass_ruff() -> None:
    """No unused import, undefined name or sloppy code in what users copy (the project's ruff rules).

    README examples keep one blank line between definitions (isort is told so), and may print.
    """
    sources = {block_id(e): e.source for e in COMPLETE}  # ruff needs no framework: every block, in any environment
    problems = []
    for name, source in sources.items():
        done = subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--quiet", "--stdin-filename", f"{name}.py",
             "--ignore", "INP001,T201,D", "--config", "lint.isort.lines-after-imports=1", "-"],
            input=source, capture_output=True, text=True, cwd=ROOT, check=False,
        )
        if done.returncode != 0:
            problems.append(f"{name}:\n{done.stdout}{done.stderr}")
    assert problems == []


def test_every_console_block_is_a_transcript() -> None:
    found = transcripts.transcripts(TEXT)
    assert len(found) >= 4
    for fence in found:
        assert transcripts.steps(fence)  # raises on text outside a command or a missing [exit N]
        if fence.settings.get("test") == "skip":
            assert fence.settings.get("reason"), f"README.md:{fence.line}: a skipped transcript must say why"
        if "after" in fence.settings:
            transcripts.named_python(TEXT, fence.settings["after"])


def test_cli_transcripts_exit_as_shown(redis_url: str, tmp_path: Path) -> None:
    mismatches = []
    for fence, ran in transcripts.run_all(TEXT, redis_url + "/0", tmp_path):
        for shown, now in zip(transcripts.steps(fence), ran, strict=True):
            if shown.exit_code != now.exit_code:
                mismatches.append(
                    f"README.md:{fence.line}: $ {shown.command}\n  shown [exit {shown.exit_code}], "
                    f"now [exit {now.exit_code}]:\n{now.output}"
                )
    assert mismatches == [], "\n".join(mismatches)


def test_the_tests_command_is_the_one_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    two = TEXT[TEXT.index("## Two commands") :]
    two = two[: two.index("\n## ", 4)]
    assert "python -m pytest" in two
    assert re.search(r"^python -m pytest$", ci, re.M)
    assert "distbrake demo" in two


def test_no_install_line_asks_pypi_for_distbrake() -> None:
    """distbrake is not on PyPI: every install command installs from a clone, a path or a VCS URL."""
    commands = [
        line for fence in transcripts.fences(TEXT) if fence.language in ("bash", "console", "sh")
        for line in fence.body.splitlines() if "pip install" in line
    ]
    assert commands
    for line in commands:
        for spec in re.findall(r"pip install\s+(?:-\S+\s+)*(\"[^\"]*\"|\S+)", line):
            requirement = spec.strip("\"'")
            if requirement.startswith("distbrake"):
                assert " @ " in requirement, line
            else:
                assert requirement.startswith("."), line  # the clone itself: `pip install -e ".[extra]"`


def test_the_newcomers_path_ends_before_line_300() -> None:
    """The front door (issue 28): what a newcomer needs comes first; the Reference part starts before line 300."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert "# Reference" in lines
    path = lines[:lines.index("# Reference")]
    while not path[-1].strip():
        path.pop()
    assert len(path) < 300
