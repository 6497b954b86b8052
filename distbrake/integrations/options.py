"""What every framework adapter checks when it is built: a usable brake and a known `on_deny`."""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ConfigurationError

__all__ = ["check_adapter_options"]


def check_adapter_options(brake: object, on_deny: str, choices: Iterable[str]) -> None:
    """Raise `ConfigurationError` for an unknown `on_deny`, `TypeError` for a brake without `check`."""
    allowed = tuple(choices)
    if on_deny not in allowed:
        raise ConfigurationError(
            f"on_deny must be one of {', '.join(map(repr, allowed))}, not {on_deny!r}"
        )
    if not callable(getattr(brake, "check", None)):
        raise TypeError(f"brake must have a check method, not {type(brake).__name__}")
