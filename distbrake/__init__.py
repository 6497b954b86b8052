"""distbrake: deny the Nth identical tool call in a row, across a whole fleet.

See README.md. The public API is the names in `distbrake.__all__` (pinned by
`tests/test_public_api.py`) and the adapters in `distbrake.integrations.*`
(each module's `__all__`). Every other module is an implementation detail and
may change without notice; import from `distbrake` itself.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version

from .core import DECIDED_BY, DecidedBy, SessionState, Verdict
from .errors import (
    BrakeUnavailableError,
    ConfigurationError,
    DistbrakeError,
    EventLoopError,
    InvalidMaxRepeatsError,
    InvalidURLError,
    LoopBrakeError,
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

try:
    __version__ = version("distbrake")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

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
