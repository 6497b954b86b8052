"""What every framework adapter's tests share: the adapters and where they are collected, the driver each
adapter module gives the contract test (`tests/test_adapter_contract.py`), options refused at build time, the
install hint when its extra is missing, and `import distbrake` never importing the framework."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import logging
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import pytest

from distbrake import ConfigurationError, LoopBrake


@dataclass(frozen=True)
class Adapter:
    """A framework adapter as the tests see it: the framework package it needs, the extra that installs it,
    whether it takes sync brakes only, its test module's marks (the framework's own warnings), and how its
    host sees a halted session (`halt`): "raises" (the run raises, `LoopBrakeHalt` in its exception chain or
    the framework's stop carrying it), "stops" (the run ends without raising: its result is the halt text,
    `Run.stopped`) or "answers" (an MCP server: it cannot end the client's run, every later call of the
    session is an error result saying it is halted)."""

    framework: str
    extra: str
    sync_only: bool = False
    marks: tuple[pytest.MarkDecorator, ...] = ()
    halt: str = "raises"


# Every framework adapter, by its module's name under distbrake.integrations.
ADAPTERS: dict[str, Adapter] = {
    "langchain": Adapter("langchain", "langchain"),
    "pydantic_ai": Adapter("pydantic_ai", "pydantic-ai"),
    "fastmcp": Adapter("fastmcp", "fastmcp", halt="answers"),
    "mcp": Adapter("mcp", "mcp", halt="answers"),
    "openai_agents": Adapter("agents", "openai-agents"),
    "google_adk": Adapter("google.adk", "google-adk"),
    "llamaindex": Adapter("llama_index", "llamaindex", marks=(
        pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecationWarning"),
        pytest.mark.filterwarnings("ignore:Skipping serialization of known unserializable key"),
    )),
    "claude_agent_sdk": Adapter("claude_agent_sdk", "claude-agent-sdk", halt="stops"),
    "agent_framework": Adapter("agent_framework", "agent-framework"),
    "crewai": Adapter(
        "crewai", "crewai", sync_only=True, marks=(pytest.mark.filterwarnings("ignore::DeprecationWarning:crewai"),)
    ),
    "strands": Adapter("strands", "strands"),
}

# Adapters whose framework cannot share the main environment (crewai and strands pin an mcp the mcp extra
# cannot use): their tests (their module, their contract cases) are collected only where the framework is
# installed. `.ci/run` runs each in its own environment and fails unless it passed with no skip.
SEPARATE_ENVIRONMENTS = ("crewai", "strands")


def collected(adapter: str) -> bool:
    """Whether this environment collects the tests of `adapter` (see SEPARATE_ENVIRONMENTS)."""
    return adapter not in SEPARATE_ENVIRONMENTS or importlib.util.find_spec(ADAPTERS[adapter].framework) is not None


# -- the contract test's drivers ----------------------------------------------------------------------


class Body:
    """The body of the `search(q)` tool every driver gives its framework: counts its runs, returns the next
    of `answers` (default: "results for <q>" every time)."""

    def __init__(self, answers: Iterable[str] | None = None) -> None:
        self.runs: list[str] = []
        self._answers: Iterator[str] | None = None if answers is None else iter(answers)

    def __call__(self, q: str) -> str:
        self.runs.append(q)
        return f"results for {q}" if self._answers is None else next(self._answers)


@dataclass
class Seen:
    """What the model read for one tool call: whether it was the refusal, and its text (warnings included)."""

    refused: bool
    text: str


_run_ids = itertools.count(1)


@dataclass
class Run:
    """One agent run a driver plays: a scripted model calling `search {"q": "weather"}` `calls` times in a row
    (one model turn each, ids `ids`), then answering; in conversation `conversation`.

    The driver fills in, even when the run raised: `asked`, how many times the model was called (None for
    an MCP server: its client is the caller), and `stopped`, the text a run the framework ended without
    raising ended with (the Claude Agent SDK's result after a hook's `continue: false`)."""

    calls: int
    conversation: str
    ids: list[str] = field(default_factory=list)
    asked: int | None = None
    stopped: str | None = None

    def __post_init__(self) -> None:
        tag = next(_run_ids)
        self.ids = [f"r{tag}_{i}" for i in range(1, self.calls + 1)]


class Driver(Protocol):
    """An adapter's framework set-up for the contract test: one run of the real framework, braked by `brake`
    with the adapter's `options`, whose tool is `body`; what the model read for each call, in order."""

    async def run(self, brake: Any, body: Body, plan: Run, **options: Any) -> list[Seen]: ...


def driver_of(adapter: str) -> Driver:
    """The `Driver` of `tests/test_integration_<adapter>.py` (imported now: the framework with it)."""
    module = importlib.import_module(f"tests.test_integration_{adapter}")
    found: Driver = module.Driver()
    return found


def refuses_bad_options(build: Callable[..., object], *, session_id: bool = True) -> None:
    """`build(brake, **options)` refuses an unknown on_deny or scope, a non-callable session_id and a brake
    without check."""
    with pytest.raises(ConfigurationError, match="on_deny"):
        build(LoopBrake(), on_deny="retry")
    with pytest.raises(ConfigurationError, match="scope"):
        build(LoopBrake(), scope="thread")
    if session_id:
        with pytest.raises(TypeError, match="session_id"):
            build(LoopBrake(), session_id="fixed")
    with pytest.raises(TypeError, match="check"):
        build(object())


def names_its_extra_when_missing(monkeypatch: pytest.MonkeyPatch, adapter: str, framework: str, extra: str) -> None:
    """Importing `distbrake.integrations.<adapter>` with the `framework` package absent says
    `pip install "distbrake[extra]"`."""
    loaded = [name for name in sys.modules if name == framework or name.startswith(f"{framework}.")]
    for name in {framework, *loaded}:
        monkeypatch.setitem(sys.modules, name, None)  # as if the framework were not installed
    monkeypatch.delitem(sys.modules, f"distbrake.integrations.{adapter}")
    with pytest.raises(ImportError, match=rf'pip install "distbrake\[{extra}\]"'):
        importlib.import_module(f"distbrake.integrations.{adapter}")


def import_leaves_the_framework_alone(prefix: str) -> None:
    """A fresh `import distbrake, distbrake.integrations` loads no module of the framework named `prefix`."""
    code = "import sys, distbrake, distbrake.integrations\n"
    code += f"print([m for m in sys.modules if m.startswith({prefix!r})])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert done.stdout.strip() == "[]"


def assert_kept_in_process(
    secret: str,
    shown: Iterable[str],
    records: Iterable[logging.LogRecord],
    brake: Any = None,
    redis_url: str | None = None,
) -> None:
    """A tool argument (`secret`) never left the process: it is in none of `shown` (what the model or the
    host saw), of distbrake's log records (some are there: the denial), of `brake`'s sessions, or of the
    bytes stored in the Redis of `redis_url`."""
    logs = [record.getMessage() for record in records if record.name.startswith("distbrake")]
    assert logs
    for text in [*shown, *logs]:
        assert secret not in text
    if brake is not None:
        states = list(brake.sessions())
        assert states
        assert all(secret not in repr(state) for state in states)
    if redis_url is not None:
        import redis

        from tests.test_security import every_stored_byte

        with redis.Redis.from_url(redis_url) as client:
            assert secret.encode() not in every_stored_byte(client)


async def refused_each_day(
    call: Callable[[dict[str, Any]], Awaitable[tuple[bool, str]]], with_run: bool = True
) -> list[bool]:
    """An MCP client's week: one conversation ("week"), three user turns (each its own run id in `_meta` when
    `with_run`), one identical `search` each; `call(meta)` is the client's call. Was each turn's call refused?"""
    days = ("monday", "tuesday", "wednesday")
    return [(await call({"session_id": "week", **({"run_id": f"run-{day}"} if with_run else {})}))[0] for day in days]
