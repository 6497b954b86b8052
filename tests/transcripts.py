"""The README's CLI transcripts, made by running their commands for real.

Every ```console block of README.md is a transcript: `$ command` lines, each
followed by what it printed and `[exit N]`. This module reads the commands
from the README, runs them in README order against one fresh redis-server (a
throwaway one started here, never the Redis on 6379), and prints or writes
back what they printed:

    python -m tests.transcripts            # print every transcript as it comes out now
    python -m tests.transcripts --write    # rewrite README.md's console blocks in place
    python -m tests.transcripts --write --all   # ... and the blocks marked test="skip" (none today)

`tests/test_readme.py` runs the same commands against the suite's server and
checks that each exits as shown.

Conventions the README follows (and the test enforces):

* `redis://localhost:6379/0` stands for "your Redis": commands run with the
  throwaway server's URL in its place, and the output shows the placeholder
  again (the server listens on a 4-digit port, so the URL keeps its width and
  tables stay aligned);
* commands run with `bash -c` in a scratch directory holding `args.json`
  (`{"query": "weather in Paris"}`), with `NO_COLOR=1`, `COLUMNS=120` and no
  `DISTBRAKE_*` variable;
* fence settings, written after the language as pytest-examples reads them
  (`console after="fastmcp"`): `after="NAME"` first runs the README's
  ```python block marked `name="NAME"` (with the same URL in place of the
  placeholder); `test="skip" reason="..."` marks a recorded measurement that
  the test does not run (only `--all` regenerates it).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PLACEHOLDER = "redis://localhost:6379/0"
ARGS_JSON = '{"query": "weather in Paris"}\n'
COMMAND_TIMEOUT = 300.0

_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
_SETTING = re.compile(r"""([^{\s]+?)=(['"])(.+?)\2""")
_EXIT = re.compile(r"^\[exit (\d+)\]$")


@dataclasses.dataclass(frozen=True)
class Fence:
    """One fenced block of the README: its language, settings, text and where it sits."""

    language: str
    settings: dict[str, str]
    body: str
    start: int  # index of the body's first character
    end: int  # index just past the body (the closing fence follows)
    line: int  # 1-based line of the opening fence


@dataclasses.dataclass(frozen=True)
class Step:
    """`$ command`, what it printed, and its exit status, as one transcript shows them."""

    command: str
    output: str
    exit_code: int


def fences(text: str) -> list[Fence]:
    """Every fenced block of a markdown text, in order."""
    found = []
    for match in _FENCE.finditer(text):
        info = match.group(1).strip()
        language = info.split(None, 1)[0].lower() if info else ""
        settings = {m.group(1): m.group(3) for m in _SETTING.finditer(info)}
        line = text.count("\n", 0, match.start()) + 1
        found.append(Fence(language, settings, match.group(2), match.start(2), match.end(2), line))
    return found


def transcripts(text: str) -> list[Fence]:
    return [fence for fence in fences(text) if fence.language == "console"]


def named_python(text: str, name: str) -> str:
    """The source of the ```python block marked `name="NAME"`."""
    blocks = [f for f in fences(text) if f.language == "python" and f.settings.get("name") == name]
    if len(blocks) != 1:
        raise LookupError(f"README.md has {len(blocks)} python blocks named {name!r}, not one")
    return blocks[0].body


def steps(fence: Fence) -> list[Step]:
    """The `$` commands of a transcript with what each printed and `[exit N]`.

    Raises ValueError when the block is not a transcript: text before the
    first `$`, or a command without its `[exit N]` line.
    """
    found: list[Step] = []
    command: str | None = None
    output: list[str] = []
    for line in fence.body.splitlines():
        if command is None:
            if line.startswith("$ "):
                command, output = line[2:], []
            elif line.strip():
                raise ValueError(f"README.md:{fence.line}: {line!r} is outside any command's output")
            continue
        exit_line = _EXIT.match(line)
        if exit_line:
            found.append(Step(command, "\n".join(output), int(exit_line.group(1))))
            command = None
        else:
            output.append(line)
    if command is not None:
        raise ValueError(f"README.md:{fence.line}: `$ {command}` has no [exit N] line")
    if not found:
        raise ValueError(f"README.md:{fence.line}: a console block with no `$` command")
    return found


def command_env() -> dict[str, str]:
    """The environment every transcript command (and setup block) runs in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTBRAKE_")}
    env.update(NO_COLOR="1", COLUMNS="120", PYTHONUNBUFFERED="1")
    env.pop("FORCE_COLOR", None)
    bin_dir = str(Path(sys.executable).parent)  # the `distbrake` of this interpreter's environment
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    return env


def _host_port(url: str) -> str:
    return url.split("://", 1)[1].split("/", 1)[0]


class Runner:
    """Runs transcript commands in one scratch directory against one backend URL."""

    def __init__(self, url: str, workdir: Path, readme: str) -> None:
        self.url = url
        self.workdir = workdir
        self.readme = readme
        (workdir / "args.json").write_text(ARGS_JSON, encoding="utf-8")

    def real(self, text: str) -> str:
        return text.replace(PLACEHOLDER, self.url)

    def shown(self, text: str) -> str:
        """Output as the README shows it: the real URL (and host:port) back to the placeholder."""
        text = text.replace(self.url, PLACEHOLDER)
        return text.replace(_host_port(self.url), _host_port(PLACEHOLDER))

    def setup(self, fence: Fence) -> None:
        name = fence.settings.get("after")
        if name is None:
            return
        source = self.real(named_python(self.readme, name))
        script = self.workdir / f"setup_{name}.py"
        script.write_text(source, encoding="utf-8")
        done = subprocess.run(
            [sys.executable, str(script)], cwd=self.workdir, env=command_env(), capture_output=True,
            text=True, timeout=COMMAND_TIMEOUT, check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the python block {name!r} failed:\n{done.stdout}{done.stderr}")

    def run(self, command: str) -> Step:
        done = subprocess.run(
            ["bash", "-c", self.real(command)], cwd=self.workdir, env=command_env(),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, timeout=COMMAND_TIMEOUT, check=False,
        )
        return Step(command, self.shown(done.stdout.rstrip("\n")), done.returncode)


def run_all(readme: str, url: str, workdir: Path, *, everything: bool = False) -> Iterator[tuple[Fence, list[Step]]]:
    """Run every transcript's commands in README order; yields (block, steps as they ran now)."""
    runner = Runner(url, workdir, readme)
    for fence in transcripts(readme):
        if fence.settings.get("test") == "skip" and not everything:
            continue
        runner.setup(fence)
        yield fence, [runner.run(step.command) for step in steps(fence)]


def render(ran: list[Step]) -> str:
    parts = []
    for step in ran:
        lines = [f"$ {step.command}"]
        if step.output:
            lines.append(step.output)
        lines.append(f"[exit {step.exit_code}]")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def _four_digit_port() -> int:
    """A free port in 6380..6999: its URL is as wide as the placeholder's."""
    for port in range(6380, 7000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port in 6380..6999")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite README.md's console blocks")
    parser.add_argument("--all", action="store_true",
                        help="also the blocks marked test=\"skip\" (recorded measurements)")
    options = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))
    from tests.servers import RedisServer

    readme = README.read_text(encoding="utf-8")
    replacements: list[tuple[Fence, str]] = []
    with RedisServer(port=_four_digit_port(), name="transcripts") as server, tempfile.TemporaryDirectory() as tmp:
        for fence, ran in run_all(readme, f"{server.url}/0", Path(tmp), everything=options.all):
            text = render(ran)
            replacements.append((fence, text))
            if not options.write:
                print(f"--- README.md:{fence.line}\n{text}")
    if options.write:
        for fence, text in reversed(replacements):
            readme = readme[: fence.start] + text + readme[fence.end :]
        README.write_text(readme, encoding="utf-8")
        print(f"rewrote {len(replacements)} transcript(s) in {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
