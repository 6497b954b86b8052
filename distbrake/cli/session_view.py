"""A session's streak as JSON fields and as short text: limit, status, times and spans."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from rich.text import Text

from ..base import SessionState
from ..settings import BrakeSettings


def _limit(settings: BrakeSettings, tool: str) -> tuple[int | None, str]:
    limit = settings.limit_for(tool)
    if limit is None:
        return None, "exempt"
    if tool in settings.tool_max_repeats:
        return limit, "tool_max_repeats"
    return limit, "max_repeats"


def iso_time(timestamp: float) -> str:
    if not timestamp:
        return ""
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="seconds").replace(
        "+00:00", "Z")


def span_text(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


def state_json(state: SessionState, settings: BrakeSettings) -> dict[str, Any]:
    """A session's state with its limit and what the next identical call would get."""
    limit, source = _limit(settings, state.tool_name)
    return {
        "session_id": state.session_id,
        "tool_name": state.tool_name,
        "hash_prefix": state.hash_prefix,
        "count": state.count,
        "limit": limit,
        "limit_source": source,
        "denying": limit is not None and state.count >= limit,
        "next_denied": limit is not None and state.count + 1 >= limit,
        "ttl_seconds": state.ttl_seconds,
        "updated_at": state.updated_at,
        "updated_at_iso": iso_time(state.updated_at),
    }


def status_text(data: Mapping[str, Any]) -> Text:
    if data["denying"]:
        return Text("DENYING", style="bold red")
    if data["next_denied"]:
        return Text("next denied", style="yellow")
    if data["limit"] is None:
        return Text("exempt", style="dim")
    return Text("")


def limit_text(data: Mapping[str, Any]) -> str:
    if data["limit"] is None:
        return "none (tool is exempt)"
    if data["limit_source"] == "tool_max_repeats":
        return f"{data['limit']} (per-tool limit for {data['tool_name']})"
    return f"{data['limit']} (max_repeats)"


def ttl_text(ttl: float | None) -> str:
    return "no expiry" if ttl is None else f"{span_text(ttl)} left"
