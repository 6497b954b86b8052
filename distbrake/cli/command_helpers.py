"""What the commands share: the `--json` option, printing JSON, and the memory:// hint."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..settings import BrakeSettings
from ..urls import parse_url
from .rendering import note
from .run_state import current_run

F = TypeVar("F", bound=Callable[..., Any])


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


def remember_json_flag(value: bool) -> bool:
    current_run.json = current_run.json or value
    return current_run.json


def json_option(function: F) -> F:
    """`--json` on a command (it may also be given before the command)."""

    def remember(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        return remember_json_flag(value)

    return click.option(
        "--json", "as_json", is_flag=True, callback=remember, expose_value=True,
        help="Print JSON (stable field names, see the README) instead of text.",
    )(function)


def is_memory(settings: BrakeSettings) -> bool:
    return parse_url(settings.url or "memory://").kind == "memory"


def memory_hint(settings: BrakeSettings) -> None:
    if is_memory(settings):
        note(
            "note: memory:// is private to this process, so this command sees only its own "
            "streaks; pass --url redis://... (or set DISTBRAKE_URL) to reach your fleet's store"
        )
