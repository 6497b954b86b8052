"""What the newer adapters do with a verdict after the tool ran: the warning to show, the text to add it to."""

from __future__ import annotations

from typing import Any

__all__ = ["text_with_warning", "warning_of"]


def warning_of(verdict: Any) -> str | None:
    """The warning the model must read with this call's result (None: none, or shadow mode)."""
    warning = getattr(verdict, "warning", None)
    if not isinstance(warning, str) or not warning or getattr(verdict, "would_deny", False):
        return None
    return warning


def text_with_warning(text: str, warning: str) -> str:
    """A text result, whole, then the warning as a separate paragraph."""
    return f"{text}\n\n{warning}" if text else warning
