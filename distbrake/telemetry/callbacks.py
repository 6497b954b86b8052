"""Running the user's callbacks: a raising callback is logged, never felt by the check.

On an async brake a coroutine function's coroutine runs as a background task
of the running loop (the check never waits for it); the tasks are kept until
they end, and one that raises is logged the same way.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from ..errors import ConfigurationError

__all__ = ["Callback", "check_callback", "run_callback"]

logger = logging.getLogger("distbrake")

Callback = Callable[..., Any]
_tasks: set[asyncio.Task[Any]] = set()


def check_callback(name: str, value: object, *, asynchronous: bool) -> Callback | None:
    """`value` as a callback option, or None; `ConfigurationError` when it cannot be one."""
    if value is None:
        return None
    if not callable(value):
        raise ConfigurationError(f"invalid {name}: expected a callable, not {type(value).__name__}")
    if not asynchronous and inspect.iscoroutinefunction(value):
        raise ConfigurationError(
            f"invalid {name}: a coroutine function needs an async brake (AsyncDistributedBrake); "
            "a sync brake takes a plain function"
        )
    return value


def _failed(name: str, error: BaseException) -> None:
    # The class only: a callback's message may carry anything the callback saw.
    logger.error("distbrake: the %s callback raised %s; the check is unaffected", name, type(error).__name__)


def _done(task: asyncio.Task[Any]) -> None:
    _tasks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        _failed(task.get_name(), task.exception())  # type: ignore[arg-type]


def run_callback(name: str, callback: Callback, *args: Any) -> None:
    """Call `callback(*args)`; a coroutine it returns runs as a background task (never awaited here)."""
    try:
        result = callback(*args)
    except Exception as error:
        _failed(name, error)
        return
    if inspect.iscoroutine(result):
        _schedule(name, result)


def _schedule(name: str, coroutine: Coroutine[Any, Any, Any]) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if loop is None:
        coroutine.close()
        logger.error("distbrake: the %s callback returned a coroutine outside an event loop; not run", name)
        return
    task = loop.create_task(coroutine, name=name)
    _tasks.add(task)
    task.add_done_callback(_done)
