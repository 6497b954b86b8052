"""distbrake: deny the Nth identical tool call in a row, across a whole fleet.

See README.md. The public API is the names in `distbrake.__all__` (pinned by
`tests/test_public_api.py`) and the adapters in `distbrake.integrations.*`
(each module's `__all__`). Every other module is an implementation detail and
may change without notice; import from `distbrake` itself.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from .core import DECIDED_BY, DecidedBy, SessionState, Verdict
    from .errors import (
        BrakeUnavailableError,
        ConfigurationError,
        DistbrakeError,
        EventLoopError,
        InvalidMaxRepeatsError,
        InvalidURLError,
        LoopBrakeError,
        LoopBrakeHalt,
        MissingSessionError,
        ScriptReplyError,
        UnsupportedArgumentsError,
    )
    from .hooks import BrakeHandle, install
    from .identity import call_hash, canonical_json, hash_prefix
    from .inprocess import LoopBrake
    from .redis.aio import AsyncDistributedBrake
    from .redis.sync import DistributedBrake
    from .redis.wire import session_key
    from .rules import ToolRules
    from .session import bind_session, resolve_session
    from .settings import (
        DEFAULT_URL,
        BrakeOptions,
        BrakeSettings,
        FailurePolicy,
        normalize_max_repeats,
        resolve_max_repeats,
    )
    from .telemetry.health import BrakeHealth
    from .wrap import decorate_tool, wrap_execute

logging.getLogger("distbrake").addHandler(logging.NullHandler())

# Where each public name lives. They are imported on first use (PEP 562), so that
# `import distbrake` alone, and `distbrake --version` or `--help`, load no Redis
# client and no pydantic; `from distbrake import DistributedBrake` loads what it needs.
_HOMES = {
    ".core": ("DECIDED_BY", "DecidedBy", "SessionState", "Verdict"),
    ".errors": (
        "BrakeUnavailableError", "ConfigurationError", "DistbrakeError", "EventLoopError",
        "InvalidMaxRepeatsError", "InvalidURLError", "LoopBrakeError", "LoopBrakeHalt", "MissingSessionError",
        "ScriptReplyError", "UnsupportedArgumentsError",
    ),
    ".hooks": ("BrakeHandle", "install"),
    ".identity": ("call_hash", "canonical_json", "hash_prefix"),
    ".inprocess": ("LoopBrake",),
    ".redis.aio": ("AsyncDistributedBrake",),
    ".redis.sync": ("DistributedBrake",),
    ".redis.wire": ("session_key",),
    ".rules": ("ToolRules",),
    ".session": ("bind_session", "resolve_session"),
    ".telemetry.health": ("BrakeHealth",),
    ".settings": (
        "DEFAULT_URL", "BrakeOptions", "BrakeSettings", "FailurePolicy", "normalize_max_repeats",
        "resolve_max_repeats",
    ),
    ".wrap": ("decorate_tool", "wrap_execute"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'distbrake' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # the next look-up is a plain global
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "DECIDED_BY",
    "DEFAULT_URL",
    "AsyncDistributedBrake",
    "BrakeHandle",
    "BrakeHealth",
    "BrakeOptions",
    "BrakeSettings",
    "BrakeUnavailableError",
    "ConfigurationError",
    "DecidedBy",
    "DistbrakeError",
    "DistributedBrake",
    "EventLoopError",
    "FailurePolicy",
    "InvalidMaxRepeatsError",
    "InvalidURLError",
    "LoopBrake",
    "LoopBrakeError",
    "LoopBrakeHalt",
    "MissingSessionError",
    "ScriptReplyError",
    "SessionState",
    "ToolRules",
    "UnsupportedArgumentsError",
    "Verdict",
    "__version__",
    "bind_session",
    "call_hash",
    "canonical_json",
    "decorate_tool",
    "hash_prefix",
    "install",
    "normalize_max_repeats",
    "resolve_max_repeats",
    "resolve_session",
    "session_key",
    "wrap_execute",
]
