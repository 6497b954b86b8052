"""The adapter kernel: what every framework adapter does alike, written once.

Each framework module keeps only its seam: where the framework lets it see a
tool call before it runs (a middleware, hook, guardrail, plugin or braked
tool), and how a refusal, a warning and a result travel the framework's way.
Everything else is here:

* `requires(...)`: the optional-import guard that names the extra to install;
* `AdapterOptions`: `on_deny`, `scope` and `session_id`, checked when the
  adapter is built, the session rule, the check itself (`screen`), and
  `ends_run`, the one place that says whether a refusal ends the run (a
  halt, `LoopBrakeHalt`, always does, whatever `on_deny` says);
* `run_allowed` / `settle`: an allowed call's result (or raised exception)
  observed for a progress-aware tool or a tool with `max_failures` (an
  exception, or a result the framework marks as a tool error, is a failed
  call), and the warning the model should read;
* `Handoff` / `Pending`: an allowed verdict carried from the hook that
  checked a call to the hook that sees its result.

A session scope says how long a streak lives:

* `scope="run"` (the default of every adapter): within one agent invocation.
  The session id is the conversation (thread) id together with the
  framework's run or invocation id, so the same legitimate question asked in
  three user turns is three streaks of one call each, never a loop;
* `scope="conversation"`: the thread (conversation) id alone, across turns.

An explicit `session_id=` callable (given the framework's own context object,
documented per adapter) overrides both; when it returns None or "" the
scope's rule applies (`chosen_session`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Generic, Literal, TypeVar

from ..errors import ConfigurationError, LoopBrakeError, LoopBrakeHalt
from ..session import bound_session
from ..wrap import Brake, acheck, aobserve

__all__ = [
    "ON_DENY",
    "SCOPES",
    "AdapterOptions",
    "Handoff",
    "OnDeny",
    "Pending",
    "Scope",
    "SessionIdFunction",
    "check_adapter_options",
    "chosen_session",
    "needs_observation",
    "requires",
    "run_allowed",
    "run_allowed_sync",
    "scoped_session",
    "settle",
    "settle_sync",
    "text_with_warning",
    "warning_of",
]

Scope = Literal["run", "conversation"]
SCOPES: tuple[Scope, ...] = ("run", "conversation")
OnDeny = Literal["message", "raise"]
ON_DENY: tuple[str, ...] = ("message", "raise")
SessionIdFunction = Callable[[Any], object]
R = TypeVar("R")
K = TypeVar("K")


# -- the import guard -----------------------------------------------------------------------------


@contextmanager
def requires(module: str, needs: str, extra: str) -> Iterator[None]:
    """Turn an `ImportError` of the framework imports in the block into one that names the extra.

    `with requires(__name__, "LangChain 1.x", "langchain"): from langchain ... import ...`
    raises `ImportError('distbrake.integrations.langchain needs LangChain 1.x: pip install
    "distbrake[langchain]"')`, chained from the original error.
    """
    try:
        yield
    except ImportError as error:  # pragma: no cover - depends on the installed extras
        raise ImportError(f'{module} needs {needs}: pip install "distbrake[{extra}]"') from error


# -- options and sessions -------------------------------------------------------------------------


def check_adapter_options(
    brake: object,
    on_deny: str,
    choices: Iterable[str],
    scope: str = "run",
    session_id: object = None,
) -> None:
    """Raise `ConfigurationError` for an unknown `on_deny` or `scope`, `TypeError` for a bad brake or callable."""
    allowed = tuple(choices)
    if on_deny not in allowed:
        raise ConfigurationError(
            f"on_deny must be one of {', '.join(map(repr, allowed))}, not {on_deny!r}"
        )
    if scope not in SCOPES:
        raise ConfigurationError(
            f"scope must be one of {', '.join(map(repr, SCOPES))}, not {scope!r}"
        )
    if session_id is not None and not callable(session_id):
        raise TypeError(f"session_id must be a callable or None, not {type(session_id).__name__}")
    if not callable(getattr(brake, "check", None)):
        raise TypeError(f"brake must have a check method, not {type(brake).__name__}")


def scoped_session(scope: str, conversation: object, run: object) -> str | None:
    """The session id for `scope`: the conversation alone, or the run within it (None: the brake's default).

    With `scope="run"` and a run id, the id is `<conversation>/run/<run>`
    (just `run/<run>` without a conversation); without a run id it falls back
    to the conversation. When the framework names no conversation, the
    session bound with `bind_session` (if any) stands for it, so a bound
    session is kept under both scopes.
    """
    thread = None if conversation is None or conversation == "" else str(conversation)
    if scope == "run" and run is not None and run != "":
        if thread is None:
            thread = bound_session()
        return f"run/{run}" if thread is None else f"{thread}/run/{run}"
    return thread


def chosen_session(
    session_id: Callable[[Any], object] | None,
    context: Any,
    default: Callable[[Any], object],
) -> object:
    """`session_id(context)` when it names a session (not None, not ""), else `default(context)`."""
    if session_id is not None:
        chosen = session_id(context)
        if chosen is not None and chosen != "":
            return chosen
    return default(context)


class AdapterOptions:
    """The options every adapter takes (`brake`, `on_deny`, `scope`, `session_id`) and what it does with them.

    A base of each adapter class (or a helper object an adapter's functions
    share): the options are checked when the adapter is built (`configure`;
    `ON_DENY` lists the adapter's `on_deny` choices), `pick_session` applies the
    session rule, `screen` checks a call, `ends_run` says whether a refusal
    ends the run.
    """

    ON_DENY: tuple[str, ...] = ON_DENY
    brake: Brake
    on_deny: Any
    scope: Scope
    session_id: SessionIdFunction | None

    def __init__(
        self,
        brake: Brake,
        *,
        on_deny: OnDeny = "message",
        scope: Scope = "run",
        session_id: SessionIdFunction | None = None,
    ) -> None:
        self.configure(brake, on_deny, scope, session_id)

    def configure(self, brake: Brake, on_deny: str, scope: Scope, session_id: SessionIdFunction | None) -> None:
        """Check the options (`ConfigurationError`, `TypeError`) and keep them."""
        check_adapter_options(brake, on_deny, self.ON_DENY, scope, session_id)
        self.brake = brake
        self.on_deny = on_deny
        self.scope = scope
        self.session_id = session_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.brake!r}, on_deny={self.on_deny!r}, scope={self.scope!r})"

    def pick_session(self, context: Any, default: Callable[[Any], object]) -> object:
        """The session of a call: `session_id(context)` when it names one, else `default(context)`."""
        return chosen_session(self.session_id, context, default)

    def ends_run(self, error: BaseException) -> bool:
        """Whether a refusal ends the run (the framework's way) rather than being shown to the model.

        The one place that decides it for every adapter: a halt (`LoopBrakeHalt`: the session is
        halted, every later call of it is refused) always does, whatever `on_deny` says; any other
        refusal with `on_deny="raise"`. The MCP adapters, whose server cannot end the client's run,
        always answer a refusal as a tool error and do not ask.
        """
        return isinstance(error, LoopBrakeHalt) or self.on_deny == "raise"

    async def screen(
        self, tool: str, args: Any, *, session_id: object, call_id: object = None
    ) -> tuple[Any, LoopBrakeError | None]:
        """Check one call with any brake: `(verdict, None)` when it is allowed, `(None, error)` when refused."""
        try:
            verdict = await acheck(self.brake, tool, args, session_id=session_id, call_id=call_id)
        except LoopBrakeError as error:
            return None, error
        return verdict, None

    def screen_sync(
        self, tool: str, args: Any, *, session_id: object, call_id: object = None
    ) -> tuple[Any, LoopBrakeError | None]:
        """`screen` for a sync brake, from sync code."""
        try:
            verdict = self.brake.check(tool, args, session_id=session_id, call_id=call_id)
        except LoopBrakeError as error:
            return None, error
        return verdict, None


# -- an allowed call: warning and observation -----------------------------------------------------


def warning_of(verdict: Any) -> str | None:
    """The `warn_at` warning the model should read with the result (None in shadow mode or without one)."""
    warning = getattr(verdict, "warning", None)
    if not isinstance(warning, str) or not warning or getattr(verdict, "would_deny", False):
        return None
    return warning


def needs_observation(verdict: Any) -> bool:
    """True for a progress-aware tool's verdict, or one with `max_failures`: its result must be handed to
    `brake.observe`."""
    return getattr(verdict, "observe_token", None) is not None


def text_with_warning(text: str, warning: str) -> str:
    """A text result, whole, then the warning as a separate paragraph."""
    return f"{text}\n\n{warning}" if text else warning


def _same(result: Any) -> object:
    return result


def failure(failed: bool) -> bool | None:
    """What an observation passes as `failed`: True for a result the framework marks as a tool error, else
    None (the brake's default: a raised exception failed, any other result succeeded)."""
    return True if failed else None


async def run_allowed(
    brake: Brake,
    verdict: Any,
    run: Callable[[], Awaitable[R]],
    observed: Callable[[R], object] = _same,
    catch: type[BaseException] = BaseException,
    failed: Callable[[R], bool] | None = None,
) -> R:
    """`await run()` for an allowed call; for a progress-aware tool or one with `max_failures`, its result
    (`observed(result)`; a failed call when `failed(result)`, the framework's tool error) or raised
    exception (of type `catch`, a failed call) is observed."""
    observe = needs_observation(verdict)
    try:
        result = await run()
    except catch as raised:
        if observe:
            await aobserve(brake, verdict, raised)
        raise
    if observe:
        await aobserve(brake, verdict, observed(result), failure(failed is not None and failed(result)))
    return result


def run_allowed_sync(
    brake: Brake,
    verdict: Any,
    run: Callable[[], R],
    observed: Callable[[R], object] = _same,
    catch: type[BaseException] = BaseException,
    failed: Callable[[R], bool] | None = None,
) -> R:
    """`run_allowed` for a sync brake, from sync code."""
    observe = needs_observation(verdict)
    try:
        result = run()
    except catch as raised:
        if observe:
            settle_sync(brake, verdict, raised)
        raise
    if observe:
        settle_sync(brake, verdict, observed(result), failed is not None and failed(result))
    return result


async def settle(brake: Brake, verdict: Any, observed: object, failed: bool = False) -> str | None:
    """After an allowed call ran (seen by a later hook): observe `observed` (an exception, or `failed`:
    the framework's tool error, is a failed call) for a progress-aware tool or one with `max_failures`;
    the warning for the model, if any."""
    if needs_observation(verdict):
        await aobserve(brake, verdict, observed, failure(failed))
    return warning_of(verdict)


def settle_sync(brake: Brake, verdict: Any, observed: object, failed: bool = False) -> str | None:
    """`settle` for a sync brake, from sync code."""
    if needs_observation(verdict):
        if failed:
            brake.observe(verdict, observed, failed=True)  # type: ignore[attr-defined]
        else:
            brake.observe(verdict, observed)  # type: ignore[attr-defined]
    return warning_of(verdict)


def _identical(held: object, key: object) -> bool:
    return held is key


class Handoff(Generic[K]):
    """An allowed call's verdict, from the hook that checked it to the hook that sees its result, in a
    context variable: `(brake, key, [verdict])`, taken once by the same brake for the same key."""

    def __init__(self, name: str, same: Callable[[K, K], bool] = _identical) -> None:
        self._held: ContextVar[tuple[Brake, K, list[Any]] | None] = ContextVar(name, default=None)
        self._same = same

    def put(self, brake: Brake, key: K, verdict: Any) -> None:
        self._held.set((brake, key, [verdict]))

    def clear(self) -> None:
        self._held.set(None)

    def take(self, brake: Brake, key: K) -> Any:
        """The verdict `brake` gave the call of `key` (once), or None."""
        held = self._held.get()
        if held is None or held[0] is not brake or not held[2] or not self._same(held[1], key):
            return None
        return held[2].pop()


class Pending:
    """Allowed calls' verdicts by call id, until the hook that sees the call's result takes them
    (thread-safe; the oldest dropped past `limit`)."""

    def __init__(self, limit: int | None = None) -> None:
        self._verdicts: OrderedDict[str, Any] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._verdicts)

    def keep(self, call_id: str | None, verdict: Any) -> None:
        """Keep an allowed verdict that has something to do after the call (observation or warning)."""
        if not call_id or not (needs_observation(verdict) or warning_of(verdict) is not None):
            return
        with self._lock:
            self._verdicts[call_id] = verdict
            while self._limit is not None and len(self._verdicts) > self._limit:
                self._verdicts.popitem(last=False)

    def take(self, call_id: str) -> Any:
        with self._lock:
            return self._verdicts.pop(call_id, None)
