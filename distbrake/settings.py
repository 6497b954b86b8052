"""Configuration: one pydantic-settings model, read from `DISTBRAKE_*` variables.

Precedence for every field: the value passed in code (or the settings object
given) > the `DISTBRAKE_<FIELD>` environment variable > the default. For
`max_repeats` only, the Node plugin's `DSH_LOOP_BRAKE_MAX_REPEATS` is read
after `DISTBRAKE_MAX_REPEATS`. A variable is read only when no value was given
in code; an invalid one is an error naming the variable, never ignored.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from .errors import ConfigurationError, InvalidMaxRepeatsError
from .urls import redact_url

__all__ = [
    "DEFAULT_MAX_REPEATS",
    "BrakeSettings",
    "FailurePolicy",
    "load_settings",
    "normalize_max_repeats",
    "resolve_max_repeats",
    "value_sources",
]

DEFAULT_MAX_REPEATS = 3
ENV_PREFIX = "DISTBRAKE_"
MAX_REPEATS_ENV = "DISTBRAKE_MAX_REPEATS"
NODE_MAX_REPEATS_ENV = "DSH_LOOP_BRAKE_MAX_REPEATS"

FailurePolicy = Literal["open", "closed", "local"]


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


def resolve_max_repeats(
    configured: object = None, *, environ: Mapping[str, str] | None = None
) -> int:
    """The effective limit: `configured` > DISTBRAKE_MAX_REPEATS > DSH_LOOP_BRAKE_MAX_REPEATS > 3.

    The environment is read only when `configured` is None.
    """
    if configured is not None:
        return normalize_max_repeats(configured, "argument max_repeats")
    env = os.environ if environ is None else environ
    for name in (MAX_REPEATS_ENV, NODE_MAX_REPEATS_ENV):
        if name in env:
            return normalize_max_repeats(env[name], f"environment variable {name}")
    return DEFAULT_MAX_REPEATS


def _node_fallback() -> int:
    raw = os.environ.get(NODE_MAX_REPEATS_ENV)
    if raw is None:
        return DEFAULT_MAX_REPEATS
    return normalize_max_repeats(raw, f"environment variable {NODE_MAX_REPEATS_ENV}")


class BrakeSettings(BaseSettings):
    """Every setting of a brake. Unset fields come from `DISTBRAKE_*`, then defaults."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", frozen=True, validate_default=False
    )

    max_repeats: int = Field(
        default_factory=_node_fallback,
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
        default=None, description="Backend URL; None means memory://.",
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
        default_factory=frozenset, description="Tools the brake never checks.",
    )

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

    @field_validator("key_prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        # A backslash escapes the next character in a SCAN pattern: sessions() would find nothing.
        if any(c in value for c in "{}*?[]\\ \t\r\n") or not value.isprintable():
            raise ValueError("must be printable, without spaces, braces, backslashes or glob characters")
        return value

    @model_validator(mode="after")
    def _check_tools(self) -> BrakeSettings:
        both = sorted(self.exempt_tools & self.tool_max_repeats.keys())
        if both:
            raise ValueError(f"tools both exempt and given a limit: {both}")
        return self

    def limit_for(self, tool: str) -> int | None:
        """The limit for `tool`, or None when the tool is exempt."""
        if tool in self.exempt_tools:
            return None
        return self.tool_max_repeats.get(tool, self.max_repeats)

    def __repr_args__(self) -> Any:
        for name, value in super().__repr_args__():
            yield name, (redact_url(value) if name == "url" and value else value)


def _env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def value_sources(given: Mapping[str, object]) -> dict[str, str]:
    """Where each field's effective value comes from: argument, variable or default."""
    sources: dict[str, str] = {}
    for field in BrakeSettings.model_fields:
        if given.get(field) is not None:
            sources[field] = "argument"
        elif _env_name(field) in os.environ:
            sources[field] = f"variable {_env_name(field)}"
        elif field == "max_repeats" and NODE_MAX_REPEATS_ENV in os.environ:
            sources[field] = f"variable {NODE_MAX_REPEATS_ENV}"
        else:
            sources[field] = "default"
    return sources


def _raise_configuration_error(error: ValidationError, given: Mapping[str, object]) -> None:
    problems = []
    limit_error = False
    for item in error.errors(include_input=False, include_url=False):
        field = str(item["loc"][0]) if item["loc"] else "settings"
        source = f"argument {field}" if field in given else f"environment variable {_env_name(field)}"
        if field == "settings":
            source = "the settings as a whole"
        message = str(item["msg"]).removeprefix("Value error, ")
        if field == "max_repeats":
            limit_error = True
            problems.append(message.replace("from max_repeats", f"from {source}"))
        elif field == "tool_max_repeats" and message.startswith("invalid max_repeats"):
            limit_error = True
            problems.append(f"{message} (in {source})")
        else:
            problems.append(f"invalid {field} from {source}: {message}")
    text = "; ".join(problems)
    raise (InvalidMaxRepeatsError(text) if limit_error else ConfigurationError(text)) from None


def load_settings(settings: BrakeSettings | None = None, **given: object) -> BrakeSettings:
    """Build the effective settings: `given` (non-None) over `settings` or the environment.

    Raises `InvalidMaxRepeatsError` or `ConfigurationError` naming the source
    of the bad value; never echoes a URL's password.
    """
    overrides = {k: v for k, v in given.items() if v is not None}
    unknown = sorted(set(overrides) - set(BrakeSettings.model_fields))
    if unknown:
        raise TypeError(f"unknown setting(s): {', '.join(unknown)}")
    try:
        if settings is not None:
            if not overrides:
                return settings
            return BrakeSettings.model_validate({**settings.model_dump(), **overrides})
        return BrakeSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as error:
        _raise_configuration_error(error, overrides)
        raise  # pragma: no cover - _raise_configuration_error always raises
    except SettingsError as error:
        match = re.search(r'field "(\w+)"', str(error))
        name = _env_name(match.group(1)) if match else "a DISTBRAKE_* variable"
        raise ConfigurationError(
            f"invalid environment variable {name}: not valid JSON for this setting"
        ) from None
