"""The brake core: what every brake shares and that does no I/O (prepare a call, judge a count).

A check is three steps. `prepare` resolves the session and call id, applies
the per-tool policy and hashes the arguments (which never leave this step:
only the digest goes on). A backend turns the digest into a count (the
in-process record map, or one Lua step in Redis). `judge` turns the count into a
`Verdict`, or raises `LoopBrakeError`. The in-process, sync Redis and asyncio
Redis brakes differ only in the middle step.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from .errors import BrakeUnavailableError, LoopBrakeError, LoopBrakeHalt, MissingSessionError
from .identity import call_hash, hash_prefix
from .killswitch import KillSwitch
from .model import ALLOWED, WARNED, Counted, Cycle, Halt, HaltKind, Rules, judge
from .rules import strip_fields, warning_text
from .session import DEFAULT_SESSION, find_session, resolve_call_id
from .settings import BrakeSettings

if TYPE_CHECKING:
    from .telemetry.watch import Watch

__all__ = [
    "DECIDED_BY", "BrakeCore", "Counted", "Cycle", "DecidedBy", "PreparedCall", "SessionState", "SyncCheck", "Verdict",
    "halt_error",
]

# Who decided a verdict (`Verdict.decided_by`), one word each:
#   in-process  LoopBrake, the in-process brake
#   redis       the Lua step in Redis (any Redis-protocol backend, memory:// included)
#   fallback    the `local` failure policy's in-process streaks, while Redis is down
#   fail-open   the `open` failure policy: allowed, nothing counted, while Redis is down
#   exempt      the tool is exempt: nothing was counted
DecidedBy = Literal["in-process", "redis", "fallback", "fail-open", "exempt"]
DECIDED_BY: tuple[DecidedBy, ...] = ("in-process", "redis", "fallback", "fail-open", "exempt")

# A session's state (`SessionState.state`) for each judgement of its last check.
STATE_OF = {"allowed": "ok", "warned": "warned", "denied": "denying", "would_deny": "would_deny"}

logger = logging.getLogger("distbrake")

new_tuple = tuple.__new__  # a NamedTuple given every field in order, built without its keyword handling


def printable(text: str) -> str:
    """`text` as a log line may show it: control characters (a terminal's escape sequences) escaped."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


class Verdict(NamedTuple):
    """The answer to an allowed check (a denied one raises `LoopBrakeError`)."""

    count: int  # type: ignore[assignment]  # the field shadows tuple.count on purpose
    max_repeats: int
    hash_prefix: str
    session_id: str
    tool_name: str
    allowed: bool = True
    replayed: bool = False  # the call id was seen: counted once, same verdict
    exempt: bool = False  # the tool is exempt: nothing was counted
    decided_by: DecidedBy = "in-process"  # see DECIDED_BY
    warning: str | None = None  # warn_at reached: when denial begins (never the arguments)
    would_deny: bool = False  # shadow mode (enforce=False): the rules would have denied this call
    observe_token: object = None  # progress-aware tools: what `brake.observe(verdict, result)` needs (opaque)

    @property
    def denied(self) -> bool:
        return not self.allowed


@dataclass(frozen=True, slots=True)
class SessionState:
    """A session's record as `inspect` and `sessions` show it (never the arguments)."""

    session_id: str
    tool_name: str
    hash_prefix: str
    count: int
    ttl_seconds: float | None
    updated_at: float  # Unix time of the last check, from the backend's clock
    # What the last check was judged by (None: a record written before the record kept it)
    max_repeats: int | None = None
    warn_at: int | None = None
    enforcing: bool | None = None
    halt: Halt | None = None  # the session is halted (a rule, or an operator's block): why

    @property
    def halted(self) -> bool:
        """Every check of the session is refused until the halt is lifted or the record expires."""
        return self.halt is not None

    @property
    def rules(self) -> Rules | None:
        """The rules the last check was judged by (None: a record written before the record kept them)."""
        if self.max_repeats is None:
            return None
        return Rules(self.max_repeats, self.warn_at, self.enforcing is not False)

    @property
    def state(self) -> str:
        """`ok`, `warned`, `denying` or `would_deny` by the record's own rules (`unknown` without them).

        The last check's judgement (the model's `judge`; a cycle is not kept in the state).
        """
        rules = self.rules
        return "unknown" if rules is None else STATE_OF[judge(self.count, rules).outcome]


class PreparedCall(NamedTuple):
    """A call reduced to what the backends may see: no arguments, only their digest, and its tool's rules."""

    tool_name: str
    digest: str
    session_id: str
    call_id: str | None
    rules: Rules

    @property
    def hash_prefix(self) -> str:
        return hash_prefix(self.digest)

    @property
    def max_repeats(self) -> int:
        return self.rules.max_repeats

    @property
    def warn_at(self) -> int | None:
        return self.rules.warn_at

    @property
    def enforce(self) -> bool:
        return self.rules.enforce

    @property
    def progress(self) -> bool:
        return self.rules.progress


class BrakeCore:
    """Configuration plus the non-I/O halves of `check`, shared by every brake."""

    settings: BrakeSettings
    watch: Watch | None = None  # what reports each check (telemetry/build.py); None: nothing does
    # The fleet's kill switch as this brake knows it (killswitch.py): a check whose `switch.pending` is not None
    # takes its slow path, `switch.consult` (which raises LoopBrakeHalt while the switch is set)
    switch: KillSwitch = KillSwitch("")

    def __init__(self, settings: BrakeSettings) -> None:
        self.settings = settings
        self._tool_rules, self._default_rules = settings.rules_table()
        self._default_said = False  # the WARNING that checks share the session "default" (once per brake)

    @property
    def max_repeats(self) -> int:
        return self.settings.max_repeats

    def prepare(
        self, tool: str, args: Any, session_id: object = None, call_id: object = None, context: object = None,
    ) -> PreparedCall | Verdict:
        """Resolve session, call id and the tool's rules, and hash; an exempt tool gives its Verdict."""
        if type(session_id) is str:
            session = session_id
        else:
            found = find_session(session_id, context)
            session = self._no_session(tool) if found is None else found
        rules = self._tool_rules.get(tool, self._default_rules)
        if rules is None:
            return Verdict(0, 0, "", session, tool, exempt=True, decided_by="exempt")
        if rules.ignore_fields:
            args = strip_fields(args, rules.ignore_fields)
        digest = call_hash(tool, args)  # also refuses a tool name that is not a str
        found = None if call_id is None and context is None else resolve_call_id(call_id, context)
        if found is None and (rules.progress or rules.max_failures is not None):
            found = uuid.uuid4().hex  # the observation of the result must name this very call
        return new_tuple(PreparedCall, (tool, digest, session, found, rules))

    def _no_session(self, tool: str) -> str:
        """A check that names no session: `"default"` (said once per brake), or refused with require_session."""
        if self.settings.require_session:
            raise MissingSessionError(
                f'loop brake: a check of tool "{printable(tool[:64])}" names no session (require_session is '
                "on): pass session_id=..., bind_session(...) around the run, or a context with a session_id"
            )
        if not self._default_said:
            self._default_said = True
            logger.warning(
                'distbrake: a check names no session, so it counts in the session "default", shared with every '
                "other such check of the fleet (different agents can deny each other); pass session_id=..., "
                "bind_session(...), or set require_session=True to make this an error"
            )
        return DEFAULT_SESSION

    def judge(self, call: PreparedCall, counted: Counted, decided_by: DecidedBy) -> Verdict:
        """The verdict of a counted call by the model's `judge`; raises `LoopBrakeError` on a denial that
        enforces (`LoopBrakeHalt` when the session is, or becomes, halted)."""
        rules = call.rules
        count, replayed, cycle, facts, halt = counted
        if halt is not None:
            raise halt_error(halt, call.tool_name, call.session_id, rules.max_repeats, decided_by)
        judgement = judge(count, rules, cycle is not None, facts, cycle is not None and cycle.halts)
        token = call if rules.progress or rules.max_failures is not None else None
        if judgement is ALLOWED:  # the common case, every field in order: (count, max_repeats, hash_prefix,
            # session_id, tool_name, allowed, replayed, exempt, decided_by, warning, would_deny, observe_token)
            return new_tuple(Verdict, (
                count, rules.max_repeats, call.digest[:12], call.session_id, call.tool_name, True, replayed,
                False, decided_by, None, False, token,
            ))
        prefix = call.digest[:12]
        if judgement is WARNED:
            return Verdict(
                count, rules.max_repeats, prefix, call.session_id, call.tool_name, replayed=replayed,
                decided_by=decided_by, warning=warning_text(call.tool_name, count, rules.max_repeats, prefix),
                observe_token=token,
            )
        enforced = judgement.outcome == "denied"
        rule = judgement.rule
        logger.warning(
            'loop brake %s tool "%s" in session %r (call %s, count %d, limit %d, %s)',
            "denied" if enforced else "would deny (shadow mode, not enforced)",
            printable(call.tool_name[:64]), call.session_id[:128], prefix, count, rules.max_repeats,
            f"cycle of {cycle.period} calls" if rule == "cycle" and cycle is not None else rule,
        )
        if not enforced:
            return Verdict(
                count, rules.max_repeats, prefix, call.session_id, call.tool_name,
                replayed=replayed, decided_by=decided_by, would_deny=True, observe_token=token,
            )
        if rule == "halt":
            by_count = cycle is None or (rules.halt_at is not None and count >= rules.halt_at)
            kind: HaltKind = "repeat" if by_count else "cycle"
            limit = (rules.halt_at or 0) if by_count else self.settings.cycle_halt_repeats or 0
            halted = Halt(kind, time.time(), call.tool_name, count, limit, prefix)
            raise halt_error(halted, call.tool_name, call.session_id, rules.max_repeats, decided_by)
        if rule == "cycle" and cycle is not None:
            raise LoopBrakeError(
                call.tool_name, count, rules.max_repeats, prefix, call.session_id,
                kind="cycle", period=cycle.period, cycle_repeats=cycle.repeats,
                cycle_hash_prefixes=cycle.hash_prefixes, cycle_tools=cycle.tools, decided_by=decided_by,
            )
        if rule == "once":
            raise LoopBrakeError(
                call.tool_name, count, rules.max_repeats, prefix, call.session_id, kind="once",
                decided_by=decided_by, limit=1, done_at=float(facts.once_since),
            )
        if rule == "failures":
            raise LoopBrakeError(
                call.tool_name, facts.failures, rules.max_repeats, prefix, call.session_id, kind="failures",
                decided_by=decided_by, limit=rules.max_failures,
            )
        if rule == "cap":
            raise LoopBrakeError(
                call.tool_name, facts.calls, rules.max_repeats, prefix, call.session_id, kind="cap",
                decided_by=decided_by, limit=rules.max_calls,
            )
        raise LoopBrakeError(
            call.tool_name, count, rules.max_repeats, prefix, call.session_id, decided_by=decided_by
        )


def halt_error(halt: Halt, tool_name: str, session_id: str, max_repeats: int, decided_by: str | None) -> LoopBrakeHalt:
    """The error of a check of a halted session (`halt`), or of the call that halted it."""
    return LoopBrakeHalt(
        halt.tool_name or tool_name, halt.count, max_repeats, halt.hash_prefix, session_id,
        decided_by=decided_by, limit=halt.limit or None, halt_rule=halt.kind, since=halt.since, who=halt.who,
        reason=halt.reason,
    )


class SyncCheck(BrakeCore):
    """`check` for the sync brakes (in-process and sync Redis): prepare, then `decide`."""

    def check(
        self, tool: str, args: Any, *, session_id: object = None, call_id: object = None, context: object = None,
    ) -> Verdict:
        """Count this call; raise `LoopBrakeError` if it is the Nth identical in a row."""
        watch = self.watch
        start = 0.0 if watch is None else watch.start()
        try:
            call = self.prepare(tool, args, session_id, call_id, context)
            if self.switch.pending is not None:
                self.switch.consult(call)
            verdict = call if isinstance(call, Verdict) else self.decide(call)
        except (LoopBrakeError, BrakeUnavailableError) as error:
            if watch is not None:
                watch.raised(error, start, call_id, context)
            raise
        if watch is not None:
            watch.done(verdict, start, call_id, context)
        return verdict

    def decide(self, call: PreparedCall) -> Verdict:
        """The verdict of a prepared call: count it in this brake's backend, then judge."""
        raise NotImplementedError
