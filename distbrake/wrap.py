"""Putting a brake in front of a tool: wrappers, a decorator, a copy of a definition.

* `wrap_execute(execute, brake, tool=...)`: for host-style `execute(args,
  context=None)` functions (the Node plugin's shape); hashes `args` itself.
* `brake.guard("search")`: a decorator for plain functions and methods;
  hashes the bound arguments as a dict (defaults applied; `self`, `cls` and a
  parameter named `context` left out, the latter used to find the session).
* `decorate_tool(definition, brake)`: a copy of a definition (`name` +
  `execute`) whose execute is braked; the original is untouched.

Sync functions stay sync and async ones async; signature and metadata are
kept; on denial the body never runs. A call that passes through two braked
layers of the same brake (a tool wrapped twice, or two seams of one host) is
counted once: the outer layer marks the call in a `ContextVar` and the inner
one lets it through.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar, cast

from .session import bind_session

__all__ = [
    "Brake", "GuardMixin", "Split", "acheck", "aobserve", "decorate_tool", "is_async_brake", "make_wrapper",
    "wrap_execute",
]

R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])

# (id(brake), tool, id(args)) of the braked call now running in this context.
_active: ContextVar[tuple[int, str, int] | None] = ContextVar("distbrake_active", default=None)


class Brake(Protocol):
    """Anything with the brake `check` signature (sync or async)."""

    def check(
        self, tool: str, args: Any, *, session_id: object = None,
        call_id: object = None, context: object = None,
    ) -> Any: ...


def is_async_brake(brake: Brake) -> bool:
    """True when `brake.check` is a coroutine function (an async brake)."""
    return inspect.iscoroutinefunction(brake.check)


async def acheck(
    brake: Brake, tool: str, args: Any, *, session_id: object = None,
    call_id: object = None, context: object = None,
) -> Any:
    """Run `brake.check` from async code, whatever kind of brake it is.

    An async brake is awaited; a sync brake that does network I/O runs in a
    worker thread (so the event loop never blocks on Redis); the in-process
    brake runs inline.
    """
    if is_async_brake(brake):
        return await brake.check(
            tool, args, session_id=session_id, call_id=call_id, context=context
        )
    if getattr(brake, "blocking_io", False):
        return await asyncio.to_thread(
            functools.partial(
                brake.check, tool, args, session_id=session_id, call_id=call_id,
                context=context,
            )
        )
    return brake.check(tool, args, session_id=session_id, call_id=call_id, context=context)


async def aobserve(brake: Brake, verdict: Any, result: object, failed: bool | None = None) -> None:
    """Run `brake.observe` from async code, whatever kind of brake it is (as `acheck` does for checks).

    `failed` (passed on only when given): the call failed although `result` is no exception (an MCP
    `isError` result, a framework's tool-error result)."""
    observe = brake.observe  # type: ignore[attr-defined]
    if failed is not None:
        observe = functools.partial(observe, failed=failed)
    if is_async_brake(brake):
        await observe(verdict, result)
    elif getattr(brake, "blocking_io", False):
        await asyncio.to_thread(observe, verdict, result)
    else:
        observe(verdict, result)


def _mark(brake: Brake, tool: str, args: Any) -> tuple[int, str, int]:
    return (id(brake), tool, id(args))


Split = Callable[[tuple[Any, ...], dict[str, Any]], tuple[str, Any, Any]]


def make_wrapper(
    body: Callable[..., Any],
    brake: Brake,
    session_id: str | None,
    split: Split,
    enabled: Callable[[], bool] | None = None,
) -> Callable[..., Any]:
    """The one wrapper builder.

    `split` turns a call's (args, kwargs) into (tool name, hashed args,
    context); `enabled`, when given, can switch the brake off (a disposed
    hook) without unwrapping.
    """
    if inspect.iscoroutinefunction(body):

        @functools.wraps(body)
        async def async_wrapper(*a: Any, **kw: Any) -> Any:
            tool, hashed, context = split(a, kw)
            mark = _mark(brake, tool, hashed)
            if _active.get() == mark or (enabled is not None and not enabled()):
                return await body(*a, **kw)
            verdict = await acheck(brake, tool, hashed, session_id=session_id, context=context)
            token = _active.set(mark)
            try:
                result = await body(*a, **kw)
            except BaseException as error:
                if getattr(verdict, "observe_token", None) is not None:
                    await aobserve(brake, verdict, error)
                raise
            finally:
                _active.reset(token)
            if getattr(verdict, "observe_token", None) is not None:
                await aobserve(brake, verdict, result)
            return result

        wrapper: Callable[..., Any] = async_wrapper
    else:
        if is_async_brake(brake):
            raise TypeError(
                f"{getattr(body, '__name__', 'the tool')} is a sync function but the brake is "
                "async; use a sync brake (DistributedBrake or LoopBrake) or make it async"
            )

        @functools.wraps(body)
        def sync_wrapper(*a: Any, **kw: Any) -> Any:
            tool, hashed, context = split(a, kw)
            mark = _mark(brake, tool, hashed)
            if _active.get() == mark or (enabled is not None and not enabled()):
                return body(*a, **kw)
            verdict = brake.check(tool, hashed, session_id=session_id, context=context)
            token = _active.set(mark)
            try:
                result = body(*a, **kw)
            except BaseException as error:
                if getattr(verdict, "observe_token", None) is not None:
                    brake.observe(verdict, error)  # type: ignore[attr-defined]
                raise
            finally:
                _active.reset(token)
            if getattr(verdict, "observe_token", None) is not None:
                brake.observe(verdict, result)  # type: ignore[attr-defined]
            return result

        wrapper = sync_wrapper
    wrapper.__distbrake_brake__ = brake  # type: ignore[attr-defined]
    return wrapper


def _execute_split(tool: str) -> Split:
    """For `execute(args, context=None)`: the tool is fixed, `args` is hashed as it is."""

    def split(a: tuple[Any, ...], kw: dict[str, Any]) -> tuple[str, Any, Any]:
        args = a[0] if a else kw.get("args")
        context = a[1] if len(a) > 1 else kw.get("context")
        return tool, args, context

    return split


def wrap_execute(
    execute: Callable[..., R],
    brake: Brake,
    *,
    tool: str,
    session_id: str | None = None,
    enabled: Callable[[], bool] | None = None,
) -> Callable[..., R]:
    """Brake a host-style `execute(args, context=None)`; the body never runs on denial."""
    if getattr(execute, "__distbrake_brake__", None) is brake:
        return execute  # already braked by this brake: wrapping twice must not halve the limit
    wrapper = make_wrapper(execute, brake, session_id, _execute_split(tool), enabled)
    return cast(Callable[..., R], wrapper)


def _function_split(function: Callable[..., Any], tool: str) -> Split:
    """For plain functions: the bound arguments (defaults applied) are hashed as a dict."""
    signature = inspect.signature(function)
    hidden = {"self", "cls", "context"}

    def split(a: tuple[Any, ...], kw: dict[str, Any]) -> tuple[str, Any, Any]:
        try:
            bound = signature.bind(*a, **kw)
        except TypeError:
            return tool, dict(kw), kw.get("context")  # the body will raise its own TypeError
        bound.apply_defaults()
        arguments = bound.arguments
        context = arguments.get("context")
        return tool, {k: v for k, v in arguments.items() if k not in hidden}, context

    return split


def guard_function(function: F, brake: Brake, tool: str | None = None, session_id: str | None = None) -> F:
    """Brake a plain function or method; the call is identified by its bound arguments."""
    if getattr(function, "__distbrake_brake__", None) is brake:
        return function
    name = tool if tool is not None else getattr(function, "__name__", "tool")
    return cast(F, make_wrapper(function, brake, session_id, _function_split(function, name)))


def decorate_tool(
    definition: Any, brake: Brake, *, enabled: Callable[[], bool] | None = None
) -> Any:
    """A copy of `definition` (`name` + `execute`, mapping or object) with a braked execute."""
    if isinstance(definition, Mapping):
        name, execute = definition.get("name"), definition.get("execute")
    else:
        name, execute = getattr(definition, "name", None), getattr(definition, "execute", None)
    if not isinstance(name, str) or not callable(execute):
        raise TypeError("a tool definition needs a str `name` and a callable `execute`")
    braked = wrap_execute(execute, brake, tool=name, enabled=enabled)
    if isinstance(definition, Mapping):
        return {**definition, "execute": braked}
    if dataclasses.is_dataclass(definition) and not isinstance(definition, type):
        return dataclasses.replace(definition, execute=braked)
    duplicate = copy.copy(definition)
    try:
        object.__setattr__(duplicate, "execute", braked)
    except (AttributeError, TypeError) as error:
        raise TypeError(f"cannot set execute on a copy of {type(definition).__name__}") from error
    return duplicate


class GuardMixin:
    """The decorator and session-binding conveniences every brake offers."""

    def guard(
        self, tool: str | Callable[..., Any] | None = None, *, session_id: str | None = None
    ) -> Any:
        """`@brake.guard("search")` or `@brake.guard`: brake the decorated function."""
        brake = cast(Brake, self)
        if callable(tool):
            return guard_function(tool, brake)

        def decorator(function: F) -> F:
            return guard_function(function, brake, tool, session_id)

        return decorator

    def session(self, session_id: str) -> AbstractContextManager[str]:
        """Bind `session_id` to every check in a `with` block (task- and thread-local)."""
        return bind_session(session_id)
