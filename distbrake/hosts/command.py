"""`distbrake hook <host>` as a process: options, stdin, stdout, exit code.

`python -m distbrake hook ...` and the `distbrake` script come here first
(`distbrake/__main__.py`) without importing click: the options below are
parsed by hand, and anything else (`--help`, `--self-test`, a bad option) goes
on to the click command (`cli/hook.py`), which declares the same options.
"""

from __future__ import annotations

import sys
from typing import BinaryIO, TextIO

from . import HOSTS, Answer
from .run import MAX_EVENT_BYTES, HookOptions, run_hook

__all__ = ["emit", "fast", "read_event"]

_VALUES = {"--url": "url", "--timeout": "timeout", "--key-prefix": "key_prefix", "--max-repeats": "max_repeats",
           "--on-error": "on_error", "--scope": "scope", "--store": "store"}
_CHOICES = {"on_error": ("allow", "deny"), "scope": ("session", "run")}


def parse_fast(argv: list[str]) -> tuple[str, HookOptions] | None:
    """`<host> [--option value | --option=value]...` for the options above, else None (click parses it)."""
    if not argv or argv[0] not in HOSTS:
        return None
    values: dict[str, object] = {}
    rest = iter(argv[1:])
    for word in rest:
        flag, equals, given = word.partition("=")
        field = _VALUES.get(flag)
        if field is None:
            return None
        value = given if equals else next(rest, None)
        if value is None:
            return None
        try:
            if field == "timeout":
                number = float(value)
                if not 0 < number <= 60:
                    return None
                values[field] = number
            elif field == "max_repeats":
                count = int(value)
                if count < 1:
                    return None
                values[field] = count
            elif field in _CHOICES and value not in _CHOICES[field]:
                return None
            else:
                values[field] = value
        except ValueError:
            return None
    return argv[0], HookOptions(**values)  # type: ignore[arg-type]


def read_event(stream: BinaryIO) -> bytes:
    """At most MAX_EVENT_BYTES + 1 bytes of stdin (more is refused as too large without reading it all)."""
    return stream.read(MAX_EVENT_BYTES + 1)


def emit(answer: Answer, stdout: TextIO, stderr: TextIO) -> int:
    """Write `answer` and return its exit code."""
    if answer.stdout:
        stdout.write(answer.stdout + "\n")
        stdout.flush()
    if answer.stderr:
        stderr.write(answer.stderr)
        stderr.flush()
    return answer.code


def fast(argv: list[str]) -> int | None:
    """Run the hook without click when `argv` (after `hook`) is plain; None: let click parse it."""
    parsed = parse_fast(argv)
    if parsed is None:
        return None
    name, options = parsed
    return emit(run_hook(name, read_event(sys.stdin.buffer), options), sys.stdout, sys.stderr)
