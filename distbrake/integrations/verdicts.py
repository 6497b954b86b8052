"""What an adapter reads off an allowed verdict: the warning to show the model, whether to observe the result."""

from __future__ import annotations

from typing import Any

__all__ = ["needs_observation", "text_with_warning", "warning_of"]


def warning_of(verdict: Any) -> str | None:
    """The `warn_at` warning the model should read with the result (None in shadow mode or without one)."""
    warning = getattr(verdict, "warning", None)
    if not isinstance(warning, str) or not warning or getattr(verdict, "would_deny", False):
        return None
    return warning


def needs_observation(verdict: Any) -> bool:
    """True for a progress-aware tool's verdict: its result must be handed to `brake.observe`."""
    return getattr(verdict, "observe_token", None) is not None


def text_with_warning(text: str, warning: str) -> str:
    """A text result, whole, then the warning as a separate paragraph."""
    return f"{text}\n\n{warning}" if text else warning
