"""Call identity: JS-compatible canonical JSON and the call hash (SPEC §2)."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
import uuid
from pathlib import Path
from typing import Any

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distbrake import UnsupportedArgumentsError, call_hash, canonical_json, hash_prefix
from distbrake.identity import MAX_DEPTH, _exact, js_number

VECTORS = Path(__file__).parent / "data" / "call_hash.jsonl"


def load_vectors() -> list[dict[str, str]]:
    return [json.loads(line) for line in VECTORS.read_text(encoding="utf-8").split("\n") if line]


def test_vector_file_is_complete() -> None:
    assert len(load_vectors()) == 400


@pytest.mark.parametrize("vector", load_vectors(), ids=lambda v: v["prefix"])
def test_node_vectors(vector: dict[str, str]) -> None:
    args = json.loads(vector["args_json"])
    assert canonical_json(args) == vector["canonical"]
    assert _exact(args) == vector["canonical"]  # the slow path agrees too
    digest = call_hash(vector["tool"], args)
    assert digest == vector["sha256"]
    assert hash_prefix(digest) == vector["prefix"]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1.0, "1"), (-0.0, "0"), (1e20, "100000000000000000000"), (1e21, "1e+21"),
        (1e-7, "1e-7"), (0.000001, "0.000001"), (1e16, "10000000000000000"),
        (0.1, "0.1"), (-1.5e-9, "-1.5e-9"), (123.456, "123.456"), (5e-324, "5e-324"),
        (1.7976931348623157e308, "1.7976931348623157e+308"), (math.nan, "null"),
        (math.inf, "null"), (-math.inf, "null"), (2.5e-5, "0.000025"),
    ],
)
def test_numbers_are_written_as_javascript_writes_them(value: float, text: str) -> None:
    assert js_number(value) == text
    assert canonical_json(value) == text
    assert canonical_json([value]) == f"[{text}]"


def test_strings_escape_like_json_stringify() -> None:
    assert canonical_json("\x00\x1f\x7f\u2028\b\f\n\r\t\"\\/é😀") == (
        '"\\u0000\\u001f\x7f\u2028\\b\\f\\n\\r\\t\\"\\\\/é😀"'
    )
    assert canonical_json("a\ud800b") == '"a\\ud800b"'  # lone surrogate: lowercase escape
    assert canonical_json("\udfff") == '"\\udfff"'
    # A surrogate pair held as two code points is the character JavaScript sees.
    assert canonical_json("\ud83d\ude00") == canonical_json("😀")


def test_keys_sort_by_utf16_code_units() -> None:
    # U+FF61 sorts after U+1F600 in code points, before it in UTF-16 code units? No:
    # U+1F600 is D83D DE00 in UTF-16, which sorts before U+FF61.
    value = {"\uff61": 1, "😀": 2, "a": 3}
    assert canonical_json(value) == '{"a":3,"😀":2,"\uff61":1}'
    assert sorted(value) != ["a", "😀", "\uff61"]  # Python's order differs


def test_big_integers_are_exact() -> None:
    assert canonical_json(2**53 + 1) == "9007199254740993"
    assert canonical_json(-(2**80)) == str(-(2**80))
    assert canonical_json({"n": 2**64}) == '{"n":18446744073709551616}'


def test_conversions() -> None:
    class Color(enum.Enum):
        RED = "red"

    class Size(enum.IntEnum):
        BIG = 3

    @dataclasses.dataclass
    class Point:
        x: int
        y: float

    class Model(pydantic.BaseModel):
        b: int
        a: str

    assert canonical_json((1, 2)) == "[1,2]"
    assert canonical_json({1: "a", 2.5: "b", False: "c", None: "d"}) == (
        '{"1":"a","2.5":"b","false":"c","null":"d"}'
    )
    assert canonical_json([Color.RED, Size.BIG]) == '["red",3]'
    assert canonical_json(uuid.UUID(int=1)) == '"00000000-0000-0000-0000-000000000001"'
    assert canonical_json(Point(1, 2.0)) == '{"x":1,"y":2}'
    assert canonical_json(Model(b=1, a="z")) == '{"a":"z","b":1}'


def test_colliding_keys_are_an_error() -> None:
    with pytest.raises(UnsupportedArgumentsError, match="same once converted"):
        canonical_json({1: "a", "1": "b"})


@pytest.mark.parametrize(
    ("value", "type_name"),
    [({"secret-value"}, "set"), (b"secret-value", "bytes"), (object(), "object"),
     ({"k": frozenset({"secret-value"})}, "frozenset"), ([1, {"x": bytearray(b"secret-value")}], "bytearray")],
)
def test_values_json_cannot_express_name_the_type_never_the_value(value: Any, type_name: str) -> None:
    with pytest.raises(UnsupportedArgumentsError) as caught:
        call_hash("tool", value)
    assert isinstance(caught.value, TypeError)
    assert repr(type_name) in str(caught.value)
    assert "secret-value" not in str(caught.value)
    assert "secret-value" not in repr(caught.value)


def test_deep_nesting_is_a_clear_error_not_recursion_error() -> None:
    deep: Any = "x"
    for _ in range(10_000):
        deep = [deep]
    with pytest.raises(UnsupportedArgumentsError, match=f"deeper than {MAX_DEPTH}"):
        call_hash("tool", deep)
    ok: Any = 1
    for _ in range(MAX_DEPTH - 1):
        ok = {"k": ok}
    assert call_hash("tool", ok)


def test_cycles_are_a_clear_error() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(UnsupportedArgumentsError):
        call_hash("tool", loop)


def test_hash_is_sha256_of_tool_newline_canonical() -> None:
    expected = hashlib.sha256(b'search\n{"q":"weather"}').hexdigest()
    assert call_hash("search", {"q": "weather"}) == expected
    assert hash_prefix(expected) == expected[:12]
    assert call_hash("search", {"q": "weather"}) != call_hash("search", {"q": "weather "})


def test_tool_name_must_be_text() -> None:
    with pytest.raises(TypeError):
        call_hash(b"search", {})  # type: ignore[arg-type]


def test_ten_megabyte_arguments_hash() -> None:
    big = {"blob": "x" * (10 * 1024 * 1024)}
    assert len(call_hash("tool", big)) == 64


json_scalars = (
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text()
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=8), children, max_size=5),
    max_leaves=30,
)


def shuffled(value: Any, rng: Any) -> Any:
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rng) for v in value]
    return value


@settings(max_examples=300, deadline=None)
@given(json_values, st.randoms())
def test_key_order_never_changes_the_hash(value: Any, rng: Any) -> None:
    assert call_hash("t", shuffled(value, rng)) == call_hash("t", value)


@settings(max_examples=500, deadline=None)
@given(json_values)
def test_fast_path_equals_exact_path(value: Any) -> None:
    assert canonical_json(value) == _exact(value)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_canonical_json_is_json_of_the_same_value(value: Any) -> None:
    text = canonical_json(value)
    parsed = json.loads(text)
    assert canonical_json(parsed) == text or any(c in text for c in ("\\ud", "null"))


@pytest.mark.parametrize("signs", [0, 1, 62, 63, 64, 65, 66, 300])
@pytest.mark.parametrize("escaped", [False, True])
def test_exponents_after_many_sign_bytes_are_spelled_as_javascript_does(signs: int, escaped: bool) -> None:
    """The exponent search looks at "+" and "-" one by one while they are few (64), then by pairs: an
    exponent's sign before, at and after the switch is found either way, and the same bytes inside a
    string never are."""
    text = 'a\\"1e-5, "' if escaped else "1e-5 and 2e+21 in text"
    for value in (
        ["x-y"] * signs + [1.5e-6, text, 1e-6],  # JavaScript: 0.0000015, orjson: 1.5e-6
        ["x+y"] * signs + [1e16, text, 1.5e17],  # JavaScript: 10000000000000000, orjson: 1e+16
        {"a": [1e-7, 1e21, -2.5e22], "b": ["x-y+z"] * signs + [-1, -1e-9, 12.0, -0.0, text], "c": "v1.0,"},
    ):
        assert canonical_json(value) == _exact(value), signs
    assert canonical_json(["x-y"] * signs + [1.5e-6]).endswith(",0.0000015]" if signs else "[0.0000015]")
    assert canonical_json(["x+y"] * signs + [1e16]).endswith("10000000000000000]")


class _Measured(float):
    """A float subclass with a repr of its own, as numpy's and pandas' scalars have."""

    def __repr__(self) -> str:
        return f"Measured({float(self)!r})"


@pytest.mark.parametrize("value", [1.5, 1e-07, 1e21, 1e16, -0.0, 3.0, 0.1, 123456.789])
def test_a_float_subclass_hashes_as_the_same_float(value: float) -> None:
    import numpy as np

    plain = canonical_json({"a": value, "b": [value]})
    for subclassed in (np.float64(value), _Measured(value)):
        assert canonical_json({"a": subclassed, "b": [subclassed]}) == plain
        assert call_hash("t", {"a": subclassed}) == call_hash("t", {"a": value})


@pytest.mark.parametrize("name", ["int64", "float32", "bool", "Decimal"])
def test_other_number_types_are_refused_naming_the_type_never_the_value(name: str) -> None:
    import decimal

    import numpy as np

    value = {"int64": np.int64(31337), "float32": np.float32(1.25e-7), "bool": np.bool_(True),
             "Decimal": decimal.Decimal("31337.5")}[name]
    with pytest.raises(UnsupportedArgumentsError) as raised:
        call_hash("t", {"a": value})
    # the type's own name: numpy 2's bool is `bool`, numpy 1.26's (the test extra's floor) `bool_`
    assert repr(type(value).__name__) in str(raised.value)
    assert "31337" not in str(raised.value) and "1.25" not in str(raised.value)


def test_an_int_subclass_key_is_written_as_the_int() -> None:
    class Shown(int):
        def __str__(self) -> str:
            return "shown"

    assert canonical_json({Shown(5): 1}) == canonical_json({5: 1}) == '{"5":1}'
