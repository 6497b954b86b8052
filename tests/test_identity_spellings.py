"""Call identity does not depend on orjson's version (issue 27, item 2).

orjson spells exponents differently across the releases distbrake supports: 3.10 writes `1e16`
and `1e-7`, 3.11.7 and later `1e+16` and `1e-7`. The float fix-up is fed each spelling (sign or
none, `e` or `E`) directly, and the whole identity is run against an orjson that writes the old
spelling: every call hashes as JavaScript's does either way.
"""

from __future__ import annotations

import json
import random
import types
from pathlib import Path
from typing import Any

import orjson
import pytest

from distbrake import call_hash, canonical_json, identity
from distbrake.identity import _exact, _fix_floats, _float_candidates

VECTORS = Path(__file__).parent / "data" / "call_hash.jsonl"

# (a spelling some orjson writes or could write, the text JavaScript writes for that number)
SPELLINGS = [
    (b"1e16", b"10000000000000000"),
    (b"1e+16", b"10000000000000000"),
    (b"1E16", b"10000000000000000"),
    (b"1E+16", b"10000000000000000"),
    (b"-1e20", b"-100000000000000000000"),
    (b"1.2345e17", b"123450000000000000"),
    (b"1.2345E+17", b"123450000000000000"),
    (b"1e21", b"1e+21"),
    (b"1e+21", b"1e+21"),
    (b"1E21", b"1e+21"),
    (b"-2.5e22", b"-2.5e+22"),
    (b"1.7976931348623157e308", b"1.7976931348623157e+308"),
    (b"1.5e-7", b"1.5e-7"),
    (b"1.5E-7", b"1.5e-7"),
    (b"1e-6", b"0.000001"),
    (b"1E-6", b"0.000001"),
    (b"2.5e-5", b"0.000025"),
    (b"5e-324", b"5e-324"),
    (b"12.0", b"12"),
    (b"-0.0", b"0"),
]


def fixed(data: bytes, signed: bool = False) -> bytes:
    """The fix-up as canonical_json runs it on orjson's output `data`."""
    candidates = _float_candidates(data, signed)
    return _fix_floats(data, candidates) if candidates else data


@pytest.mark.parametrize(("spelled", "js"), SPELLINGS, ids=lambda s: s.decode())
def test_the_fix_up_respells_every_spelling_as_javascript_does(spelled: bytes, js: bytes) -> None:
    documents = [
        (b"%s", b"%s"),
        (b"[%s]", b"[%s]"),
        (b'{"a":%s,"b":"x"}', b'{"a":%s,"b":"x"}'),
        (b'[%s,"1e16 1E16 1e+16 v1.0,",%s]', b'[%s,"1e16 1E16 1e+16 v1.0,",%s]'),  # a string keeps its bytes
        (b'{"k\\"":%s,"s":"a\\"1e5"}', b'{"k\\"":%s,"s":"a\\"1e5"}'),  # escaped quotes are inside strings
    ]
    for document, expected in documents:
        holes = document.count(b"%s")
        data = document % ((spelled,) * holes)
        assert fixed(data) == expected % ((js,) * holes), data
        assert json.loads(fixed(data)) == json.loads(data)  # the same numbers
        if (b"e+" in spelled or b"e-" in spelled) and b"E" not in spelled:  # what the quick search finds
            assert fixed(data, signed=True) == expected % ((js,) * holes), data


def test_strings_that_look_like_exponents_are_never_touched() -> None:
    data = b'["1e16","x1E5,","2e-7]","t1e21}",{"k1e16":"9E9"}]'
    assert fixed(data) == data
    assert fixed(data, signed=True) == data


def test_the_quick_search_is_chosen_only_for_an_orjson_that_writes_signed_exponents() -> None:
    written = orjson.dumps([1e16, 1e-7])
    assert identity.SIGNED_EXPONENTS is (written == b"[1e+16,1e-7]")


def old_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make identity use an orjson that writes positive exponents unsigned, as orjson 3.10 does."""
    real = orjson.dumps

    def dumps(value: Any, default: Any = None, option: int | None = None) -> bytes:
        data = real(value, default=default, option=option)
        # Only numbers hold "<digit>e+<digit>" in the documents used here (their strings have none).
        return data.replace(b"e+", b"e")

    fake = types.SimpleNamespace(dumps=dumps, JSONEncodeError=orjson.JSONEncodeError)
    monkeypatch.setattr(identity, "orjson", fake)
    monkeypatch.setattr(identity, "SIGNED_EXPONENTS", identity._signed_exponents_only())


def float_documents() -> list[Any]:
    rng = random.Random(27)
    small = [rng.random() * 10.0 ** rng.randint(-30, 30) * rng.choice((1, -1)) for _ in range(200)]
    small += [1e16, 1e21, 1e-7, 12.0, -0.0, 1.5e300, 5e-324]
    large = {"values": small * 20, "text": "the free tree " * 500, "n": list(range(100))}
    return [small, {"a": small[:5], "b": {"c": 1e16}}, large, [{"x": v, "name": "e1"} for v in small]]


def test_an_orjson_writing_1e16_gives_the_same_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    documents = float_documents()
    vectors = [json.loads(line) for line in VECTORS.read_text(encoding="utf-8").split("\n") if line]
    before = [canonical_json(document) for document in documents]
    assert before == [_exact(document) for document in documents]
    old_orjson(monkeypatch)
    assert identity.SIGNED_EXPONENTS is False
    assert identity.orjson.dumps([1e16]) == b"[1e16]"
    assert [canonical_json(document) for document in documents] == before
    assert len(before[2]) > 2048  # a large output too, past the one-regex-pass size
    for vector in vectors:
        assert call_hash(vector["tool"], json.loads(vector["args_json"])) == vector["sha256"], vector["prefix"]
