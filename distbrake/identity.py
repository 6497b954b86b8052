"""The identity of a call: JavaScript-compatible canonical JSON and its hash.

    call_hash(tool, args) = sha256_hex(utf8(tool + "\\n" + canonical_json(args)))

`canonical_json` gives the text JavaScript gives for `JSON.stringify` with
object keys sorted (by UTF-16 code units) at every level. Two paths give it:

* the fast path serialises with orjson (sorted keys) and fixes up the only
  place orjson and JavaScript can still differ on such input, the spelling of
  floats (`1.0` -> `1`, `1e+20` -> `100000000000000000000`, `1e-6` ->
  `0.000001`). orjson's own spelling of an exponent changed between releases
  (3.10 writes `1e16`, 3.11.7 and later `1e+16`): the fix-up takes every
  spelling (sign or none, `e` or `E`), so the hash never depends on orjson's
  version; its quick search by sign bytes is used only when the installed
  orjson is seen to write nothing else;
* the exact path, a plain walker, runs whenever orjson refuses the value or
  the fix-up cannot be sure: lone surrogates, integers beyond 64 bits,
  non-string keys, characters above U+FFFF (key order differs there),
  pydantic models, dataclasses, subclasses of the JSON types, nesting deeper
  than orjson's limit. It is also the one that raises
  `UnsupportedArgumentsError`.

Numbers: a subclass of int or float (numpy's `float64`, pandas' floats)
is written as the same int or float; other number types (numpy's `int64`,
`float32`, `bool_`, `decimal.Decimal`) are refused, naming the type: their
JavaScript spelling is not theirs to decide (convert with `.item()`,
`int()`, `float()` or `str()` first).

Conversions (both paths agree): tuples are arrays; `enum.Enum` members are
their value; `uuid.UUID` is its string; dataclasses are objects of their
fields; pydantic models are `model_dump(mode="json")`; int, float, bool and
None keys become the strings JavaScript would make of them. Anything else
(sets, bytes, datetimes, arbitrary objects) is an error naming the type.

A set has no order of its own: the order it iterates in follows str hashing,
which is randomised per process. So a set is refused wherever it is, also
inside a pydantic model (whose JSON dump would write it as a list in that
order, a different call hash in every worker) and in dataclasses and
mappings; pydantic models are the only values searched for one separately.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import math
import re
import uuid
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
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
# Where orjson and JavaScript may spell a float differently: an integral
# float ("1.0", "-0.0": JavaScript writes "1", "0") or an exponent
# ("1e+20", "1e-5": JavaScript writes "100000000000000000000", "0.00001";
# orjson before 3.11.7 writes "1e20"). The same bytes may stand inside a
# string ("v1.0,"); `_fix_floats` checks.
_INTEGRAL_END = re.compile(rb"\.0(?:[,\]}]|\Z)")
_EXPONENTS = (b"e+", b"e-")
# An exponent in any spelling: "<digit>e" or "<digit>E", then a sign or a digit (group 1 is the "e").
_ANY_EXPONENT = re.compile(rb"[0-9]([eE])[-+0-9]")
_FEW_SIGNS = 64  # "+" or "-" bytes looked at one by one before the exponent search goes by pairs
_DIGITS = frozenset(b"0123456789")
_NUMBER_BYTES = frozenset(b"0123456789.eE+-")
# Bytes below 0xF0: deleting them leaves only lead bytes of characters above
# U+FFFF, where JavaScript's UTF-16 key order differs from code-point order.
_BELOW_ASTRAL = bytes(range(0xF0))
# For small outputs one regex pass is cheaper than several `find` calls.
_SMALL = 2048
_FLOAT_HINT = re.compile(rb"\.0(?:[,\]}]|$)|[0-9][eE][-+0-9]")
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
    text = float.__repr__(value)  # shortest round-trip digits, as in JavaScript (a subclass's repr is its own)
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


def _signed_exponents_only() -> bool:
    """Whether the installed orjson writes every exponent as "e+" or "e-" (3.11.7 and later do)."""
    data = orjson.dumps([1e16, 1e21, 1.5e300, 1e-7, 1.5e-7, 5e-324])
    return data.count(b"e") == 6 and data.count(b"e+") + data.count(b"e-") == 6


#: True: the exponents are found by their sign bytes (memchr, fast over any text); False: by one
#: regex pass that takes every spelling (orjson before 3.11.7 writes "1e16").
SIGNED_EXPONENTS = _signed_exponents_only()
_PERIOD = 0x2E  # in every integral float orjson writes ("1.0")
# A byte in every exponent orjson writes: its sign ("1e+16", "1e-07"); with an orjson that writes "1e16", "e" or "E".
_SIGN_BYTES, _E_BYTES = (0x2B, 0x2D), (0x65, 0x45)


def _float_candidates(data: bytes, signed: bool = True) -> list[int]:
    """Positions of "." in ".0," (etc.) and of "e" in "<digit>e+" / "<digit>e-".

    `signed` False: of "e" or "E" after a digit and before a sign or a digit, every spelling of an
    exponent (the search for small outputs, and for any output of an orjson that writes "1e16").
    """
    # One regex pass for the integral ends (its literal prefix makes it faster
    # than three `find` loops); `find` for the exponents.
    found = [match.start() for match in _INTEGRAL_END.finditer(data)]
    if not signed:
        found.extend(match.start(1) for match in _ANY_EXPONENT.finditer(data))
        return found
    for pattern in _EXPONENTS:
        # The sign alone first: a one-byte search is memchr, many times faster than a two-byte one
        # over text full of "e"s; once the sign turns out common, the two-byte search from there.
        sign, seen = pattern[1], 0
        at = data.find(sign)
        while at != -1 and seen < _FEW_SIGNS:
            if at >= 2 and data[at - 1] == 0x65 and data[at - 2] in _DIGITS:  # <digit> "e" <sign>
                found.append(at - 1)
            seen += 1
            at = data.find(sign, at + 1)
        if at == -1:
            continue
        at = data.find(pattern, max(at - 1, 0))
        while at != -1:
            if at and data[at - 1] in _DIGITS:
                found.append(at)
            at = data.find(pattern, at + 2)
    return found


def _unescaped_quotes(data: bytes, start: int, end: int, backslashes: bool = True) -> int:
    """How many '"' in data[start:end] are not escaped (not after an odd run of backslashes).

    `backslashes`: False when `data` holds none (then no quote is escaped).
    """
    total = data.count(b'"', start, end)
    if not backslashes:
        return total
    escaped, run, sign = 0, b'\\"', 1
    while True:
        n = data.count(run, start, end)
        if not n:
            return total - escaped
        escaped += sign * n  # quotes after >= k backslashes, alternating: odd runs remain
        run, sign = b"\\" + run, -sign


def _fix_floats(data: bytes, candidates: list[int]) -> bytes:
    """Respell orjson's float tokens at `candidates` the JavaScript way, leaving strings alone."""
    candidates.sort()
    out: list[bytes] = []
    done = 0  # data[:done] is already in `out`
    counted, quotes = 0, 0  # unescaped quotes in data[:counted]
    size = len(data)
    backslashes = data.find(0x5C) != -1  # one memchr: most documents have no escape at all
    for at in candidates:
        quotes += _unescaped_quotes(data, counted, at, backslashes)
        counted = at
        if quotes & 1 or at < done:  # inside a string, or part of a token already fixed
            continue
        start = at
        while start and data[start - 1] in _NUMBER_BYTES:
            start -= 1
        end = at + 1
        while end < size and data[end] in _NUMBER_BYTES:
            end += 1
        out.append(data[done:start])
        if data[at] == 0x2E:  # an integral float below 1e16: "12.0" -> "12", "-0.0" -> "0"
            integral = data[start:at]
            out.append(b"0" if integral == b"-0" else integral)
        else:
            out.append(js_number(float(data[start:end])).encode("ascii"))
        done = end
    if not out:
        return data
    out.append(data[done:])
    return b"".join(out)


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
        return int.__repr__(key)  # a subclass's own str() is not its JSON
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
        return _model_json(value, model_dump)
    raise _unsupported(value)


def _model_json(model: object, model_dump: Any) -> Any:
    """A pydantic model's `model_dump(mode="json")`, unless that would follow a set's iteration order.

    pydantic writes a set (or frozenset) as a list in iteration order, and the
    order of a set of str changes with every process's hash seed: such a model
    would hash differently in every worker. Its Python dump still holds the
    sets (a field serializer that sorts them leaves none), so that dump is
    searched first. A model pydantic cannot write as JSON is refused too,
    naming the model, never pydantic's message (it may quote a value).
    """
    failure = None
    try:
        _refuse_unordered(model_dump(), model)
        return model_dump(mode="json")
    except UnsupportedArgumentsError:
        raise
    except (TypeError, ValueError) as error:  # pydantic_core.PydanticSerializationError is a ValueError
        failure = type(error).__name__
    # Raised here, outside the handler, so that pydantic's error is not even its __context__.
    raise UnsupportedArgumentsError(
        f"arguments contain a pydantic model of type {type(model).__name__!r} that pydantic "
        f"cannot write as JSON ({failure}); convert it before the call"
    )


def _refuse_unordered(dumped: Any, model: object) -> None:
    """Raise if a model's Python dump holds an unordered collection (set, frozenset, any `Set`), at any depth."""
    stack = [dumped]
    while stack:
        item = stack.pop()
        if isinstance(item, (str, int, float, bytes)) or item is None:
            continue
        if isinstance(item, AbstractSet):
            raise UnsupportedArgumentsError(
                f"arguments contain a value of type {type(item).__name__!r} inside the pydantic model "
                f"{type(model).__name__!r}; its JSON form follows the set's iteration order, which "
                "differs between processes, so the call would hash differently in every worker. "
                "Use a list or tuple (sorted) before the call"
            )
        if isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


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


def _may_hold_floats(data: bytes) -> bool:
    """Whether a small output may hold a float token `_fix_floats` respells (or `_FLOAT_HINT` finds in a string).

    Single-byte tests first (an int `in` bytes is one memchr): no "." and no byte an exponent of the installed
    orjson needs (a sign, or any "e" with an orjson that writes "1e16") is no float; else one regex pass.
    """
    first, second = _SIGN_BYTES if SIGNED_EXPONENTS else _E_BYTES
    if _PERIOD not in data and first not in data and second not in data:
        return False
    return _FLOAT_HINT.search(data) is not None


def canonical_json_bytes(args: Any) -> bytes:
    """`canonical_json(args)` encoded as UTF-8 (what the hash is taken of)."""
    try:
        data = orjson.dumps(args, default=_reject, option=_ORJSON_OPTIONS)
    except (orjson.JSONEncodeError, TypeError, _Unsure, RecursionError):
        return _exact(args).encode("utf-8")
    if not data.isascii() and data.translate(None, _BELOW_ASTRAL):
        return _exact(args).encode("utf-8")
    if len(data) < _SMALL and not _may_hold_floats(data):
        return data
    candidates = _float_candidates(data, SIGNED_EXPONENTS and len(data) >= _SMALL)
    return _fix_floats(data, candidates) if candidates else data


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
    if type(tool) is not str and not isinstance(tool, str):
        raise TypeError(f"tool name must be a str, not {type(tool).__name__}")
    head = _tool_head(tool) if len(tool) <= CACHED_TOOL_CHARS else _tool_head.__wrapped__(tool)
    digest = head.copy()
    digest.update(canonical_json_bytes(args))
    return digest.hexdigest()


CACHED_TOOL_CHARS = 256  # a longer tool name is hashed afresh each time, never kept


@functools.lru_cache(maxsize=1024)
def _tool_head(tool: str) -> hashlib._Hash:
    """sha256 of `tool + "\n"`, taken once per tool name (each call hash goes on from a copy)."""
    return hashlib.sha256(_tool_bytes(tool) + b"\n")


def hash_prefix(digest: str) -> str:
    """The first 12 hex characters: the only part of a call ever shown."""
    return digest[:12]
