"""What every gateway counts and says: a call's identity (malformed calls included) and the halt text.

No framework imports: `distbrake proxy` and the Docker interceptor share it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import LoopBrakeError

__all__ = ["RAW_ARGUMENTS_KEY", "call_identity", "halt_text", "malformed_call", "refusal_text"]

# The one argument a malformed call is counted with: its raw argument text.
RAW_ARGUMENTS_KEY = "distbrake.raw_arguments"


def _text(value: object) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return repr(value)


def malformed_call(params: object) -> tuple[str, str] | None:
    """`(tool name as sent, raw argument text)` of a `tools/call` the protocol would refuse, else None.

    Malformed: params that are not an object, a name that is not a string, or
    arguments that are present and not a JSON object (a string of invalid JSON,
    a list, a number...). A string is its own text; anything else its JSON text.
    """
    if not isinstance(params, Mapping):
        return "", _text(params)
    return call_identity(params.get("name"), params.get("arguments"))[2]


def call_identity(name: object, arguments: object) -> tuple[str, dict[str, Any], tuple[str, str] | None]:
    """`(tool, arguments, malformed)` a gateway checks a call with.

    A well-formed call is its name and arguments (`malformed` None); a
    malformed one is the tool name as sent and `{RAW_ARGUMENTS_KEY: raw text}`,
    its own streak (only a well-formed call whose one argument is that key with
    the same text would share it, and it could only affect its own session).
    """
    if isinstance(name, str) and (arguments is None or isinstance(arguments, Mapping)):
        return name, dict(arguments or {}), None
    tool, raw = (name if isinstance(name, str) else _text(name)), _text(arguments)
    return tool, {RAW_ARGUMENTS_KEY: raw}, (tool, raw)


def halt_text(error: LoopBrakeError) -> str:
    """What a client reads when its session is halted (a `LoopBrakeError` of kind "halt")."""
    text = str(error)
    return text if "halted" in text else f"loop brake: this session is halted; {text}"


def refusal_text(error: LoopBrakeError) -> str:
    """The text a gateway refuses a call with: the brake's own, saying so when the session is halted."""
    return halt_text(error) if error.kind == "halt" else str(error)
