"""One hook call: read the host's event, count it with the brake, answer in the host's protocol.

A hook never breaks the agent it serves: input it cannot read (not JSON, not
an object, a missing or mistyped field, more than `MAX_EVENT_BYTES`) or an
event it does not handle is allowed, with one line on stderr, exit 0, unless
the user asked for fail-closed (`--on-error deny`). A backend that fails
follows the brake's failure policy (`DISTBRAKE_ON_BACKEND_ERROR`), within the
timeout. Neither the arguments nor any other field's value ever reaches stderr.

Two paths, one rule model. With no `--url`/`DISTBRAKE_URL` and no other
`DISTBRAKE_*` variable, the light path counts in the user's `StreakFile` with
the default rules (and `--max-repeats`), importing only the standard library,
`identity`, `model` and `errors`: start-up is paid on every tool call. Any
other configuration takes the full path: the library's own `FileBrake` (no URL)
or `DistributedBrake` (Redis), with settings resolved by `settings.py`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import orjson

from . import Answer, Decision, HookEvent, HookInputError, host, shown

if TYPE_CHECKING:
    from . import Host

__all__ = [
    "MAX_EVENT_BYTES", "HookOptions", "decide", "handle", "open_brake", "read_payload", "refused", "run_hook",
    "self_test", "warned",
]

MAX_EVENT_BYTES = 4 * 1024 * 1024  # a bigger event (a huge tool_input) is allowed unchecked, and said
OnError = Literal["allow", "deny"]
Scope = Literal["session", "run"]
# Variables that change what a check does: with any of them set, the hook takes the full path.
_LIGHT_IGNORES = frozenset({"DISTBRAKE_SERVE_TOKEN"})


class HookOptions(NamedTuple):
    """`distbrake hook` options (None: not given)."""

    url: str | None = None
    timeout: float | None = None
    key_prefix: str | None = None
    max_repeats: int | None = None
    on_error: OnError = "allow"
    scope: Scope = "session"
    store: str | None = None  # the streak file (default: the user's cache directory)


def light(options: HookOptions, environ: Mapping[str, str]) -> bool:
    """Whether the light path applies: no URL, and no DISTBRAKE_* (or the Node plugin's) variable set."""
    if options.url is not None:
        return False
    return not any(
        (name.startswith("DISTBRAKE_") and name not in _LIGHT_IGNORES) or name == "DSH_LOOP_BRAKE_MAX_REPEATS"
        for name in environ
    )


def run_hook(
    name: str, data: bytes, options: HookOptions | None = None, environ: Mapping[str, str] | None = None
) -> Answer:
    """Answer one hook event of host `name` (raw bytes as the host sent them); never raises for bad input."""
    env = os.environ if environ is None else environ
    options = HookOptions() if options is None else options
    agent = host(name)
    try:
        payload = read_payload(data)
        event = agent.parse(payload)
    except HookInputError as error:
        return _unreadable(agent, str(error), options)
    if event is None:
        return _unread(agent, not_handled(payload))
    return handle(agent, event, options, env)


def read_payload(data: bytes, limit: int = MAX_EVENT_BYTES) -> dict[str, Any]:
    """A JSON object of at most `limit` bytes, else HookInputError (saying why, never quoting the input)."""
    if len(data) > limit:
        raise HookInputError(f"the event is larger than {limit // (1024 * 1024)} MiB")
    try:
        payload = orjson.loads(data)  # already loaded by `identity`; the json module is not (start-up time)
    except orjson.JSONDecodeError:
        import json

        try:  # what orjson refuses and JSON allows (an integer beyond 64 bits)
            payload = json.loads(data)
        except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError, too deeply nested
            raise HookInputError("the event is not JSON") from None
    if not isinstance(payload, dict):
        raise HookInputError(f"the event is a JSON {type(payload).__name__}, not an object")
    return payload


def not_handled(payload: Mapping[str, Any]) -> str:
    """Why an event is not checked: its name (bounded and escaped)."""
    return f"the event {shown(payload.get('hook_event_name'), 40)!r} is not a tool event this hook handles"


def handle(agent: Host, event: HookEvent, options: HookOptions, environ: Mapping[str, str]) -> Answer:
    """Count a read event (pre: check; post: observe) and answer it."""
    session = event.run if options.scope == "run" and event.run else event.session
    try:
        count = _light if light(options, environ) else _full
        decision = count(event, session, options)
    except Exception as error:  # the brake itself failed (a bug, a file it cannot open): never break the agent
        from ..errors import DistbrakeError

        what = str(error) if isinstance(error, DistbrakeError) else type(error).__name__
        line = f"distbrake hook: the check failed ({shown(what, 200)})"
        if options.on_error == "deny" and event.phase == "pre":
            return _with_stderr(agent.answer(event.event, Decision("deny", f"{line}; denied (--on-error deny)")), line)
        return _with_stderr(agent.allow(event.event), f"{line}; allowed")
    if decision is None:
        return agent.allow(event.event)
    return agent.answer(event.event, decision)


def _light(event: HookEvent, session: str, options: HookOptions) -> Decision | None:
    """The light path: the default rules in the user's streak file (see the module's doc)."""
    from ..identity import call_hash
    from ..model import ALLOWED, Rules, judge
    from ..streakfile import DEFAULT_MAX_REPEATS, DEFAULT_PREFIX, DEFAULT_TIMEOUT, StreakFile

    if event.phase == "post":
        return None  # the default rules observe no results (progress-aware tools are per-tool rules)
    rules = Rules(options.max_repeats or DEFAULT_MAX_REPEATS)
    digest = call_hash(event.tool, event.args)
    store = StreakFile(options.store, timeout=options.timeout or DEFAULT_TIMEOUT,
                       prefix=options.key_prefix or DEFAULT_PREFIX)
    try:
        counted = store.step(session, digest, event.call_id, event.tool, rules)
    finally:
        store.close()
    if counted.halt is not None:  # an operator blocked the session (the default rules halt nothing)
        from ..core import halt_error

        return Decision("halt", str(halt_error(counted.halt, event.tool, session, rules.max_repeats, "in-process")))
    count = counted.count
    if judge(count, rules) is ALLOWED:
        return None
    from ..errors import LoopBrakeError  # the error every brake raises for this count: its text is the reason

    return Decision("deny", str(LoopBrakeError(event.tool, count, rules.max_repeats, digest, session)))


def _full(event: HookEvent, session: str, options: HookOptions) -> Decision | None:
    """The full path: the library's brake for the configuration (a file, or Redis)."""
    brake = open_brake(options)
    try:
        if event.phase == "pre":
            brake.switch.read_now()  # one process, one check: the kill switch is read with it, not in the background
        return decide(brake, event, session)
    finally:
        brake.close()


def decide(brake: Any, event: HookEvent, session: str) -> Decision | None:
    """Check (pre) or observe (post) `event` with `brake` (any sync brake); None: allowed, nothing to say."""
    from ..core import PreparedCall, Verdict
    from ..errors import BrakeUnavailableError, LoopBrakeError

    if event.phase == "post":
        call = brake.prepare(event.tool, event.args, session, event.call_id)
        observed = isinstance(call, PreparedCall) and (call.rules.progress or call.rules.max_failures is not None)
        if observed and event.call_id is not None:
            token = Verdict(call.rules.max_repeats, call.rules.max_repeats, call.hash_prefix, session,
                            event.tool, observe_token=call)
            if event.failed:  # a failed tool (Claude Code's PostToolUseFailure): a failure for max_failures
                brake.observe(token, event.result, failed=True)
            else:
                brake.observe(token, event.result)
        return None
    try:
        verdict = brake.check(event.tool, event.args, session_id=session, call_id=event.call_id)
    except (LoopBrakeError, BrakeUnavailableError) as error:
        return refused(error)
    return warned(verdict)


def refused(error: Exception) -> Decision:
    """The decision for a check that raised: a LoopBrakeError (a halt: kind "halt"), or BrakeUnavailableError
    (the failure policy is "closed")."""
    return Decision("halt" if getattr(error, "kind", None) == "halt" else "deny", str(error))


def warned(verdict: Any) -> Decision | None:
    """The decision for an allowed verdict: a warning when it carries one, else nothing to say."""
    return Decision("warn", verdict.warning) if verdict.warning else None


def open_brake(options: HookOptions) -> Any:
    """The brake of the hook's configuration: options > DISTBRAKE_* > defaults; no URL: the user's streak file."""
    from ..settings import load_settings

    settings = load_settings(
        url=options.url, timeout_seconds=options.timeout, key_prefix=options.key_prefix,
        max_repeats=options.max_repeats,
    )
    if settings.url is None:
        from ..filebrake import FileBrake

        return FileBrake(options.store, settings=settings)
    from ..redis.sync import DistributedBrake

    return DistributedBrake.from_url(settings=settings, otel=False)


def _unreadable(agent: Host, reason: str, options: HookOptions) -> Answer:
    """Input the hook cannot read: allowed (or denied with --on-error deny), one line on stderr."""
    if options.on_error == "deny":
        line = f"distbrake hook: {reason}; denied (--on-error deny)"
        pre = agent.PRE[0]
        return _with_stderr(agent.answer(pre, Decision("deny", line)), line)
    return _unread(agent, reason)


def _unread(agent: Host, reason: str) -> Answer:
    pre = agent.PRE[0]
    return _with_stderr(agent.allow(pre), f"distbrake hook: {reason}; allowed")


def _with_stderr(answer: Answer, line: str) -> Answer:
    return answer._replace(stderr=line + "\n")


def self_test(name: str, options: HookOptions) -> tuple[bool, str]:
    """Run the host's documented example event through the hook until it is denied, on the configured backend.

    A private session id, cleared afterwards. Returns (passed, one line).
    """
    import uuid

    from .examples import pre_event

    limit = options.max_repeats
    if limit is None:
        limit = open_limit(options)
    session = f"distbrake-self-test-{uuid.uuid4().hex}"
    agent = host(name)
    answers = []
    try:
        for index in range(limit):
            payload = pre_event(name, session, f"self-test-{index}")
            answers.append(run_hook(name, orjson.dumps(payload), options._replace(scope="session")))
    finally:
        with_brake_clear(options, session)
    denied = agent.answer(agent.PRE[0], Decision("deny", "x"))
    allowed = agent.allow(agent.PRE[0])
    last = answers[-1]
    ok_allowed = all(a.stdout == allowed.stdout and a.code == allowed.code for a in answers[:-1])
    ok_denied = last.code == denied.code and _denies(name, last)
    if ok_allowed and ok_denied:
        return True, f"hook {name}: ok ({limit - 1} identical calls allowed, call {limit} denied in {name}'s shape)"
    return False, f"hook {name}: FAILED (expected {limit - 1} allowed then a denial; stderr: {shown(last.stderr, 200)})"


def _denies(name: str, answer: Answer) -> bool:
    if name == "gemini" and answer.code == 2:
        return True
    try:
        reply = orjson.loads(answer.stdout)
    except orjson.JSONDecodeError:
        return False
    specific = reply.get("hookSpecificOutput") or {}
    return "deny" in (specific.get("permissionDecision"), reply.get("decision"), reply.get("permission"))


def open_limit(options: HookOptions) -> int:
    """The limit the hook's configuration counts with."""
    from ..streakfile import DEFAULT_MAX_REPEATS

    if light(options, os.environ):
        return DEFAULT_MAX_REPEATS
    brake = open_brake(options)
    try:
        return int(brake.max_repeats)
    finally:
        brake.close()


def with_brake_clear(options: HookOptions, session: str) -> None:
    """Forget `session` on the hook's backend."""
    if light(options, os.environ):
        from ..streakfile import DEFAULT_PREFIX, StreakFile

        store = StreakFile(options.store, prefix=options.key_prefix or DEFAULT_PREFIX)
        try:
            store.clear(session)
        finally:
            store.close()
        return
    brake = open_brake(options)
    try:
        brake.clear(session)
    finally:
        brake.close()

