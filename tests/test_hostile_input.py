"""Hostile and bad input: every one a clear error or a correct verdict.

Nothing here may crash with an unexpected exception, hang, or make Redis
hold more than a small, bounded streak record per session, whatever the arguments,
tool name, session id or call id. Covered: configuration from arguments and
the environment (beyond tests/test_config_and_errors.py), backend URLs,
values JSON cannot express, 10k-deep nesting, 10 MB arguments, NaN and
infinities, lone surrogates, 1 MB identifiers, empty strings, control
characters and session ids crafted to collide with other keys; a stateful
model test on the real Redis; and parity of the call identity with Node.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import itertools
import json
import math
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from distbrake import (
    AsyncDistributedBrake,
    BrakeSettings,
    ConfigurationError,
    DistributedBrake,
    InvalidMaxRepeatsError,
    InvalidURLError,
    LoopBrakeError,
    UnsupportedArgumentsError,
    call_hash,
    canonical_json,
    session_key,
)
from tests.backends import memory_url

SECRET_PW = "pw-" + uuid.uuid4().hex  # built at run time: never in a traceback's source line
JS_HELPER = Path(__file__).with_name("js_parity.mjs")
NODE = shutil.which("node") or "/usr/bin/node"
RECORD_BYTES = 1024  # the most one session's record may cost in Redis (MEMORY USAGE)
STORED_BYTES = 400  # the most the record's field names and values may add up to

_prefixes = itertools.count()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DISTBRAKE_MAX_REPEATS", "DSH_LOOP_BRAKE_MAX_REPEATS", "DISTBRAKE_URL",
                 "DISTBRAKE_TTL_SECONDS", "DISTBRAKE_ON_BACKEND_ERROR", "DISTBRAKE_KEY_PREFIX",
                 "DISTBRAKE_TIMEOUT_SECONDS", "DISTBRAKE_TOOL_MAX_REPEATS", "DISTBRAKE_EXEMPT_TOOLS",
                 "DISTBRAKE_RETRY_AFTER_SECONDS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def admin(redis_url: str) -> Iterator[redis.Redis]:
    """A plain client on the (flushed) single node, to look at what the brake stored."""
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def brake(redis_url: str) -> Iterator[DistributedBrake]:
    made = DistributedBrake.from_url(redis_url, on_backend_error="closed", timeout_seconds=5)
    yield made
    made.close()


def record_sizes(client: Any) -> list[tuple[int, int, int]]:
    """(key length, MEMORY USAGE, bytes of every field name and value) of every key."""
    sizes = []
    for key in client.keys("*"):
        stored = client.hgetall(key)
        total = sum(len(name) + len(value) for name, value in stored.items())
        sizes.append((len(key), int(client.memory_usage(key, samples=0)), total))
    return sizes


def counts(brake: DistributedBrake, tool: str, args: Any, n: int, **kw: Any) -> list[int]:
    """The counts of `n` identical checks; negative when denied."""
    out = []
    for _ in range(n):
        try:
            out.append(brake.check(tool, args, **kw).count)
        except LoopBrakeError as error:
            out.append(-error.count)
    return out


# -- configuration from arguments ----------------------------------------------------


@pytest.mark.parametrize("value", [0, -3, 2.5, "abc", "", True, math.nan, math.inf, [3]], ids=repr)
@pytest.mark.parametrize("cls", [DistributedBrake, AsyncDistributedBrake])
def test_bad_max_repeats_given_to_from_url_names_the_argument(cls: Any, value: Any) -> None:
    with pytest.raises(InvalidMaxRepeatsError, match="argument max_repeats"):
        cls.from_url("memory://bad", max_repeats=value)


@pytest.mark.parametrize(
    ("option", "value"),
    [("ttl_seconds", math.nan), ("ttl_seconds", math.inf), ("ttl_seconds", 10 * 365 * 86400 + 1),
     ("ttl_seconds", "soon"), ("timeout_seconds", math.nan), ("timeout_seconds", math.inf),
     ("timeout_seconds", -1), ("timeout_seconds", 61), ("on_backend_error", "CLOSED"),
     ("on_backend_error", ""), ("on_backend_error", 1), ("key_prefix", "x" * 65), ("key_prefix", "a*"),
     ("key_prefix", "a?"), ("key_prefix", "a[b]"), ("key_prefix", "a\nb"), ("key_prefix", "a\x00"),
     ("exempt_tools", "search"), ("tool_max_repeats", [("x", 1)]), ("tool_max_repeats", {1: 2})],
    ids=lambda v: repr(v)[:20],
)
@pytest.mark.parametrize("cls", [DistributedBrake, AsyncDistributedBrake])
def test_bad_settings_given_to_from_url_fail_at_build_naming_the_argument(
    cls: Any, option: str, value: Any
) -> None:
    with pytest.raises(ConfigurationError, match=f"argument {option}"):
        cls.from_url("memory://bad", **{option: value})


@pytest.mark.parametrize("value", [0, -1, math.nan, math.inf, 301])
def test_bad_retry_after_in_a_settings_object_is_refused_without_the_url_password(value: float) -> None:
    url = f"redis://user:{SECRET_PW}@localhost:6379"
    with pytest.raises(ValueError, match="retry_after_seconds") as caught:
        BrakeSettings(retry_after_seconds=value, url=url)
    assert SECRET_PW not in str(caught.value)


# -- configuration from the environment -------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value"),
    [("DISTBRAKE_MAX_REPEATS", "nan"), ("DISTBRAKE_MAX_REPEATS", "inf"), ("DISTBRAKE_MAX_REPEATS", "1e400"),
     ("DISTBRAKE_MAX_REPEATS", "3 4"), ("DSH_LOOP_BRAKE_MAX_REPEATS", "-0"),
     ("DISTBRAKE_TTL_SECONDS", "nan"), ("DISTBRAKE_TTL_SECONDS", "inf"), ("DISTBRAKE_TTL_SECONDS", "0"),
     ("DISTBRAKE_TTL_SECONDS", ""), ("DISTBRAKE_TIMEOUT_SECONDS", "nan"), ("DISTBRAKE_TIMEOUT_SECONDS", "-1"),
     ("DISTBRAKE_TIMEOUT_SECONDS", "61"), ("DISTBRAKE_RETRY_AFTER_SECONDS", "0"),
     ("DISTBRAKE_RETRY_AFTER_SECONDS", "nan"), ("DISTBRAKE_ON_BACKEND_ERROR", "CLOSED"),
     ("DISTBRAKE_ON_BACKEND_ERROR", ""), ("DISTBRAKE_KEY_PREFIX", "a*b"), ("DISTBRAKE_KEY_PREFIX", "{tag}"),
     ("DISTBRAKE_KEY_PREFIX", "x" * 65), ("DISTBRAKE_KEY_PREFIX", ""),
     ("DISTBRAKE_EXEMPT_TOOLS", "not json"), ("DISTBRAKE_EXEMPT_TOOLS", '{"a": 1}'),
     ("DISTBRAKE_TOOL_MAX_REPEATS", "[1]"), ("DISTBRAKE_TOOL_MAX_REPEATS", '{"x": 0}'),
     ("DISTBRAKE_TOOL_MAX_REPEATS", '{"x": "abc"}')],
    ids=lambda v: repr(v)[:24],
)
@pytest.mark.parametrize("cls", [DistributedBrake, AsyncDistributedBrake])
def test_bad_settings_from_the_environment_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, cls: Any, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as caught:
        cls.from_url("memory://env")
    assert variable in str(caught.value)


def test_a_bad_url_in_the_environment_is_refused_without_its_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTBRAKE_URL", f"redis://user:{SECRET_PW}@localhost:70000")
    with pytest.raises(InvalidURLError) as caught:
        DistributedBrake.from_url()
    assert SECRET_PW not in str(caught.value) and SECRET_PW not in repr(caught.value)
    assert "user:***@" in str(caught.value)


def test_a_setting_given_in_code_means_a_bad_variable_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTBRAKE_TTL_SECONDS", "nan")
    monkeypatch.setenv("DISTBRAKE_MAX_REPEATS", "zero")
    brake = DistributedBrake.from_url("memory://code-wins", ttl_seconds=5, max_repeats=2)
    assert (brake.settings.ttl_seconds, brake.max_repeats) == (5, 2)
    brake.close()


# -- backend URLs ------------------------------------------------------------------------


BAD_URLS = [
    "ftp://user:{pw}@example.com/",
    "http://user:{pw}@example.com:6379",
    "redis//user:{pw}@localhost:6379",
    "user:{pw}@localhost:6379",
    "redis://user:{pw}@localhost:0",
    "redis://user:{pw}@localhost:70000",
    "redis://user:{pw}@localhost:abc",
    "redis://user:{pw}@localhost:-1",
    "redis://user:{pw}@localhost:+80",
    "redis://user:{pw}@localhost:6379/abc",
    "redis://user:{pw}@localhost:6379/-1",
    "redis://user:{pw}@:6379",
    "redis://user:{pw}@",
    "redis://user:{pw}@h1:1,h2:2",
    "redis+cluster://user:{pw}@h1:1,,h2:2",
    "redis+cluster://user:{pw}@h1:1/3",
    "redis+sentinel://user:{pw}@h1:26379",
    "redis+sentinel://user:{pw}@h1:26379/",
    "redis+sentinel://user:{pw}@h1:26379/mymaster/abc",
    "redis+unix://user:{pw}@",
    "unix://",
    "redis+unix:///tmp/redis.sock?db=x",
]


@pytest.mark.parametrize("template", BAD_URLS)
@pytest.mark.parametrize("cls", [DistributedBrake, AsyncDistributedBrake])
def test_bad_urls_are_refused_at_build_without_the_password(cls: Any, template: str) -> None:
    url = template.format(pw=SECRET_PW)
    with pytest.raises(InvalidURLError) as caught:
        cls.from_url(url)
    assert isinstance(caught.value, ValueError)
    for text in (str(caught.value), repr(caught.value), repr(caught.value.args)):
        assert SECRET_PW not in text


@pytest.mark.parametrize(
    "url",
    ["redis://localhost:\u00b2", "redis://localhost:\u0663\u0664", "redis://localhost:" + "9" * 5000,
     "redis://localhost:6379/\u00b2", "redis://localhost:6379/" + "9" * 5000,
     "redis+unix:///tmp/x.sock?db=\u00b2"],
    ids=["superscript-port", "arabic-indic-port", "5000-digit-port", "superscript-db", "5000-digit-db",
         "superscript-unix-db"],
)
def test_numbers_in_urls_are_ascii_digits_or_a_clear_error(url: str) -> None:
    """`str.isdigit` is true for "²" and "٣": `int()` then fails with a bare ValueError (or parses)."""
    with pytest.raises(InvalidURLError):
        DistributedBrake.from_url(url)


@pytest.mark.parametrize(
    ("url", "why"),
    [("rediss://localhost:1?ssl_cert_reqs=required&bogus=1", "unknown option 'bogus'"),
     ("redis://localhost:1?max_connections=many", "max_connections must be a number"),
     ("rediss://localhost:1?ssl_check_hostname=maybe", "ssl_check_hostname must be true or false"),
     ("redis://localhost:1?ssl_ca_certs=/x", "unknown option 'ssl_ca_certs'")],
)
@pytest.mark.parametrize("cls", [DistributedBrake, AsyncDistributedBrake])
def test_bad_url_options_are_refused_at_build(cls: Any, url: str, why: str) -> None:
    with pytest.raises(InvalidURLError, match=why):
        cls.from_url(url)


def test_an_unknown_scheme_lists_the_known_ones() -> None:
    with pytest.raises(InvalidURLError) as caught:
        DistributedBrake.from_url(f"mongodb://root:{SECRET_PW}@db:27017")
    text = str(caught.value)
    assert "unknown scheme 'mongodb'" in text and "redis+sentinel://" in text and SECRET_PW not in text


# -- values JSON cannot express ----------------------------------------------------------------


def _deep_list(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def _deep_dict(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


def _cycle() -> Any:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    return loop


@dataclass
class Opaque:
    payload: bytes


UNSUPPORTED = [
    {"s": {1, 2}}, b"bytes", bytearray(b"x"), {"when": datetime.datetime(2024, 1, 1)},
    {"d": datetime.date(2024, 1, 1)}, decimal.Decimal("1.5"), 1 + 2j, object(), {"f": print},
    Opaque(b"x"), [frozenset()], {(1, 2): "tuple key"}, {"r": range(3)},
    _deep_list(10_000), _deep_dict(10_000), _cycle(),
]


@pytest.mark.parametrize(
    "value", UNSUPPORTED,
    ids=[*(type(v).__name__ for v in UNSUPPORTED[:-3]), "deep-list", "deep-dict", "cycle"],
)
async def test_values_json_cannot_express_are_refused_before_redis(
    redis_url: str, admin: redis.Redis, value: Any
) -> None:
    sync = DistributedBrake.from_url(redis_url, on_backend_error="closed")
    aio = AsyncDistributedBrake.from_url(redis_url, on_backend_error="closed")
    try:
        with pytest.raises(UnsupportedArgumentsError) as caught:
            sync.check("tool", value, session_id="s")
        assert not isinstance(caught.value, RecursionError) and isinstance(caught.value, TypeError)
        with pytest.raises(UnsupportedArgumentsError):
            await aio.check("tool", value, session_id="s")
        assert admin.dbsize() == 0  # nothing was written
        # The brake is fine afterwards.
        assert sync.check("tool", {"ok": 1}, session_id="s").count == 1
        assert (await aio.check("tool", {"ok": 1}, session_id="s")).count == 2
    finally:
        sync.close()
        await aio.aclose()


def test_ten_thousand_deep_nesting_is_a_clear_error_not_recursion(brake: DistributedBrake) -> None:
    for deep in (_deep_list(10_000), _deep_dict(10_000), [{"a": _deep_list(9_999)}]):
        with pytest.raises(UnsupportedArgumentsError, match="nested deeper"):
            brake.check("tool", deep)


def test_ten_megabyte_arguments_leave_a_small_record(brake: DistributedBrake, admin: redis.Redis) -> None:
    blob = "x" * (10 * 1024 * 1024)
    args = {"blob": blob, blob[:1024 * 1024]: [blob[:100]] * 10}
    assert counts(brake, "upload", args, 3, session_id="big") == [1, 2, -3]
    assert counts(brake, "upload", {"blob": blob + "y"}, 1, session_id="big") == [1]
    [(key_length, memory, stored)] = record_sizes(admin)
    assert key_length == len(session_key("big"))
    assert memory <= RECORD_BYTES and stored <= STORED_BYTES
    state = brake.inspect("big")
    assert state is not None and state.count == 1 and state.tool_name == "upload"


@pytest.mark.parametrize(
    ("first", "second"),
    [({"x": math.nan}, {"x": None}), ({"x": math.inf}, {"x": None}), ({"x": -math.inf}, {"x": math.nan}),
     ([math.nan, math.inf], [None, None]), ({"x": 1.0}, {"x": 1}), ({"x": -0.0}, {"x": 0})],
    ids=["nan", "inf", "-inf", "list", "integral-float", "negative-zero"],
)
def test_nan_and_infinities_are_null_as_in_javascript(
    brake: DistributedBrake, first: Any, second: Any
) -> None:
    """JSON.stringify writes NaN and ±Infinity as null: such calls are the same call."""
    assert canonical_json(first) == canonical_json(second)
    assert counts(brake, "t", first, 1, session_id="n") == [1]
    assert counts(brake, "t", second, 2, session_id="n") == [2, -3]


# -- lone surrogates, huge and empty identifiers, control characters ---------------------------


LONE = ["\ud800", "\udbff", "\udc00", "\udfff", "a\ud83db", "\ude00\ud83d"]


def test_lone_surrogates_in_args_tool_session_and_call_id(brake: DistributedBrake, admin: redis.Redis) -> None:
    for i, lone in enumerate(LONE):
        session = f"s{lone}{i}"
        assert counts(brake, f"tool{lone}", {"k": lone, lone: [lone]}, 3, session_id=session) == [1, 2, -3]
        # the same call id is a replay: counted once, same verdict
        first = brake.check("t", {"q": lone}, session_id=session, call_id=f"id{lone}")
        again = brake.check("t", {"q": lone}, session_id=session, call_id=f"id{lone}")
        assert (first.count, again.count, again.replayed) == (1, 1, True)
        state = brake.inspect(session)
        assert state is not None and state.count == 1 and state.tool_name == "t"
        assert state.session_id.startswith("s") and state.session_id.endswith(str(i))
    # each lone surrogate is its own argument value, and its own session
    assert len({call_hash("t", {"k": lone}) for lone in LONE}) == len(LONE)
    assert len({session_key(lone) for lone in LONE}) == len(LONE)
    assert admin.dbsize() == len(LONE)
    assert len(list(brake.sessions())) == len(LONE)
    assert all(stored <= STORED_BYTES for _, _, stored in record_sizes(admin))


def test_a_surrogate_pair_held_as_two_code_points_is_the_astral_character(brake: DistributedBrake) -> None:
    assert counts(brake, "t", {"e": "\ud83d\ude00"}, 1, session_id="pair") == [1]
    assert counts(brake, "t", {"e": "😀"}, 1, session_id="pair") == [2]


async def test_lone_surrogates_never_fail_a_whole_async_batch(redis_url: str) -> None:
    """One hostile session id in a coalesced pipeline must not fail the others' checks."""
    aio = AsyncDistributedBrake.from_url(redis_url, on_backend_error="closed")
    try:
        sessions = [f"good-{i}" for i in range(20)] + [f"bad\ud800{i}" for i in range(5)]
        verdicts = await asyncio.gather(*(aio.check("t", {"i": 1}, session_id=s) for s in sessions))
        assert [v.count for v in verdicts] == [1] * len(sessions)
        assert len([s async for s in aio.sessions()]) == len(sessions)
    finally:
        await aio.aclose()


def test_megabyte_identifiers_keep_key_and_value_small(brake: DistributedBrake, admin: redis.Redis) -> None:
    session = "S" * (1024 * 1024)
    tool = "T" * (1024 * 1024)
    call_id = "C" * (1024 * 1024)
    assert counts(brake, tool, {"a": 1}, 2, session_id=session) == [1, 2]
    with pytest.raises(LoopBrakeError) as caught:
        brake.check(tool, {"a": 1}, session_id=session, call_id=call_id)
    assert caught.value.count == 3
    with pytest.raises(LoopBrakeError) as again:  # the same call id: a replay, the same verdict
        brake.check(tool, {"a": 1}, session_id=session, call_id=call_id)
    assert again.value.count == 3
    [(key_length, memory, stored)] = record_sizes(admin)
    assert key_length == len(session_key("x")) and memory <= RECORD_BYTES and stored <= STORED_BYTES
    state = brake.inspect(session)
    assert state is not None
    assert 0 < len(state.session_id) <= 128 and session.startswith(state.session_id)
    assert 0 < len(state.tool_name) <= 64 and tool.startswith(state.tool_name)
    [listed] = brake.sessions()
    assert listed.session_id == state.session_id
    assert brake.clear(session) and admin.dbsize() == 0


def test_multibyte_identifiers_are_cut_on_a_character_boundary(brake: DistributedBrake) -> None:
    session = "é" * 200 + "😀" * 100
    tool = "x" + "😀" * 100
    brake.check(tool, {}, session_id=session)
    state = brake.inspect(session)
    assert state is not None
    assert "\ufffd" not in state.session_id and session.startswith(state.session_id)
    assert "\ufffd" not in state.tool_name and tool.startswith(state.tool_name)


def test_empty_strings_everywhere(brake: DistributedBrake, admin: redis.Redis) -> None:
    assert counts(brake, "", "", 2, session_id="") == [1, 2]
    # "" args, {} and [] and None are all different calls
    different: list[Any] = [{}, [], None, {"": ""}]
    for args in different:
        assert counts(brake, "", args, 1, session_id="") == [1]
    first = brake.check("", {"": ""}, session_id="", call_id="")
    again = brake.check("", {"": ""}, session_id="", call_id="")
    assert (first.count, again.count, again.replayed) == (2, 2, True)
    state = brake.inspect("")
    assert state is not None and (state.session_id, state.tool_name, state.count) == ("", "", 2)
    assert brake.inspect("default") is None  # "" is its own session, not the default one
    assert [s.session_id for s in brake.sessions()] == [""]
    assert admin.dbsize() == 1


CONTROL = ["\x00", "\r\n", "\x1b[31mred\x1b[0m", "\t\x0b\x0c", "\x7f\x85\u2028\u2029", "a\x00b"]


def test_control_characters_are_kept_and_never_confuse_anything(brake: DistributedBrake) -> None:
    for text in CONTROL:
        assert counts(brake, f"tool{text}", {text: text}, 3, session_id=text) == [1, 2, -3]
        state = brake.inspect(text)
        assert state is not None and (state.session_id, state.tool_name, state.count) == (text, f"tool{text}", 3)
    assert sorted(s.session_id for s in brake.sessions()) == sorted(CONTROL)
    assert brake.clear("\x00") and brake.inspect("a\x00b") is not None


def crafted_sessions() -> list[str]:
    victim = "alice"
    return [
        victim, "", "{", "}", "{alice}", "{}", "*", "?", "[", "]", "[a-z]*", ":", "::", "\\", "\\*",
        "distbrake", "distbrake:", "distbrake:abc", "distbrake:*", session_key(victim),
        session_key(victim).split(":", 1)[1], "alice\n", "alice\x00", " alice", "ALICE", "alice*",
        "default", "%s", "${alice}", "a" * 129, "a" * 128,
    ]


@pytest.mark.parametrize("backend", ["single", "cluster"])
def test_crafted_session_ids_get_distinct_keys_and_never_cross_talk(
    request: pytest.FixtureRequest, backend: str
) -> None:
    url = str(request.getfixturevalue("redis_url" if backend == "single" else "cluster_url"))
    sessions = crafted_sessions()
    assert len(set(sessions)) == len(sessions)
    keys = {session_key(s) for s in sessions}
    assert len(keys) == len(sessions)
    assert all(k.startswith("distbrake:") and "{" not in k and "*" not in k for k in keys)
    with DistributedBrake.from_url(url, on_backend_error="closed", max_repeats=100) as brake:
        for round_ in (1, 2):
            for session in sessions:
                assert brake.check("t", {"x": 1}, session_id=session).count == round_
        for session in sessions:
            state = brake.inspect(session)
            assert state is not None and state.count == 2
        listed = [s.session_id for s in brake.sessions()]
        assert sorted(listed) == sorted(s[:128] for s in sessions)  # the 129-char id is shown cut
        # glob characters in session ids never break listing by pattern
        assert [s.session_id for s in brake.sessions("[*]")] == ["*"]
        assert sorted(s.session_id for s in brake.sessions("[[]*")) == ["[", "[a-z]*"]
        assert sorted(s.session_id for s in brake.sessions("distbrake:*")) == sorted(
            ["distbrake:", "distbrake:abc", "distbrake:*", session_key("alice")]
        )
        assert sorted(s.session_id for s in brake.sessions("alice?")) == sorted(["alice\n", "alice\x00", "alice*"])
        # clearing the victim clears nobody else, and vice versa
        assert brake.clear(session_key("alice")) is True
        assert brake.inspect("alice") is not None
        assert brake.clear("alice") is True and brake.inspect("{alice}") is not None
        assert brake.clear_all() == len(sessions) - 2


def test_a_backslash_in_the_key_prefix_is_refused_or_fully_working(redis_url: str) -> None:
    """A backslash escapes the next character in a SCAN pattern: listing must still find the keys."""
    try:
        brake = DistributedBrake.from_url(redis_url, key_prefix="team\\a")
    except ConfigurationError:
        return  # refused at build: fine
    with brake:
        brake.check("t", {}, session_id="s")
        assert [s.session_id for s in brake.sessions()] == ["s"]
        assert brake.clear_all() == 1


@pytest.mark.parametrize("backend", ["memory", "single", "cluster"])
async def test_a_non_ascii_key_prefix_works_on_every_backend(request: pytest.FixtureRequest, backend: str) -> None:
    """The prefix may be any printable text: the key is UTF-8 on the wire, whichever path sends it."""
    if backend == "memory":
        url = memory_url()
    else:
        url = str(request.getfixturevalue("redis_url" if backend == "single" else "cluster_url"))
    prefix = "équipe-团队"
    sync = DistributedBrake.from_url(url, key_prefix=prefix, on_backend_error="closed")
    aio = AsyncDistributedBrake.from_url(url, key_prefix=prefix, on_backend_error="closed")
    try:
        assert sync.check("t", {}, session_id="s").count == 1
        assert (await aio.check("t", {}, session_id="s")).count == 2
        with pytest.raises(LoopBrakeError):
            sync.check("t", {}, session_id="s")
        assert [s.session_id for s in sync.sessions()] == ["s"]
        assert [s.session_id async for s in aio.sessions()] == ["s"]
        assert sync.clear_all() == 1
    finally:
        sync.close()
        await aio.aclose()


# -- the stateful model on the real Redis -----------------------------------------------------------


# (label, value): same label, same call (the canonical JSON is the same).
ARG_CHOICES = [
    ("A", {"a": 1}), ("A", {"a": 1.0}), ("B", {"a": "1"}), ("N", {"x": None}), ("N", {"x": math.nan}),
    ("E", {"b": 1, "a": [2]}), ("E", {"a": [2.0], "b": 1}), ("L", [1, 2]), ("R", [2, 1]), ("S", "\ud800"),
]
TOOL_LIMITS = {"one": 1, "five": 5}  # every other tool: 3
SESSION_CHOICES = ["s1", "s2", "", "*", "{s1}", "distbrake:s1", "s1\n", "\x00", "z" * 200]
CALL_IDS = [None, None, None, "id1", "id2", "id3", ""]


@dataclass
class ModelRecord:
    call: tuple[str, str]
    count: int
    last: str | None  # None: a random id no later call can repeat
    previous: str | None


class Model:
    """The rule of lua/brake.lua: same call -> n + 1, unless its call id is the last (same count)
    or the previous one (n - 1) of the streak: a replay; a different call -> 1."""

    def __init__(self) -> None:
        self.records: dict[str, ModelRecord] = {}

    def check(self, session: str, call: tuple[str, str], call_id: str | None) -> tuple[int, bool]:
        record = self.records.get(session)
        if record is not None and record.call == call:
            if call_id is not None and call_id == record.last:
                return record.count, True
            if call_id is not None and record.count > 1 and call_id == record.previous:
                return record.count - 1, True
            self.records[session] = ModelRecord(call, record.count + 1, call_id, record.last)
        else:
            self.records[session] = ModelRecord(call, 1, call_id, None)
        return self.records[session].count, False


def test_distributed_brake_matches_the_reference_model_on_real_redis(redis_url: str) -> None:
    class BrakeMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.prefix = f"model{next(_prefixes)}"
            self.brake = DistributedBrake.from_url(
                redis_url, key_prefix=self.prefix, tool_max_repeats=TOOL_LIMITS, on_backend_error="closed",
                timeout_seconds=5,
            )
            self.model = Model()

        @rule(
            session=st.sampled_from(SESSION_CHOICES), tool=st.sampled_from(["one", "three", "five"]),
            args=st.sampled_from(ARG_CHOICES), call_id=st.sampled_from(CALL_IDS),
        )
        def check(self, session: str, tool: str, args: tuple[str, Any], call_id: str | None) -> None:
            label, value = args
            expected, replayed = self.model.check(session, (tool, label), call_id)
            limit = TOOL_LIMITS.get(tool, 3)
            try:
                verdict = self.brake.check(tool, value, session_id=session, call_id=call_id)
            except LoopBrakeError as error:
                assert expected >= limit, (expected, limit)
                assert (error.count, error.max_repeats, error.session_id) == (expected, limit, session)
            else:
                assert expected < limit, (expected, limit)
                assert (verdict.count, verdict.replayed, verdict.decided_by) == (expected, replayed, "redis")

        @rule(session=st.sampled_from(SESSION_CHOICES))
        def clear(self, session: str) -> None:
            assert self.brake.clear(session) is (self.model.records.pop(session, None) is not None)

        @rule(session=st.sampled_from(SESSION_CHOICES))
        def inspect(self, session: str) -> None:
            state = self.brake.inspect(session)
            record = self.model.records.get(session)
            if record is None:
                assert state is None
                return
            assert state is not None
            assert (state.count, state.tool_name, state.session_id) == (record.count, record.call[0], session[:128])

        @rule()
        def listing(self) -> None:
            listed = sorted((s.session_id, s.count) for s in self.brake.sessions())
            assert listed == sorted((k[:128], v.count) for k, v in self.model.records.items())

        def teardown(self) -> None:
            self.brake.clear_all()
            self.brake.close()

    run_state_machine_as_test(
        BrakeMachine,
        settings=settings(max_examples=40, stateful_step_count=30, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )


# -- parity of the call identity with Node ------------------------------------------------------------


LONE_SURROGATES = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff", "\ud83d", "\ude00"])
CHARS = st.one_of(
    st.characters(codec="utf-8"),  # any code point but surrogates
    st.characters(min_codepoint=0x10000),  # astral: key order differs in UTF-16
    LONE_SURROGATES,
    st.sampled_from(["\x00", "\n", '"', "\\", "\u2028", "\x7f", "\ufeff", "é", "\uff61", "😀"]),
)
TEXT = st.lists(CHARS, max_size=8).map("".join)
KEYS = TEXT | st.sampled_from(["__proto__", "constructor", "1", "01", "-1", "1.5", "a", "A", "", "10", "2"])
FLOATS = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(
    [1e21, 1e-7, -0.0, 0.0, 1.0, -1.0, 2.0**53, 1e16, 1e20, 1e-6, 5e-324, 1.7976931348623157e308,
     0.1, 123e-20, 1.5e300, -2.5e-8, 100.0, 4.35, 0.000001234]
)
INTS = st.integers(min_value=-(2**53), max_value=2**53) | st.sampled_from([0, -1, 2**53, -(2**53), 10**15])
SCALARS = st.none() | st.booleans() | INTS | FLOATS | TEXT
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(KEYS, children, max_size=6),
    max_leaves=40,
)


def node_identities(examples: list[tuple[str, Any]]) -> list[dict[str, str]]:
    """Canonical JSON and hash of every example, computed by one `node` process."""
    lines = "".join(json.dumps({"tool": t, "args": a}, ensure_ascii=True) + "\n" for t, a in examples)
    result = subprocess.run(
        [NODE, str(JS_HELPER)], input=lines.encode("ascii"), capture_output=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    # split on "\n" only: U+2028 and friends stand unescaped inside the JSON text
    out = [json.loads(line) for line in result.stdout.decode("utf-8").split("\n") if line]
    assert len(out) == len(examples)
    return out


def test_call_identity_matches_node_on_generated_values() -> None:
    examples: list[tuple[str, Any]] = []

    @settings(max_examples=600, deadline=None, database=None)
    @given(tool=TEXT, args=JSON_VALUES)
    def collect(tool: str, args: Any) -> None:
        try:
            canonical_json(args)
        except UnsupportedArgumentsError:  # "\ud83d\ude00" and "😀" as keys of one object: JS has one key
            return
        examples.append((tool, args))

    collect()
    fixed: list[tuple[str, Any]] = [
        ("t", {"b": 1e21, "a": 1e-7, "c": -0.0, "d": [1.0, 2.0**53, 1e-6]}),
        ("t\ud800", {"\ud800": "\udfff", "\ud83d\ude00": "😀", "\uff61": 1, "\U0001f601": 2}),
        ("", {"__proto__": {"x": 1}, "10": 1, "9": 2, "a": {"B": 1, "a": 2}}),
        ("t", [[[[[]]]], {}, "", None, True, False, -(2**53), 2**53]),
    ]
    examples.extend(fixed)
    assert len(examples) > 300
    with pytest.raises(UnsupportedArgumentsError, match="same once converted"):
        canonical_json({"\ud83d\ude00": 1, "😀": 2})  # one key for JavaScript: refused, never guessed
    for (tool, args), node in zip(examples, node_identities(examples), strict=True):
        assert canonical_json(args) == node["canonical"], (tool, args)
        assert call_hash(tool, args) == node["sha256"], (tool, args)


def test_node_helper_sorts_keys_like_javascript_default_sort() -> None:
    """A self-check of the helper: Object.keys order is not sorted order for integer-like keys."""
    [node] = node_identities([("t", {"b": 1, "10": 2, "9": 3, "a": {"z": 1, "A": 2}})])
    assert node["canonical"] == '{"10":2,"9":3,"a":{"A":2,"z":1},"b":1}'


# -- hypothesis: arbitrary identifiers on the real Redis --------------------------------------------


IDENTIFIERS = st.lists(CHARS, max_size=300).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tool=IDENTIFIERS, session=IDENTIFIERS, call_id=st.none() | IDENTIFIERS, args=JSON_VALUES)
def test_any_identifiers_give_a_verdict_and_a_small_record(
    brake: DistributedBrake, admin: redis.Redis, tool: str, session: str, call_id: str | None, args: Any
) -> None:
    admin.flushdb()
    first = brake.check(tool, args, session_id=session, call_id=call_id)
    second = brake.check(tool, args, session_id=session, call_id=call_id)
    assert first.count == 1
    assert (second.count, second.replayed) == ((1, True) if call_id is not None else (2, False))
    [(key_length, memory, stored)] = record_sizes(admin)
    assert key_length == len(session_key("")) and memory <= RECORD_BYTES and stored <= STORED_BYTES
    state = brake.inspect(session)
    assert state is not None and state.count == second.count

