"""distbrake: deny the Nth identical tool call in a row, across a whole fleet.

See README.md. Public names are listed in `__all__`; everything else is
internal and may change.
"""

from __future__ import annotations

import logging
from importlib.metadata import PackageNotFoundError, version

from .aio import AsyncDistributedBrake
from .base import SessionState, Verdict
from .errors import (
    BrakeUnavailableError,
    ConfigurationError,
    DistbrakeError,
    InvalidMaxRepeatsError,
    InvalidURLError,
    LoopBrakeError,
    UnsupportedArgumentsError,
)
from .identity import call_hash, canonical_json, hash_prefix
from .redis_brake import DistributedBrake
from .session import bind_session
from .settings import BrakeSettings, normalize_max_repeats, resolve_max_repeats
from .slot import session_key
from .streak import LoopBrake
from .wrap import decorate_tool, wrap_execute

logging.getLogger("distbrake").addHandler(logging.NullHandler())

try:
    __version__ = version("distbrake")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "AsyncDistributedBrake",
    "BrakeSettings",
    "BrakeUnavailableError",
    "ConfigurationError",
    "DistbrakeError",
    "DistributedBrake",
    "InvalidMaxRepeatsError",
    "InvalidURLError",
    "LoopBrake",
    "LoopBrakeError",
    "SessionState",
    "UnsupportedArgumentsError",
    "Verdict",
    "__version__",
    "bind_session",
    "call_hash",
    "canonical_json",
    "decorate_tool",
    "hash_prefix",
    "normalize_max_repeats",
    "resolve_max_repeats",
    "session_key",
    "wrap_execute",
]
