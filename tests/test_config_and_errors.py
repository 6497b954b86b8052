"""Configuration precedence and validation (SPEC §3) and the error (SPEC §5)."""

from __future__ import annotations

import logging
import pickle
from typing import Any

import pytest

from distbrake import (
    AsyncDistributedBrake,
    BrakeSettings,
    ConfigurationError,
    DistributedBrake,
    InvalidMaxRepeatsError,
    InvalidURLError,
    LoopBrake,
    LoopBrakeError,
    normalize_max_repeats,
    resolve_max_repeats,
)

SECRET = "sk-live-SECRET-7f3a"
BAD_VALUES = [True, False, 0, -1, 2.5, "abc", "", None, float("nan"), float("inf"), [3], "2.5"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DISTBRAKE_MAX_REPEATS", "DSH_LOOP_BRAKE_MAX_REPEATS", "DISTBRAKE_URL",
                 "DISTBRAKE_TTL_SECONDS", "DISTBRAKE_ON_BACKEND_ERROR", "DISTBRAKE_KEY_PREFIX",
                 "DISTBRAKE_TIMEOUT_SECONDS", "DISTBRAKE_TOOL_MAX_REPEATS", "DISTBRAKE_EXEMPT_TOOLS"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("value", [1, 3, 5.0, "7", " 8 ", "9.0", 10**6])
def test_good_max_repeats(value: Any) -> None:
    assert normalize_max_repeats(value) == int(float(str(value).strip()))
    assert LoopBrake(value).max_repeats == int(float(str(value).strip()))


@pytest.mark.parametrize("value", BAD_VALUES, ids=repr)
def test_bad_max_repeats_from_code_fails_at_build_naming_the_argument(value: Any) -> None:
    with pytest.raises(InvalidMaxRepeatsError, match="argument max_repeats"):
        if value is None:
            normalize_max_repeats(value, "argument max_repeats")
        else:
            LoopBrake(value)
    with pytest.raises(InvalidMaxRepeatsError):
        normalize_max_repeats(value)


@pytest.mark.parametrize("variable", ["DISTBRAKE_MAX_REPEATS", "DSH_LOOP_BRAKE_MAX_REPEATS"])
@pytest.mark.parametrize("value", ["0", "-1", "2.5", "abc", "", "true"])
def test_bad_max_repeats_from_environment_fails_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    for build in (LoopBrake, lambda: DistributedBrake.from_url("memory://cfg"),
                  lambda: AsyncDistributedBrake.from_url("memory://cfg"), resolve_max_repeats):
        with pytest.raises(InvalidMaxRepeatsError, match=variable):
            build()


def test_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_max_repeats() == 3 and LoopBrake().max_repeats == 3
    monkeypatch.setenv("DSH_LOOP_BRAKE_MAX_REPEATS", "4")
    assert resolve_max_repeats() == 4 and LoopBrake().max_repeats == 4
    monkeypatch.setenv("DISTBRAKE_MAX_REPEATS", "5")
    assert resolve_max_repeats() == 5 and LoopBrake().max_repeats == 5
    assert resolve_max_repeats(6) == 6 and LoopBrake(6).max_repeats == 6
    assert LoopBrake(settings=BrakeSettings(max_repeats=7)).max_repeats == 7
    # a value given in code means the environment is not read at all
    monkeypatch.setenv("DISTBRAKE_MAX_REPEATS", "not-a-number")
    assert resolve_max_repeats(2) == 2 and LoopBrake(2).max_repeats == 2
    assert resolve_max_repeats(configured=None, environ={}) == 3


def test_a_settings_object_replaces_the_configuration_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    first = BrakeSettings(max_repeats=9, ttl_seconds=5, key_prefix="first")
    second = BrakeSettings(max_repeats=2)
    brake = LoopBrake(settings=second)
    assert brake.settings.ttl_seconds == 3600 and brake.settings.key_prefix == "distbrake"
    assert LoopBrake(settings=first).settings.key_prefix == "first"
    # explicit arguments still win over the settings object
    assert LoopBrake(4, settings=first).max_repeats == 4
    assert LoopBrake(4, settings=first).settings.ttl_seconds == 5


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISTBRAKE_TTL_SECONDS", "12.5")
    monkeypatch.setenv("DISTBRAKE_KEY_PREFIX", "fleet-a")
    monkeypatch.setenv("DISTBRAKE_ON_BACKEND_ERROR", "closed")
    monkeypatch.setenv("DISTBRAKE_TOOL_MAX_REPEATS", '{"poll": 10}')
    monkeypatch.setenv("DISTBRAKE_EXEMPT_TOOLS", '["heartbeat"]')
    settings = DistributedBrake.from_url("memory://env").settings
    assert settings.ttl_seconds == 12.5 and settings.key_prefix == "fleet-a"
    assert settings.on_backend_error == "closed"
    assert settings.limit_for("poll") == 10 and settings.limit_for("heartbeat") is None
    assert settings.limit_for("other") == 3


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("ttl_seconds", 0, ConfigurationError), ("ttl_seconds", -1, ConfigurationError),
        ("timeout_seconds", 0, ConfigurationError), ("timeout_seconds", "x", ConfigurationError),
        ("on_backend_error", "maybe", ConfigurationError), ("key_prefix", "a b", ConfigurationError),
        ("key_prefix", "x{y}", ConfigurationError), ("key_prefix", "", ConfigurationError),
        ("tool_max_repeats", {"poll": 0}, InvalidMaxRepeatsError),
        ("tool_max_repeats", {"poll": True}, InvalidMaxRepeatsError),
    ],
)
def test_bad_settings_fail_at_build_naming_the_argument(option: str, value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=option):
        DistributedBrake.from_url("memory://bad", **{option: value})


@pytest.mark.parametrize(
    ("variable", "value"),
    [("DISTBRAKE_TTL_SECONDS", "-5"), ("DISTBRAKE_TIMEOUT_SECONDS", "soon"),
     ("DISTBRAKE_ON_BACKEND_ERROR", "sometimes"), ("DISTBRAKE_TOOL_MAX_REPEATS", "{bad json"),
     ("DISTBRAKE_URL", "ftp://example")],
)
def test_bad_settings_from_environment_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises((ConfigurationError, InvalidURLError)) as caught:
        DistributedBrake.from_url()
    assert variable in str(caught.value) or "ftp" in str(caught.value)


def test_exempt_and_limited_at_once_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="both exempt"):
        LoopBrake(tool_max_repeats={"x": 2}, exempt_tools={"x"})


def test_unknown_setting_is_a_type_error() -> None:
    from distbrake.settings import load_settings

    with pytest.raises(TypeError, match="unknown setting"):
        load_settings(max_repeat=3)


# -- the error -----------------------------------------------------------------------


def denied(secret_args: Any) -> LoopBrakeError:
    brake = LoopBrake()
    for _ in range(2):
        brake.check("read_file", secret_args, session_id="sess-1")
    with pytest.raises(LoopBrakeError) as caught:
        brake.check("read_file", secret_args, session_id="sess-1")
    return caught.value


def test_error_text_and_attributes() -> None:
    error = denied({"q": "weather"})
    assert str(error) == (
        'loop brake: tool "read_file" called 3 times in a row with identical arguments '
        f"(call {error.hash_prefix}\u2026, limit 3); the call was denied before it ran. "
        "Change the arguments, call a different tool, or stop."
    )
    assert error.code == "LOOP_BRAKE" and error.plugin == "distbrake"
    assert (error.tool_name, error.count, error.max_repeats, error.session_id) == ("read_file", 3, 3, "sess-1")
    assert len(error.hash_prefix) == 12 and int(error.hash_prefix, 16) >= 0
    assert isinstance(error, Exception)


def test_error_pickles() -> None:
    error = denied({"q": 1})
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is LoopBrakeError and str(copy) == str(error)
    assert (copy.count, copy.hash_prefix, copy.session_id, copy.code) == (
        error.count, error.hash_prefix, error.session_id, "LOOP_BRAKE"
    )


def test_arguments_never_reach_the_error_or_the_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for logger in ("distbrake", ""):
        logging.getLogger(logger).setLevel(logging.DEBUG)
    error = denied({"path": "/home/x/.ssh/id_rsa", "token": SECRET})
    surfaces = [
        str(error), repr(error), repr(error.args), repr(vars(error)), pickle.dumps(error).decode("latin-1"),
        caplog.text, repr(error.__cause__), repr(error.__context__),
    ]
    for text in surfaces:
        assert SECRET not in text and "id_rsa" not in text
    assert "denied" in caplog.text and error.hash_prefix in caplog.text


@pytest.mark.parametrize("bad", [
    {"DISTBRAKE_WARN_AT": "9"},
    {"DISTBRAKE_TOOLS": '{"a": {"warn_at": 9}}'},
    {"DISTBRAKE_TIMEOUT_SECONDS": "abc"},
    {"DISTBRAKE_TOOLS": "not json"},
])
def test_settings_built_directly_never_show_the_urls_password(
    monkeypatch: pytest.MonkeyPatch, bad: dict[str, str]
) -> None:
    import traceback

    from distbrake import BrakeSettings, ConfigurationError

    monkeypatch.setenv("DISTBRAKE_URL", "redis://:hunter2@localhost:6379")
    for name, value in bad.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as raised:
        BrakeSettings()
    shown = "".join(traceback.format_exception(raised.value, chain=True))
    assert "hunter" not in shown and "hunter" not in repr(raised.value.__context__)
    assert "DISTBRAKE_" in str(raised.value)  # names the variable


def test_a_parsed_urls_repr_holds_no_secret() -> None:
    from distbrake import BrakeSettings

    settings = BrakeSettings(url="redis+sentinel://:pw-one@h:26379/mymaster?sentinel_password=pw-two")
    assert "pw-one" not in repr(settings.parsed_url) and "pw-two" not in repr(settings.parsed_url)
    assert "pw-" not in repr(settings)


# -- silent defaults, said (issue 23.13) ------------------------------------------------------------


def test_checks_without_a_session_share_default_and_say_so_once(caplog: pytest.LogCaptureFixture) -> None:
    from distbrake import LoopBrake

    brake = LoopBrake()
    with caplog.at_level(logging.WARNING, logger="distbrake"):
        for _ in range(2):
            assert brake.check("search", {"agent": 1}).session_id == "default"
        assert brake.check("search", {}, session_id="named").session_id == "named"
    said = [r for r in caplog.records if 'session "default"' in r.getMessage()]
    assert len(said) == 1 and "require_session" in said[0].getMessage()


@pytest.mark.parametrize("kind", ["loop", "sync"])
def test_require_session_refuses_a_check_that_names_none(kind: str) -> None:
    from distbrake import DistributedBrake, LoopBrake, MissingSessionError, bind_session

    brake = LoopBrake(require_session=True) if kind == "loop" else DistributedBrake.from_url(
        "memory://require", require_session=True)
    with pytest.raises(MissingSessionError, match="names no session"):
        brake.check("search", {})
    assert brake.check("search", {}, session_id="").session_id == ""  # an id, even an empty one, names one
    assert brake.check("search", {}, context={"session_id": "ctx"}).session_id == "ctx"
    with bind_session("bound"):
        assert brake.check("search", {}).session_id == "bound"


def test_a_misspelled_variable_is_named_with_the_closest_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from distbrake import BrakeSettings

    monkeypatch.setenv("DISTBRAKE_MAXREPEATS", "5")
    monkeypatch.setenv("DISTBRAKE_SOMETHING_OF_MINE", "x")  # not close to any setting: not ours to judge
    monkeypatch.setenv("DISTBRAKE_AGENTS_PREFIX", "/tmp/agents")  # close to DISTBRAKE_KEY_PREFIX, but distbrake's own
    with pytest.warns(RuntimeWarning, match="DISTBRAKE_MAXREPEATS is not a setting.*DISTBRAKE_MAX_REPEATS") as seen:
        assert BrakeSettings().max_repeats == 3
    assert not [w for w in seen if "SOMETHING" in str(w.message) or "AGENTS" in str(w.message)]


def test_a_bad_limit_beside_a_settings_object_is_an_invalid_max_repeats_error() -> None:
    from distbrake import DistributedBrake, InvalidMaxRepeatsError, LoopBrake

    settings = BrakeSettings()
    with pytest.raises(InvalidMaxRepeatsError, match=r"^invalid max_repeats 0 from argument max_repeats"):
        LoopBrake(0, settings=settings)
    with pytest.raises(InvalidMaxRepeatsError, match=r"^invalid max_repeats 0 from argument max_repeats"):
        DistributedBrake.from_url("memory://bad-limit", settings=settings, max_repeats=0)
    with pytest.raises(ConfigurationError, match=r"^invalid warn_at from argument warn_at"):
        LoopBrake(settings=settings, warn_at=0)
