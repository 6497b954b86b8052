"""The host seams: put a brake into any tool registry, and take it out again.

A host registry is any object with `register(definition)` and/or
`execute(name, args, context=None)`; a definition has a `name` and an
`execute(args, context=None)`; the context may carry `call_id`,
`session_id` or `agent_id` (mapping keys or attributes).

`install(registry, brake)` patches both seams, as the Node plugin did:

* `register`: every tool registered afterwards is registered as a braked
  copy (the caller's definition is untouched);
* `execute`: catches tools registered before the brake.

A host call that passes both seams is counted once (the outer seam marks the
call; the host's call id, when there is one, makes it exact). `dispose()`
puts the registry's original attributes back (the very same objects), turns
the braked copies registered meanwhile into pass-throughs, and forgets the
in-process streaks. The brake registers no tool of its own: a brake the model
can call is a brake it can argue with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .wrap import Brake, Split, decorate_tool, make_wrapper

__all__ = ["BrakeHandle", "install"]

_MISSING = object()
SEAMS = ("register", "execute")


def _registry_execute_split(a: tuple[Any, ...], kw: dict[str, Any]) -> tuple[str, Any, Any]:
    name = a[0] if a else kw.get("name")
    args = a[1] if len(a) > 1 else kw.get("args")
    context = a[2] if len(a) > 2 else kw.get("context")
    return str(name), args, context


class BrakeHandle:
    """What `install` returns: `dispose()` undoes it exactly (idempotent)."""

    def __init__(self, registry: Any, brake: Brake) -> None:
        self.registry = registry
        self.brake = brake
        self.active = True
        # What each seam was in the instance's own __dict__ (or _MISSING when it
        # came from the class), so dispose can restore exactly that.
        self._saved: dict[str, object] = {}

    def _is_active(self) -> bool:
        return self.active

    def _patch(self, seam: str, replacement: Callable[..., Any]) -> None:
        own = getattr(self.registry, "__dict__", {})
        self._saved[seam] = own.get(seam, _MISSING)
        setattr(self.registry, seam, replacement)

    def dispose(self) -> None:
        """Restore the registry's seams and forget in-process streaks."""
        if not self.active:
            return
        self.active = False
        for seam, original in self._saved.items():
            if original is _MISSING:
                delattr(self.registry, seam)
            else:
                setattr(self.registry, seam, original)
        reset = getattr(self.brake, "reset", None)
        if callable(reset):
            reset()

    def __enter__(self) -> BrakeHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.dispose()


def install(registry: Any, brake: Brake) -> BrakeHandle:
    """Brake every tool of `registry` at its `register` and `execute` seams."""
    seams = [s for s in SEAMS if callable(getattr(registry, s, None))]
    if not seams:
        raise TypeError("a registry needs a register(definition) or execute(name, args, context) method")
    handle = BrakeHandle(registry, brake)
    if "register" in seams:
        original_register = registry.register

        def register(definition: Any, *rest: Any, **kw: Any) -> Any:
            if not handle.active:
                return original_register(definition, *rest, **kw)
            braked = decorate_tool(definition, brake, enabled=handle._is_active)
            return original_register(braked, *rest, **kw)

        handle._patch("register", register)
    if "execute" in seams:
        split: Split = _registry_execute_split
        handle._patch(
            "execute", make_wrapper(registry.execute, brake, None, split, handle._is_active)
        )
    return handle
