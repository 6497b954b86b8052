"""Configuration: one pydantic-settings model, the only place defaults and precedence live.

Precedence for every field: the value passed in code (or the settings object
given) > the `DISTBRAKE_<FIELD>` environment variable > the default. For
`max_repeats` only, the Node plugin's `DSH_LOOP_BRAKE_MAX_REPEATS` is read
after `DISTBRAKE_MAX_REPEATS` (the field's `AliasChoices`). A variable is read
only when no value was given in code; an invalid one is an error naming the
variable, never ignored. The backend URL's default is `DEFAULT_URL`, and the
URL is parsed once, into `BrakeSettings.parsed_url`.
"""

from __future__ import annotations

import difflib
import os
import re
import warnings
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import AliasChoices, Field, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from .errors import ConfigurationError, InvalidMaxRepeatsError
from .model import CycleRule, Rules
from .rules import Count, ToolRules, WarnAt, count_in, normalize_max_repeats
from .telemetry.options import TelemetryOptions
from .urls import ParsedURL, parse_url, redact_url

__all__ = [
    "DEFAULT_MAX_REPEATS",
    "DEFAULT_URL",
    "BrakeOptions",
    "BrakeSettings",
    "FailurePolicy",
    "load_settings",
    "normalize_max_repeats",
    "resolve_max_repeats",
    "value_sources",
]

DEFAULT_MAX_REPEATS = 3
DEFAULT_URL = "memory://"  # the embedded backend: what a brake uses when no URL is given
ENV_PREFIX = "DISTBRAKE_"
# The variables max_repeats is read from, first found wins (the Node plugin's last).
MAX_REPEATS_VARIABLES = ("DISTBRAKE_MAX_REPEATS", "DSH_LOOP_BRAKE_MAX_REPEATS")

MAX_CYCLE_PERIOD = 4  # longest cycle the opt-in rule looks for
MAX_CYCLE_REPEATS = 10

FailurePolicy = Literal["open", "closed", "local"]


class BrakeOptions(TelemetryOptions, total=False):
    """The keyword options of every brake and of `from_url`: `BrakeSettings` fields (None = not given),
    plus the observability options of `TelemetryOptions` (objects and callables, never from the environment)."""

    max_repeats: int | float | str | None
    ttl_seconds: float | None
    key_prefix: str | None
    on_backend_error: FailurePolicy | None
    timeout_seconds: float | None
    retry_after_seconds: float | None
    tool_max_repeats: Mapping[str, int] | None
    exempt_tools: Iterable[str] | None
    warn_at: int | None
    enforce: bool | None
    tools: Mapping[str, ToolRules | Mapping[str, Any]] | None
    max_cycle_period: int | None
    cycle_repeats: int | None
    require_session: bool | None
    halt_at: int | None
    max_failures: int | None
    cycle_halt_repeats: int | None


def resolve_max_repeats(
    configured: object = None, *, environ: Mapping[str, str] | None = None
) -> int:
    """The effective limit: `configured` > DISTBRAKE_MAX_REPEATS > DSH_LOOP_BRAKE_MAX_REPEATS > 3.

    The environment is read only when `configured` is None.
    """
    if configured is not None:
        return normalize_max_repeats(configured, "argument max_repeats")
    env = os.environ if environ is None else environ
    for name in MAX_REPEATS_VARIABLES:
        if name in env:
            return normalize_max_repeats(env[name], f"environment variable {name}")
    return DEFAULT_MAX_REPEATS


class BrakeSettings(BaseSettings):
    """Every setting of a brake. Unset fields come from `DISTBRAKE_*`, then defaults."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", frozen=True, validate_default=False,
        populate_by_name=True,
    )

    def __init__(self, **values: Any) -> None:
        """Raises `ConfigurationError` (or `InvalidMaxRepeatsError`) naming the source of a bad value.

        Never pydantic's own error: it quotes inputs, the backend URL (and its password) among them.
        """
        warn_misspelled_variables(os.environ)
        problem = None
        try:
            super().__init__(**values)
        except (ValidationError, SettingsError) as error:
            problem = configuration_error(error, values)
        if problem is not None:
            raise problem  # outside the handler: pydantic's error is not even its __context__

    max_repeats: int = Field(
        default=DEFAULT_MAX_REPEATS, validation_alias=AliasChoices(*MAX_REPEATS_VARIABLES),
        description="Deny the Nth identical call in a row (>= 1).",
    )
    ttl_seconds: float = Field(
        default=3600.0, gt=0, le=10 * 365 * 86400,
        description="Idle time after which a session's streak is forgotten.",
    )
    key_prefix: str = Field(
        default="distbrake", min_length=1, max_length=64,
        description="Prefix of every Redis key the brake writes.",
    )
    url: str | None = Field(
        default=None, description=f"Backend URL; None means {DEFAULT_URL}.",
    )
    on_backend_error: FailurePolicy = Field(
        default="local", description="What a check does when Redis fails.",
    )
    timeout_seconds: float = Field(
        default=0.5, gt=0, le=60, description="Longest a check waits for Redis.",
    )
    retry_after_seconds: float = Field(
        default=1.0, gt=0, le=300,
        description="First pause before Redis is probed again after a failure (doubles, capped at 30x).",
    )
    tool_max_repeats: dict[str, int] = Field(
        default_factory=dict, description="Per-tool limits overriding max_repeats.",
    )
    exempt_tools: frozenset[str] = Field(
        default_factory=frozenset, description="Tools the brake never checks (an alias of tools[...].exempt).",
    )
    warn_at: WarnAt = Field(
        default=None, description="From this count on, an allowed call carries a warning (1 <= warn_at < max_repeats).",
    )
    enforce: bool = Field(
        default=True, description="False: shadow mode, a call the rules would deny runs and is reported.",
    )
    tools: dict[str, ToolRules] = Field(
        default_factory=dict,
        description="Per-tool rules: max_repeats, warn_at, enforce, ignore_fields, progress, exempt.",
    )

    require_session: bool = Field(
        default=False,
        description='A check naming no session raises MissingSessionError instead of sharing "default".',
    )

    max_cycle_period: int = Field(
        default=0,
        description="Deny a cycle of 2..N calls (A,B,A,B,...) repeated cycle_repeats times; 0 = off, else 2..4.",
    )
    cycle_repeats: int = Field(
        default=3, description="How many full repetitions of a cycle deny its last call (2..10).",
    )

    halt_at: Count = Field(
        default=None,
        description="A streak reaching this count halts the session: its later checks are refused (> max_repeats).",
    )
    max_failures: Count = Field(
        default=None, description="Refuse a tool after this many failed calls of it in a row in a session.",
    )
    cycle_halt_repeats: Count = Field(
        default=None,
        description="A cycle repeated this many times halts the session (> cycle_repeats, <= 10; needs cycles on).",
    )

    @field_validator("max_cycle_period", mode="before")
    @classmethod
    def _check_cycle_period(cls, value: object) -> int:
        return 0 if value in (0, "0") else count_in(value, "max_cycle_period", 2, MAX_CYCLE_PERIOD, "0 (off) or ")

    @field_validator("cycle_repeats", mode="before")
    @classmethod
    def _check_cycle_repeats(cls, value: object) -> int:
        return count_in(value, "cycle_repeats", 2, MAX_CYCLE_REPEATS)

    @field_validator("max_repeats", mode="before")
    @classmethod
    def _check_max_repeats(cls, value: object) -> int:
        return normalize_max_repeats(value)

    @field_validator("tool_max_repeats", mode="before")
    @classmethod
    def _check_tool_limits(cls, value: object) -> dict[str, int]:
        if not isinstance(value, Mapping):
            raise ValueError("must be a mapping of tool name to an integer >= 1")  # noqa: TRY004
        limits: dict[str, int] = {}
        for tool, limit in value.items():
            if not isinstance(tool, str):
                raise ValueError("tool names must be strings")  # noqa: TRY004
            limits[tool] = normalize_max_repeats(limit, f"tool_max_repeats[{tool!r}]")
        return limits

    @field_validator("tools", mode="before")
    @classmethod
    def _check_tool_names(cls, value: object) -> object:
        if not isinstance(value, Mapping):
            raise ValueError('must be a mapping of tool name to its rules, e.g. {"search": {"warn_at": 2}}')  # noqa: TRY004
        if not all(isinstance(tool, str) for tool in value):
            raise ValueError("tool names must be strings")
        return value

    @field_validator("key_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        # A backslash escapes the next character in a SCAN pattern: sessions() would find nothing.
        if any(c in value for c in "{}*?[]\\ \t\r\n") or not value.isprintable():
            raise ValueError("must be printable, without spaces, braces, backslashes or glob characters")
        return value

    @model_validator(mode="after")
    def _resolve_rules(self) -> BrakeSettings:
        """Each tool's `Rules`, checked as a whole (messages start with the field they concern)."""
        both = sorted(self.exempt_tools & self.tool_max_repeats.keys())
        if both:
            raise ValueError(f"exempt_tools|tools both exempt and given a limit: {both}")
        if self.warn_at is not None and self.warn_at >= self.max_repeats:
            raise ValueError(f"warn_at|{self.warn_at} must be below max_repeats ({self.max_repeats})")
        if self.halt_at is not None and self.halt_at <= self.max_repeats:
            raise ValueError(f"halt_at|{self.halt_at} must be above max_repeats ({self.max_repeats})")
        if self.cycle_halt_repeats is not None:
            if not self.max_cycle_period:
                raise ValueError("cycle_halt_repeats|needs the cycle rule on (max_cycle_period 2..4)")
            if not self.cycle_repeats < self.cycle_halt_repeats <= MAX_CYCLE_REPEATS:
                raise ValueError(
                    f"cycle_halt_repeats|{self.cycle_halt_repeats} must be above cycle_repeats ({self.cycle_repeats})"
                    f" and at most {MAX_CYCLE_REPEATS}"
                )
        rules: dict[str, Rules | None] = {}
        for tool in sorted({*self.tools, *self.tool_max_repeats, *self.exempt_tools}):
            rules[tool] = self._rules_of(tool, self.tools.get(tool, ToolRules()))
        self._rules = rules
        self._default_rules = Rules(
            self.max_repeats, self.warn_at, self.enforce, halt_at=self.halt_at, max_failures=self.max_failures
        )
        return self

    def _rules_of(self, tool: str, given: ToolRules) -> Rules | None:
        where = f"tools|tools[{tool!r}]"
        alias = self.tool_max_repeats.get(tool)
        if alias is not None and given.max_repeats is not None and alias != given.max_repeats:
            raise ValueError(f"{where} max_repeats {given.max_repeats} disagrees with tool_max_repeats ({alias})")
        if given.exempt or tool in self.exempt_tools:
            ladder = (given.halt_at, given.max_failures, given.max_calls)
            if given.max_repeats is not None or alias is not None or given.warn_at is not None:
                raise ValueError(f"{where} is exempt and also given a limit or warn_at")
            if given.once or any(value is not None for value in ladder):
                raise ValueError(f"{where} is exempt and also given halt_at, once, max_failures or max_calls")
            return None
        limit = given.max_repeats or alias or self.max_repeats
        warn_at = given.warn_at
        if warn_at is not None and warn_at >= limit:
            raise ValueError(f"{where}.warn_at {warn_at} must be below the tool's max_repeats ({limit})")
        if warn_at is None and self.warn_at is not None and self.warn_at < limit:
            warn_at = self.warn_at  # inherited only where it is below the tool's own limit
        if given.progress and limit < 3:
            raise ValueError(
                f"{where}.progress needs max_repeats >= 3 (the check comes before the result exists), not {limit}"
            )
        enforce = self.enforce if given.enforce is None else given.enforce
        paths = tuple(tuple(path.split(".")) for path in given.ignore_fields)
        halt_at = given.halt_at if given.halt_at is not None else self.halt_at
        if halt_at is not None and halt_at <= limit:
            source = f"{where}.halt_at {halt_at}" if given.halt_at is not None else f"{where}: halt_at {halt_at}"
            raise ValueError(f"{source} must be above the tool's max_repeats ({limit})")
        max_failures = given.max_failures if given.max_failures is not None else self.max_failures
        return Rules(limit, warn_at, enforce, paths, given.progress, halt_at, given.once, max_failures, given.max_calls)

    _parsed_url: ParsedURL | None = PrivateAttr(default=None)
    _rules: dict[str, Rules | None] = PrivateAttr(default_factory=dict)
    _default_rules: Rules = PrivateAttr(default=Rules(DEFAULT_MAX_REPEATS))

    @property
    def parsed_url(self) -> ParsedURL:
        """The backend URL (`DEFAULT_URL` when none is set), parsed once; raises `InvalidURLError`."""
        if self._parsed_url is None:
            self._parsed_url = parse_url(DEFAULT_URL if self.url is None else self.url)
        return self._parsed_url

    @property
    def shown_url(self) -> str:
        """The backend URL as it may be shown: password redacted, the default filled in."""
        return redact_url(DEFAULT_URL if self.url is None else self.url)

    @property
    def cycle_rule(self) -> CycleRule | None:
        """The cycle rule (None: off)."""
        if not self.max_cycle_period:
            return None
        return CycleRule(self.max_cycle_period, self.cycle_repeats, self.cycle_halt_repeats)

    def rules_for(self, tool: str) -> Rules | None:
        """What a check of `tool` is judged by, or None when the tool is exempt."""
        return self._rules.get(tool, self._default_rules) if self._rules else self._default_rules

    def rules_table(self) -> tuple[dict[str, Rules | None], Rules]:
        """Every named tool's rules (None: exempt) and the rules of any other tool, as plain objects.

        A brake looks a tool up here on every check: a dict lookup, where
        `rules_for` pays for pydantic's private-attribute access.
        """
        return dict(self._rules), self._default_rules

    def limit_for(self, tool: str) -> int | None:
        """The limit for `tool`, or None when the tool is exempt."""
        rules = self.rules_for(tool)
        return None if rules is None else rules.max_repeats

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, (redact_url(value) if name == "url" and value else value)


def _variables(field: str) -> tuple[str, ...]:
    """The environment variables `field` is read from, first found wins (its aliases, else the prefixed name)."""
    alias = BrakeSettings.model_fields[field].validation_alias
    if isinstance(alias, AliasChoices):
        return tuple(str(choice) for choice in alias.choices)
    return (ENV_PREFIX + field.upper(),)


# DISTBRAKE_* variables that are not settings but are read by distbrake's own tools (`serve`, its CI and test
# suite): never taken for a misspelled setting.
OTHER_VARIABLES = frozenset({
    "DISTBRAKE_SERVE_TOKEN", "DISTBRAKE_AGENTS_PREFIX", "DISTBRAKE_CI_VENV", "DISTBRAKE_KEEP_REDIS_DIRS",
})


def warn_misspelled_variables(environ: Mapping[str, str]) -> None:
    """A `RuntimeWarning` for each DISTBRAKE_* variable that is no setting but close to one (a typo is
    otherwise ignored silently); Python shows each once."""
    known = [name for field in BrakeSettings.model_fields for name in _variables(field)]
    for name in environ:
        upper = name.upper()
        if upper.startswith(ENV_PREFIX) and upper not in known and upper not in OTHER_VARIABLES:
            close = difflib.get_close_matches(upper, known, n=1, cutoff=0.8)
            if close:
                warnings.warn(
                    f"distbrake: the environment variable {name[:64]} is not a setting and is ignored; "
                    f"did you mean {close[0]}?", RuntimeWarning, stacklevel=3,
                )


class _ToolsOnly(BaseSettings):
    """`DISTBRAKE_TOOLS` alone, for what needs only the tools' rules (`distbrake hash`)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    tools: dict[str, ToolRules] = Field(default_factory=dict)


def tool_rules_from_environment(tool: str) -> ToolRules:
    """The rules `DISTBRAKE_TOOLS` gives `tool` (none: the defaults), whatever the other variables hold."""
    problem = None
    try:
        return _ToolsOnly().tools.get(tool, ToolRules())
    except (ValidationError, SettingsError) as error:
        problem = configuration_error(error, {})
    raise problem


def _variable_in_use(field: str) -> str:
    """The variable `field` was read from (the first of its variables when none is set)."""
    names = _variables(field)
    return next((name for name in names if name in os.environ), names[0])


def value_sources(given: Mapping[str, object]) -> dict[str, str]:
    """Where each field's effective value comes from: argument, variable or default."""
    sources: dict[str, str] = {}
    for field in BrakeSettings.model_fields:
        if given.get(field) is not None:
            sources[field] = "argument"
        elif any(name in os.environ for name in _variables(field)):
            sources[field] = f"variable {_variable_in_use(field)}"
        else:
            sources[field] = "default"
    return sources


def _field_of(location: str) -> str:
    """The field an error location names (a field name, or one of its variables)."""
    if location in BrakeSettings.model_fields:
        return location
    return next(
        (field for field in BrakeSettings.model_fields if location in _variables(field)), "settings"
    )


def _location_name(field: str, location: tuple[int | str, ...]) -> str:
    """`tools['search'].warn_at` for an error inside one tool's rules, else the field."""
    if field != "tools" or len(location) < 2:
        return field
    return f"tools[{location[1]!r}]" + "".join(f".{part}" for part in location[2:])


def configuration_error(error: ValidationError | SettingsError, given: Mapping[str, object]) -> ConfigurationError:
    """The error a bad setting raises, naming its source (an argument or a variable), never its input."""
    if isinstance(error, SettingsError):
        match = re.search(r'field "(\w+)"', str(error))
        found = match.group(1) if match else None
        name = _variable_in_use(found) if found in BrakeSettings.model_fields else "a DISTBRAKE_* variable"
        return ConfigurationError(f"invalid environment variable {name}: not valid JSON for this setting")
    problems = []
    limit_error = False
    for item in error.errors(include_input=False, include_url=False):
        message = str(item["msg"]).removeprefix("Value error, ")
        field = _field_of(str(item["loc"][0])) if item["loc"] else "settings"
        if field == "settings" and "|" in message.split(" ", 1)[0]:  # a check of the settings as a whole
            field, message = message.split("|", 1)
        if field == "settings":
            source = "the settings as a whole"
        elif field in given:
            source = f"argument {field}"
        else:
            source = f"environment variable {_variable_in_use(field)}"
        name = _location_name(field, item["loc"])
        if field == "max_repeats":
            limit_error = True
            problems.append(message.replace("from max_repeats", f"from {source}"))
        elif field in ("tool_max_repeats", "tools") and message.startswith("invalid max_repeats"):
            limit_error = True
            problems.append(f"{message} (in {name}, {source})")
        else:
            problems.append(f"invalid {name} from {source}: {message}")
    text = "; ".join(problems)
    return InvalidMaxRepeatsError(text) if limit_error else ConfigurationError(text)


def load_settings(settings: BrakeSettings | None = None, **given: object) -> BrakeSettings:
    """Build the effective settings: `given` (non-None) over `settings` or the environment.

    Raises `InvalidMaxRepeatsError` or `ConfigurationError` naming the source
    of the bad value; never echoes a URL's password.
    """
    overrides = {k: v for k, v in given.items() if v is not None}
    unknown = sorted(set(overrides) - set(BrakeSettings.model_fields))
    if unknown:
        raise TypeError(f"unknown setting(s): {', '.join(unknown)}")
    problem = None
    try:
        if settings is not None:
            if not overrides:
                return settings
            # built (not model_validate'd) so that a bad override raises our own error (InvalidMaxRepeatsError
            # for a limit), as BrakeSettings(**overrides) does; every field is given, so no variable is read
            return BrakeSettings(**{**settings.model_dump(), **overrides})
        return BrakeSettings(**overrides)  # raises ConfigurationError itself
    except (ValidationError, SettingsError) as error:
        problem = configuration_error(error, overrides)
    raise problem  # outside the handler: pydantic's error is not even its __context__
