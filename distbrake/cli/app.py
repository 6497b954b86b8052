"""The state of one run, on click's `ctx.obj`: global options, output mode, backend, secrets; opening a brake."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import click

from ..errors import DistbrakeError

if TYPE_CHECKING:  # imported when first used: `--help` and `--version` load no Redis client
    from ..redis.sync import DistributedBrake
    from ..settings import BrakeSettings, FailurePolicy
    from ..urls import ParsedURL

# Every command: its module (where its function is `<name>_command`) and its one-line help (what
# `--help` lists without importing any command). A command's module is imported when it runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "inspect": ("sessions", "One session's streak (exit 1 when there is none)."),
    "list": ("sessions", "Sessions with streaks, longest first."),
    "clear": ("sessions", "Forget streaks (and lift halts): SESSION... or --all --yes."),
    "block": ("blocks", "Halt sessions (SESSION..., --match GLOB) or every session (--all --yes)."),
    "unblock": ("blocks", "Lift halts: SESSION..., --match GLOB, or the kill switch (--all)."),
    "hash": ("calls", "The call hash of TOOL + ARGS_JSON, computed locally."),
    "check": ("calls", "Count one call as a worker would (exit 3 when denied)."),
    "doctor": ("doctor", "Diagnose connection, mode, script, permissions, config."),
    "bench": ("bench", "Measure the brake on your backend: checks/s, latency, CPU, memory."),
    "demo": ("demo", "A small fleet with one stuck agent: watch the brake stop it."),
    "stats": ("fleet", "Denials and warnings per tool per minute, across the fleet."),
    "top": ("fleet", "A live view: longest streaks, denials per tool, backend health."),
    "hook": ("hook", "A coding agent's tool hook: claude-code, codex, gemini or cursor."),
    "serve": ("serve", "HTTP: the hosts' hooks, a JSON check API, health and metrics."),
    "proxy": ("proxy", "An MCP server in front of another, the brake on every tool call."),
}
# The password of a URL that does not parse (the library's own error redacts it; this finds it to scrub).
_PASSWORD_OF_BAD_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^@/?#]*?:([^@/?#]*)@")


@dataclass
class App:
    """One run of `distbrake`: what the global options asked for, and what the run has learnt.

    `main` makes it and hands it to click (`obj=`), so the error path still
    has it after click raised; commands get it with `click.pass_obj`.
    """

    url: str | None = None
    timeout: float | None = None
    key_prefix: str | None = None
    max_repeats: int | None = None
    env_url: str | None = None  # DISTBRAKE_URL when the options were read: its password is secret too
    json: bool = False  # --json, before or after the command name
    _settings: dict[FailurePolicy | None, BrakeSettings] = field(default_factory=dict, repr=False)
    _secrets: frozenset[str] | None = field(default=None, repr=False)
    _urls: list[str] = field(default_factory=list, repr=False)  # every --url given: all secret

    def want_json(self, value: bool) -> bool:
        """Note a `--json` flag; JSON once any `--json` was given."""
        self.json = self.json or value
        return self.json

    def set_option(self, name: str, value: Any) -> None:
        """A global option's value (`url`, `timeout`, `key_prefix`, `max_repeats`); None: not given.

        Given before the command and again after it, the later one wins.
        """
        if value is None:
            return
        if name not in GLOBAL_OPTION_NAMES:
            raise ValueError(f"not a global option: {name}")
        setattr(self, name, value)
        if name == "url":
            self._urls.append(value)
        self._settings.clear()
        self._secrets = None

    def remember_url(self, url: str) -> None:
        """Another URL of this run (a command's own option): its password is secret too."""
        self._urls.append(url)
        self._secrets = None

    def given(self) -> dict[str, Any]:
        """The settings given on the command line (the "argument" source)."""
        return {
            "url": self.url, "timeout_seconds": self.timeout, "key_prefix": self.key_prefix,
            "max_repeats": self.max_repeats,
        }

    def settings(self, on_backend_error: FailurePolicy | None = None) -> BrakeSettings:
        """The effective settings (these options > DISTBRAKE_* variables > defaults), resolved once.

        Their URL is parsed then, once; `on_backend_error` overrides the policy
        (and its variable is then not read).
        """
        if on_backend_error not in self._settings:
            from ..redis.sync import DistributedBrake

            options = {k: v for k, v in self.given().items() if k != "url"}
            self._settings[on_backend_error] = DistributedBrake.settings_for_url(
                self.url, None, on_backend_error=on_backend_error, **options)
        return self._settings[on_backend_error]

    @property
    def resolved(self) -> BrakeSettings | None:
        """The settings of this run once resolved (any policy: the backend is the same), else None."""
        return next(iter(self._settings.values()), None)

    @property
    def backend(self) -> str:
        """The backend as messages show it (password redacted); `DEFAULT_URL` until it is known."""
        from ..settings import DEFAULT_URL

        return self.resolved.shown_url if self.resolved else DEFAULT_URL

    @property
    def timeout_seconds(self) -> float:
        """The effective timeout, for messages (the default until the settings are known)."""
        if self.resolved:
            return self.resolved.timeout_seconds
        from ..settings import BrakeSettings

        default: float = BrakeSettings.model_fields["timeout_seconds"].default
        return default

    @property
    def secrets(self) -> frozenset[str]:
        """The passwords of --url and DISTBRAKE_URL, in every spelling a message may use."""
        if self._secrets is None:
            found: set[str] = set()
            for url in (self.url, self.env_url, *self._urls):
                for secret in self._passwords(url) if url else ():
                    if len(secret) >= 3:
                        found.update({secret, unquote(secret), quote(secret, safe="")})
            self._secrets = frozenset(found)
        return self._secrets

    def _passwords(self, url: str) -> list[str]:
        parsed: ParsedURL | None
        if self.resolved is not None and self.resolved.url == url:
            parsed = self.resolved.parsed_url  # the run's own URL: parsed already
        else:
            from ..urls import parse_url

            try:
                parsed = parse_url(url)
            except DistbrakeError:
                parsed = None
        if parsed is None:
            match = _PASSWORD_OF_BAD_URL.match(url)
            return [match.group(1)] if match else []
        return [parsed.password or "", parsed.options.get("sentinel_password", "")]

    @contextlib.contextmanager
    def open(self, on_backend_error: FailurePolicy | None = None) -> Iterator[DistributedBrake]:
        """A brake on the run's backend (see `settings`), closed afterwards."""
        from ..redis.sync import DistributedBrake

        brake = DistributedBrake.from_url(settings=self.settings(on_backend_error), otel=False)
        try:
            yield brake
        finally:
            with contextlib.suppress(Exception):
                brake.close()


def _remember_json(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    return ctx.ensure_object(App).want_json(value)


def _remember_option(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if param.name is not None:
        ctx.ensure_object(App).set_option(param.name, value)
    return value


GLOBAL_OPTION_NAMES = ("url", "timeout", "key_prefix", "max_repeats")
_AFTER = " Global: also before the command name (given both ways, this one wins)."


def global_options(after_command: bool) -> list[click.Option]:
    """--url, --timeout, --key-prefix, --max-repeats and --json: on the group, and on every command.

    On the group (`after_command=False`) their values go to the group's
    function; on a command they are stored on the run's `App` as they are
    parsed (after the group's, so the later one wins) and the command's
    function sees only `as_json`.
    """
    extra: dict[str, Any] = (
        {"callback": _remember_option, "expose_value": False} if after_command else {})
    tail = _AFTER if after_command else " Also accepted after the command name."
    return [
        click.Option(["--url", "url"], metavar="URL", default=None, **extra,
                     help="Backend URL (default: $DISTBRAKE_URL, else memory://); passwords "
                          "are never shown." + tail),
        click.Option(["--timeout", "timeout"], metavar="SECONDS", default=None,
                     type=click.FloatRange(0, 60, min_open=True), **extra,
                     help="Longest wait for Redis, per operation (default: "
                          "$DISTBRAKE_TIMEOUT_SECONDS, else 0.5)." + tail),
        click.Option(["--key-prefix", "key_prefix"], metavar="PREFIX", default=None, **extra,
                     help="Key prefix of the brake (default: $DISTBRAKE_KEY_PREFIX, else "
                          "distbrake)." + tail),
        click.Option(["--max-repeats", "max_repeats"], metavar="N", default=None,
                     type=click.IntRange(min=1), **extra,
                     help="An explicit \"what if\": the limit inspect and list judge streaks by "
                          "(the workers count with their own), and the limit check counts with "
                          "(default: $DISTBRAKE_MAX_REPEATS, else 3)." + tail),
        click.Option(["--json", "as_json"], is_flag=True,
                     callback=_remember_json if after_command else None,
                     help="Print JSON (stable field names, see the README) instead of text."
                          + (" Global: also before the command name." if after_command else tail)),
    ]


def command(name: str) -> Callable[[Callable[..., None]], click.Command]:
    """A subcommand: its function gets the run's `App` first, and it takes the global options.

    --url, --timeout, --key-prefix, --max-repeats and --json may be given
    before the command name or after it (the later one wins); the function
    gets `as_json`, True when --json was given either way, and reads the
    rest from the `App`.
    """

    def decorate(function: Callable[..., None]) -> click.Command:
        made = click.command(name, short_help=COMMANDS[name][1])(click.pass_obj(function))
        made.params.extend(global_options(after_command=True))
        return made

    return decorate
