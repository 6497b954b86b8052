"""The identity of a call: JavaScript-compatible canonical JSON and its hash.

    call_hash(tool, args) = sha256_hex(utf8(tool + "\\n" + canonical_json(args)))

`canonical_json` gives the text JavaScript gives for `JSON.stringify` with
object keys sorted (by UTF-16 code units) at every level. Two paths give it:

* the fast path serialises with orjson (sorted keys) and fixes up the only
  place orjson and JavaScript can still differ on such input, the spelling of
  floats (`1.0` -> `1`, `1e+20` -> `100000000000000000000`, `1e-6` ->
  `0.000001`);
* the exact path, a plain walker, runs whenever orjson refuses the value or
  the fix-up cannot be sure: lone surrogates, integers beyond 64 bits,
  non-string keys, characters above U+FFFF (key order differs there),
  pydantic models, dataclasses, subclasses of the JSON types, nesting deeper
  than orjson's limit. It is also the one that raises
  `UnsupportedArgumentsError`.

Conversions (both paths agree): tuples are arrays; `enum.Enum` members are
their value; `uuid.UUID` is its string; dataclasses are objects of their
fields; pydantic models are `model_dump(mode="json")`; int, float, bool and
None keys become the strings JavaScript would make of them. Anything else
(sets, bytes, datetimes, arbitrary objects) is an error naming the type.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import math
import re
import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from .errors import UnsupportedArgumentsError

__all__ = ["MAX_DEPTH", "call_hash", "canonical_json", "canonical_json_bytes", "hash_prefix"]

#: Deepest nesting accepted; deeper values (or cycles) are a clear error.
MAX_DEPTH = 512

_ORJSON_OPTIONS = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_DATACLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_SUBCLASS
)
# A digit followed by "." or "e": the output may hold a float (or a string
# that merely looks like one; the precise pass below tells them apart).
_FLOAT_HINT = re.compile(rb"[0-9][.eE]")
# A JSON string (skipped as it is) or a float token outside any string.
_STRING_OR_FLOAT = re.compile(
    rb'"[^"\\]*(?:\\.[^"\\]*)*"|(-?[0-9]+(?:\.[0-9]+)?[eE][-+]?[0-9]+|-?[0-9]+\.[0-9]+)'
)
# Four-byte UTF-8 sequences: characters above U+FFFF, where JavaScript's
# UTF-16 key order differs from code-point order.
_ASTRAL_UTF8 = re.compile(rb"[\xf0-\xf4]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_NEEDS_ESCAPE = re.compile('["\\\\\x00-\x1f\ud800-\udfff]')
_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}


class _Unsure(Exception):
    """The fast path cannot vouch for its output; take the exact path."""


def _reject(value: object) -> object:
    raise _Unsure


# -- numbers ----------------------------------------------------------------


def js_number(value: float) -> str:
    """Format a float as JavaScript's `Number.prototype.toString` does (JSON rules)."""
    if math.isnan(value) or math.isinf(value):
        return "null"
    if value == 0:
        return "0"
    text = repr(value)  # shortest round-trip digits, as in JavaScript
    sign = ""
    if text[0] == "-":
        sign, text = "-", text[1:]
    mantissa, _, exp_text = text.partition("e")
    exponent = int(exp_text) if exp_text else 0
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    # value = 0.digits * 10**point
    point = len(whole) + exponent - (len(whole + frac) - len((whole + frac).lstrip("0")))
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= point <= 21:
        body = digits + "0" * (point - k)
    elif 0 < point <= 21:
        body = digits[:point] + "." + digits[point:]
    elif -6 < point <= 0:
        body = "0." + "0" * (-point) + digits
    else:
        e = point - 1
        e_text = f"e+{e}" if e >= 0 else f"e-{-e}"
        body = digits[0] + ("." + digits[1:] if k > 1 else "") + e_text
    return sign + body


def _fix_float(match: re.Match[bytes]) -> bytes:
    token = match.group(1)
    if token is None:
        return match.group(0)
    return js_number(float(token)).encode("ascii")


# -- the exact path -----------------------------------------------------------


def _escape_char(match: re.Match[str]) -> str:
    char = match.group(0)
    known = _ESCAPES.get(char)
    if known is not None:
        return known
    return f"\\u{ord(char):04x}"


def _join_pair(match: re.Match[str]) -> str:
    high, low = (ord(c) for c in match.group(0))
    return chr(0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00))


def _js_string_value(text: str) -> str:
    """Python text as a JavaScript string would hold it: surrogate pairs joined."""
    if _SURROGATE.search(text) is not None:
        text = _SURROGATE_PAIR.sub(_join_pair, text)
    return text


def _quote(text: str) -> str:
    text = _js_string_value(text)
    return '"' + _NEEDS_ESCAPE.sub(_escape_char, text) + '"'


def _utf16_order(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def _key_text(key: object) -> str:
    if isinstance(key, str):
        return _js_string_value(key)
    if key is None:
        return "null"
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        return str(key)
    if isinstance(key, float):
        if math.isfinite(key):
            return js_number(key)
        return "NaN" if math.isnan(key) else ("Infinity" if key > 0 else "-Infinity")
    if isinstance(key, enum.Enum):
        return _key_text(key.value)
    raise UnsupportedArgumentsError(
        f"arguments contain an object key of type {type(key).__name__!r}, which "
        "JSON cannot express; use str keys"
    )


def _unsupported(value: object) -> UnsupportedArgumentsError:
    return UnsupportedArgumentsError(
        f"arguments contain a value of type {type(value).__name__!r}, which JSON "
        "cannot express; convert it (e.g. to a list, str or dict) before the call"
    )


def _convert(value: Any) -> Any:
    """Turn the non-JSON types we accept into JSON types (one level)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, uuid.UUID):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump) and hasattr(type(value), "model_fields"):
        return model_dump(mode="json")
    raise _unsupported(value)


def _encode(value: Any, out: list[str], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise UnsupportedArgumentsError(
            f"arguments are nested deeper than {MAX_DEPTH} levels (or contain a cycle)"
        )
    if isinstance(value, str):
        out.append(_quote(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int) and not isinstance(value, enum.Enum):
        out.append(int.__repr__(value))
    elif isinstance(value, float) and not isinstance(value, enum.Enum):
        out.append(js_number(value))
    elif isinstance(value, Mapping):
        items: dict[str, Any] = {}
        for key, item in value.items():
            text = _key_text(key)
            if text in items:
                raise UnsupportedArgumentsError(
                    "arguments contain two object keys that are the same once "
                    "converted to strings"
                )
            items[text] = item
        out.append("{")
        first = True
        for text in sorted(items, key=_utf16_order):
            if not first:
                out.append(",")
            first = False
            out.append(_quote(text))
            out.append(":")
            _encode(items[text], out, depth + 1)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, out, depth + 1)
        out.append("]")
    else:
        _encode(_convert(value), out, depth + 1)


def _exact(value: Any) -> str:
    out: list[str] = []
    _encode(value, out, 0)
    return "".join(out)


# -- public ---------------------------------------------------------------------


def canonical_json_bytes(args: Any) -> bytes:
    """`canonical_json(args)` encoded as UTF-8 (what the hash is taken of)."""
    try:
        data = orjson.dumps(args, default=_reject, option=_ORJSON_OPTIONS)
    except (orjson.JSONEncodeError, TypeError, _Unsure, RecursionError):
        return _exact(args).encode("utf-8")
    if _ASTRAL_UTF8.search(data) is not None:
        return _exact(args).encode("utf-8")
    if _FLOAT_HINT.search(data) is not None:
        data = _STRING_OR_FLOAT.sub(_fix_float, data)
    return data


def canonical_json(args: Any) -> str:
    """JSON text of `args` with sorted keys, exactly as JavaScript would write it."""
    return canonical_json_bytes(args).decode("utf-8")


def _tool_bytes(tool: str) -> bytes:
    try:
        return tool.encode("utf-8")
    except UnicodeEncodeError:
        # JavaScript's UTF-8 encoder writes a lone surrogate as U+FFFD.
        return _SURROGATE.sub("\ufffd", _js_string_value(tool)).encode("utf-8")


def call_hash(tool: str, args: Any) -> str:
    """sha256 hex of `tool + "\\n" + canonical_json(args)`: the identity of a call."""
    if not isinstance(tool, str):
        raise TypeError(f"tool name must be a str, not {type(tool).__name__}")
    return hashlib.sha256(_tool_bytes(tool) + b"\n" + canonical_json_bytes(args)).hexdigest()


def hash_prefix(digest: str) -> str:
    """The first 12 hex characters: the only part of a call ever shown."""
    return digest[:12]
