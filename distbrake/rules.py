"""The rules a tool's checks are judged by: its limit, warn-before-deny, shadow mode, declared identity.

All are exact (counts and hashes, never similarity) and off by default, so
the seed's rule is unchanged unless a user opts in:

* `max_repeats`: deny the Nth identical call in a row (per tool or global);
* `warn_at`: from this count on, an allowed call carries `Verdict.warning`,
  a text (no arguments) that says when denial begins;
* `enforce=False` (shadow mode): a call the rules would deny runs; its verdict
  says `would_deny=True` and a warning is logged; counting is unchanged;
* `ignore_fields`: dotted paths removed from the arguments before hashing, so
  a loop whose only change is a nonce or a timestamp is caught;
* `progress` (pollers such as `get_job_status`): identical calls form a streak
  only while their results are identical too: after the body returns, the
  result's digest is observed, and a result that differs from the previous
  identical call's restarts the streak at 1;
* `exempt`: the tool is never checked or counted;
* the ladder (`model.py` states each rule): `halt_at` (a streak reaching it
  halts the session), `once` (an identical call that already ran in the
  session is refused), `max_failures` (refused after that many failed calls
  in a row), `max_calls` (the tool's calls in a session beyond it are refused).

`ToolRules` is what a user writes per tool (`BrakeSettings.tools`);
`model.Rules` is what one tool's checks are judged by once the global
settings are applied (`BrakeSettings.rules_for`), and `model.py` states
what each rule does.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, field_validator

from .errors import InvalidMaxRepeatsError, UnsupportedArgumentsError
from .identity import canonical_json

__all__ = ["ToolRules", "call_failed", "normalize_max_repeats", "result_digest", "strip_fields", "warning_text"]


def normalize_max_repeats(value: object, source: str = "max_repeats") -> int:
    """Return `value` as an int >= 1, or raise `InvalidMaxRepeatsError` naming `source`.

    Accepted: an int >= 1, an integral float (`5.0` is 5), or a string holding
    one (as environment variables do). Refused: bools, 0, negatives, `2.5`,
    NaN, infinities, `None`, anything else.
    """
    number: float | int | None = None
    if isinstance(value, bool) or value is None:
        number = None
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float):
        number = value if math.isfinite(value) and value.is_integer() else None
    elif isinstance(value, str):
        text = value.strip()
        try:
            number = int(text, 10)
        except ValueError:
            try:
                as_float = float(text)
            except ValueError:
                as_float = math.nan
            number = as_float if math.isfinite(as_float) and as_float.is_integer() else None
    if number is None or number < 1:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise InvalidMaxRepeatsError(
            f"invalid max_repeats {shown} from {source}: must be an integer >= 1"
        )
    return int(number)


def positive_int(value: object, what: str) -> int:
    """`value` as an int >= 1 (a string of digits too, as variables give), else `ValueError` naming `what`."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1")
    return value


def count_in(value: object, what: str, low: int, high: int, off: str = "") -> int:
    """`positive_int(value)` within low..high, else `ValueError` naming `what` (`off`: what else it may be)."""
    number = positive_int(value, what)
    if not low <= number <= high:
        raise ValueError(f"{what} must be {off}{low}..{high}, not {number}")
    return number


# warn_at, globally and per tool: an int >= 1, or None (unset).
WarnAt = Annotated[int | None, BeforeValidator(lambda value: None if value is None else positive_int(value, "warn_at"))]
# halt_at, max_failures, max_calls and cycle_halt_repeats: an int 1..MAX_COUNT, or None (off).
MAX_COUNT = 2**32 - 1  # a count the script reads in 4 bytes (ARGV[LADDER])
Count = Annotated[int | None, BeforeValidator(
    lambda value: None if value is None else count_in(value, "it", 1, MAX_COUNT))]


class ToolRules(BaseModel):
    """One tool's rules, as a user writes them (`tools={"search": {"warn_at": 2}}`); unset = the global one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_repeats: int | None = None
    warn_at: WarnAt = None
    enforce: bool | None = None
    ignore_fields: tuple[str, ...] = ()
    progress: bool = False
    exempt: bool = False
    halt_at: Count = None
    once: bool = False
    max_failures: Count = None
    max_calls: Count = None

    @field_validator("max_repeats", mode="before")
    @classmethod
    def _check_limit(cls, value: object) -> int | None:
        return None if value is None else normalize_max_repeats(value, "the tool's max_repeats")

    @field_validator("ignore_fields", mode="before")
    @classmethod
    def _check_paths(cls, value: object) -> tuple[str, ...]:
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ValueError('must be a list of dotted paths, e.g. ["request_id", "meta.nonce"]')  # noqa: TRY004
        for path in value:
            if not isinstance(path, str) or not path or any(not part for part in path.split(".")):
                raise ValueError(f"{path!r} is not a dotted path (names separated by single dots)")
        return tuple(value)


def result_digest(result: object) -> bytes:
    """8 bytes that tell one tool result from another, for progress-aware tools (the result never leaves).

    A result is digested by its canonical JSON when it can be expressed, else
    by its type name and `str()`; a raised exception by its type name.
    """
    if isinstance(result, BaseException):
        text = "raised:" + type(result).__name__
    else:
        try:
            text = "json:" + canonical_json(result)
        except (UnsupportedArgumentsError, TypeError, ValueError):
            text = f"{type(result).__name__}:{result}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:8]


def call_failed(result: object, failed: bool | None) -> bool:
    """Whether an observed call failed (max_failures): `failed` when the caller says (an MCP isError, a
    framework's tool error), else whether `result` is a raised exception."""
    return isinstance(result, BaseException) if failed is None else failed


def strip_fields(args: Any, paths: tuple[tuple[str, ...], ...]) -> Any:
    """`args` without the fields at `paths` (a copy: the caller's arguments are untouched).

    A path that is absent, or that meets something other than an object on
    the way, removes nothing.
    """
    if not paths or not isinstance(args, Mapping):
        return args
    stripped = dict(args)
    for path in paths:
        _remove(stripped, path)
    return stripped


def _remove(node: dict[Any, Any], path: tuple[str, ...]) -> None:
    head, rest = path[0], path[1:]
    if head not in node:
        return
    if not rest:
        del node[head]
        return
    child = node[head]
    if isinstance(child, Mapping):
        node[head] = copied = dict(child)
        _remove(copied, rest)


def warning_text(tool: str, count: int, max_repeats: int, hash_prefix: str) -> str:
    """The warning of an allowed call at `count` (in the error's style, never the arguments)."""
    shown = tool if len(tool) <= 64 else tool[:64] + "\u2026"
    if count + 1 >= max_repeats:
        when = "the next identical call will be denied"
    else:
        when = f"identical calls will be denied from the {_ordinal(max_repeats)} in a row"
    return (
        f'loop brake: tool "{shown}" called {count} times in a row with identical arguments '
        f"(call {hash_prefix[:12]}\u2026, limit {max_repeats}); {when}. Change the arguments, "
        "call a different tool, or stop."
    )


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
