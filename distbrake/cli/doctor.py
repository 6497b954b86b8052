"""The `doctor` command: its checks of the backend in order, each problem with its fix, as text or JSON."""

from __future__ import annotations

import contextlib
import hashlib
import json
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

import click
import redis.exceptions
from rich.text import Text

from ..errors import ConfigurationError, LoopBrakeError
from ..redis.acl import command_name, grant_hint, needed_commands
from ..redis.script import Script
from ..redis.sync import DistributedBrake
from ..redis.wire import script_source
from ..redis_errors import is_refusal, is_unknown_command
from ..settings import BrakeSettings, value_sources
from .app import App, command
from .output import (
    EXIT_BACKEND,
    acl_rules,
    backend_problem,
    emit_json,
    escape_text,
    make_console,
    make_table,
    one_line,
    print_renderable,
    scrub,
)
from .server_identity import CAVEATS, ServerIdentity, identify_server, lua_disabled
from .sessions import ttl_text


def _joined(values: Any) -> str:
    return ", ".join(sorted(set(values)))


def _service(app: App) -> str:
    """The Sentinel service name of the run's URL."""
    return app.resolved.parsed_url.path if app.resolved is not None else ""


@dataclass
class Finding:
    name: str
    status: str  # ok | warn | fail | skip
    detail: str
    fix: str = ""

    def to_json(self, secrets: frozenset[str]) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": one_line(self.detail, secrets),
                "fix": one_line(self.fix, secrets)}


def _nodes(client: Any, label: str) -> list[tuple[str, Any]]:
    """(name, per-node client) of each primary: every master of a cluster, else the one."""
    primaries = getattr(client, "get_primaries", None)
    if callable(primaries):
        return [(str(node.name), client.get_redis_connection(node)) for node in primaries()]
    return [(label, client)]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class Doctor:
    """The checks of `distbrake doctor`, in order; any "fail" makes the exit code 4."""

    def __init__(self, app: App) -> None:
        self.app = app
        self.findings: list[Finding] = []
        self.server: dict[str, Any] = {"mode": None, "version": None, "product": None,
                                       "described": None, "nodes": []}
        self.latency_ms: float | None = None
        self.config: dict[str, dict[str, Any]] = {}

    def add(self, name: str, status: str, detail: str, fix: str = "") -> None:
        self.findings.append(Finding(name, status, detail, fix))

    def line(self, text: str) -> str:
        """`text` as the report shows it: scrubbed, on one line."""
        return one_line(text, self.app.secrets)

    def fail_backend(self, name: str, error: BaseException) -> None:
        _, what, fix = backend_problem(error, self.app)
        self.add(name, "fail", what, fix)

    @property
    def ok(self) -> bool:
        return all(f.status != "fail" for f in self.findings)

    def run(self) -> None:
        try:
            settings = self.app.settings()
        except ConfigurationError as error:
            self.add("configuration", "fail", str(error),
                     "correct the value named above (command-line option or DISTBRAKE_* variable)")
            return
        self.configuration(settings)
        try:
            brake = DistributedBrake.from_url(settings=settings.model_copy(
                update={"on_backend_error": "closed"}))
        except ConfigurationError as error:  # a URL option with a bad value, found when building
            self.add("configuration", "fail", str(error),
                     "correct the URL's option (the ?name=value part of --url or DISTBRAKE_URL)")
            return
        except Exception as error:  # a cluster client connects when built
            self.add("configuration", "ok", "valid (sources below)")
            self.fail_backend("connect", error)
            return
        self.add("configuration", "ok", "valid (sources below)")
        try:
            if self.connect(brake):
                nodes = _nodes(brake.client, self.app.backend)
                hosts = settings.parsed_url.hosts
                if self.server_info(settings.parsed_url.connector, nodes, hosts[0][0] if hosts else "",
                                    brake.script.variant):
                    self.script(nodes, brake.script)
                    self.permissions(brake, nodes)
                    self.end_to_end(brake, nodes)
        finally:
            with contextlib.suppress(Exception):
                brake.close()

    def configuration(self, settings: BrakeSettings) -> None:
        sources = value_sources(self.app.given())
        for name in BrakeSettings.model_fields:
            value: Any = getattr(settings, name)
            if name == "url":
                value = settings.shown_url
            elif isinstance(value, frozenset):
                value = sorted(value)
            self.config[name] = {"value": value, "source": sources.get(name, "default")}

    def connect(self, brake: DistributedBrake) -> bool:
        samples = []
        try:
            for _ in range(5):
                start = time.perf_counter()
                brake.ping()
                samples.append((time.perf_counter() - start) * 1000)
        except Exception as error:
            self.fail_backend("connect", error)
            return False
        self.latency_ms = statistics.median(samples)
        self.add("connect", "ok", f"PONG from {self.app.backend}")
        self.add("latency", "ok", f"{self.latency_ms:.2f} ms round trip (median of 5 PINGs)")
        return True

    def server_info(self, kind: str, nodes: list[tuple[str, Any]], host: str = "", variant: str = "redis") -> bool:
        """The server check (and mode, memory policy, server notes): `host` is the URL's first host name,
        `variant` the brake's script variant (redis/script.py)."""
        if kind == "memory":
            from importlib.metadata import version

            self.server.update(mode="embedded", version=f"fakeredis {version('fakeredis')}",
                               product="fakeredis", described=f"fakeredis {version('fakeredis')}",
                               nodes=["memory"])
            self.add("server", "ok", f"embedded {self.server['version']} (in this process only: "
                     "a fleet needs a Redis URL)")
            return True
        identities: list[ServerIdentity] = []
        policies: set[tuple[str, int]] = set()
        for name, client in nodes:
            try:
                server = client.info("server")
                memory = client.info("memory")
            except Exception as error:
                if not is_refusal(error):
                    self.fail_backend("server", error)
                    return False
                self.add("server", "warn", f"{name}: may not run INFO ({self.line(str(error))})",
                         "optional: grant +info to see the server, its version and mode here")
                self.server["nodes"] = [n for n, _ in nodes]
                self.server["mode"] = {"cluster": "cluster", "sentinel": "sentinel"}.get(kind, "single")
                return True
            try:
                cluster: Any = client.info("cluster")
            except redis.exceptions.ResponseError:  # a server without INFO cluster: the mode field says
                cluster = None
            identities.append(identify_server(server, cluster, host))
            policies.add((str(memory.get("maxmemory_policy", "?")), int(memory.get("maxmemory", 0))))
        node_modes = {i.mode for i in identities}
        described = ", ".join(sorted({i.name for i in identities}))
        if "sentinel" in node_modes:
            self.server.update(mode="sentinel-process", nodes=[n for n, _ in nodes],
                               product=_joined(i.product for i in identities),
                               version=_joined(i.version for i in identities), described=described)
            self.add("mode", "fail", f"{described} at {self.app.backend} is a Sentinel process, "
                     "not a data node: the brake cannot keep streaks there",
                     "use redis+sentinel://host:port[,host:port...]/SERVICE (the sentinels and "
                     "the name of the master they watch)")
            return False
        cluster_nodes = "cluster" in node_modes
        mode = "sentinel" if kind == "sentinel" else ("cluster" if cluster_nodes else "single")
        self.server.update(mode=mode, nodes=[n for n, _ in nodes],
                           product=_joined(i.product for i in identities),
                           version=_joined(i.version for i in identities), described=described)
        where = {
            "cluster": f"{len(nodes)} master(s)",
            "sentinel": f"the master of service {_service(self.app)!r}, found through "
                        "Sentinel",
        }.get(mode, "1 node")
        self.add("server", "ok", f"{described}, mode {mode} ({where})")
        self.server_notes({i.product for i in identities}, variant)
        if kind in ("redis", "unix") and cluster_nodes:
            self.add("mode", "fail", "the server is a Cluster node (INFO reports cluster mode) but "
                     "the URL is for a single node: keys in other slots would fail with MOVED",
                     "use redis+cluster://host:port[,host:port...]")
            return False
        evicting = sorted(p for p, limit in policies if limit and p != "noeviction")
        if evicting:
            self.add("memory policy", "warn",
                     f"maxmemory is set with maxmemory-policy {', '.join(evicting)}: under memory "
                     "pressure the server may evict any streak record, a looping session's too "
                     "(every allkeys-* and volatile-* policy can: every record has a TTL, and "
                     "LRU, LFU and TTL choices are sampled approximations); an evicted streak "
                     "starts again at 1, so a looping agent gets up to max_repeats - 1 more calls",
                     "if every streak must live its full TTL, set maxmemory-policy noeviction "
                     "(only it never evicts; a full server then refuses the brake's writes and "
                     "on_backend_error decides) or keep used_memory well below maxmemory")
        return True

    def server_notes(self, products: set[str], variant: str) -> None:
        """What is worth knowing of a Redis-compatible server (server_identity.CAVEATS), and whether the brake
        sends the script variant it needs."""
        notes = [f"{product}: {CAVEATS[product]}" for product in sorted(products) if product in CAVEATS]
        if "Upstash" in products and variant != "upstash":
            self.add("server notes", "warn",
                     "Upstash, but the URL's host is not <db>.upstash.io: the brake sends its standard script, "
                     "which Upstash runs under a global lock (no other command runs meanwhile)",
                     "connect through the database's <db>.upstash.io endpoint (then the brake sends the "
                     "'#!lua flags=allow-key-locking' variant)")
        elif notes:
            self.add("server notes", "ok", "; ".join(notes))

    def script(self, nodes: list[tuple[str, Any]], script: Script | None = None) -> None:
        source = script_source() if script is None else script.text
        expected = hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest()
        for name, client in nodes:
            try:
                sha = _text(client.script_load(source))
            except Exception as error:
                if lua_disabled(error):
                    self.add("script", "fail", f"{name}: the server runs no Lua scripts ({self.line(str(error))})",
                             "Garnet: start it with --lua (the brake is one Lua script)")
                    return
                self.fail_backend("script", error)
                return
            if sha != expected:
                self.add("script", "fail", f"{name}: SCRIPT LOAD returned {sha}, expected {expected}",
                         "the server altered the script: check for a proxy rewriting commands")
                return
        variant = "" if script is None or script.variant == "redis" else f", the {script.variant} variant"
        self.add("script", "ok", f"lua/brake.lua loads (sha {expected[:12]}{variant}) on {len(nodes)} node(s)")

    def permissions(self, brake: DistributedBrake, nodes: list[tuple[str, Any]]) -> None:
        source, sha = brake.script.text, brake.script.sha
        key = brake.key("distbrake-doctor-probe")
        commands = needed_commands(key, brake.key_pattern, sha, source)
        if brake.settings.parsed_url.db:  # redis-py selects the database on every new connection
            commands.append(("SELECT", str(brake.settings.parsed_url.db)))
        denied: dict[str, str] = {}
        user = "default"
        for name, client in nodes:
            try:
                user = _text(client.execute_command("ACL", "WHOAMI"))
                for command in commands:
                    answer = _text(client.execute_command("ACL", "DRYRUN", user, *command))
                    if answer != "OK":
                        denied.setdefault(command_name(command), f"{name}: {answer}")
            except Exception as error:
                if is_refusal(error):
                    self.add("permissions", "warn",
                             "this user may not run ACL WHOAMI / ACL DRYRUN, so its permissions "
                             "cannot be listed (the end-to-end check below still exercises them)",
                             "optional: grant +acl|whoami +acl|dryrun for a full report; the brake "
                             f"needs {acl_rules(brake.settings)} on ~{brake.settings.key_prefix}:*")
                    return
                if is_unknown_command(error):
                    self.add("permissions", "skip",
                             "ACL DRYRUN is not available on this server (Redis < 7 or embedded)")
                    return
                self.fail_backend("permissions", error)
                return
        if denied:
            first = next(iter(denied.values()))
            self.add("permissions", "fail",
                     f"user {user!r} may not run: {', '.join(denied)} on keys {brake.key_pattern} "
                     f"({self.line(first)})",
                     "grant them, e.g. " + grant_hint(user, brake.settings.key_prefix, list(denied)))
            return
        names = ", ".join(command_name(c) for c in commands)
        self.add("permissions", "ok", f"user {user!r} may run {names} on {brake.settings.key_prefix}:*")

    def end_to_end(self, brake: DistributedBrake, nodes: list[tuple[str, Any]]) -> None:
        session = f"distbrake-doctor-{uuid.uuid4().hex[:12]}"
        try:
            verdict = brake.check("distbrake-doctor", {"probe": session}, session_id=session)
            state = brake.inspect(session)
            removed = brake.clear(session)
            for _, client in nodes:
                client.scan(0, match=brake.key_pattern, count=10)
        except Exception as error:
            with contextlib.suppress(Exception):
                brake.clear(session)
            if isinstance(error, LoopBrakeError):
                self.add("end-to-end", "fail", f"a first call was denied: {error}",
                         "max_repeats must be at least 2 for a brake that allows anything")
                return
            self.fail_backend("end-to-end", error)
            return
        if state is None or state.count != verdict.count or not removed:
            self.add("end-to-end", "fail",
                     f"check counted {verdict.count}, inspect read {state and state.count}, "
                     f"clear removed {removed}",
                     "another process may share this key prefix with a different layout: "
                     "use a dedicated --key-prefix")
            return
        self.add("end-to-end", "ok",
                 f"check counted {verdict.count}, inspect read it back (ttl "
                 f"{ttl_text(state.ttl_seconds)}), clear removed it, SCAN allowed")

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "backend": self.app.backend,
            "mode": self.server["mode"],
            "server": self.server["described"],
            "server_product": self.server["product"],
            "server_version": self.server["version"],
            "nodes": self.server["nodes"],
            "latency_ms": None if self.latency_ms is None else round(self.latency_ms, 3),
            "checks": [f.to_json(self.app.secrets) for f in self.findings],
            "config": self.config,
        }

    def print(self) -> None:
        console = make_console()
        terminal = sys.stdout.isatty()
        styles = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
        console.print(Text(f"distbrake doctor: {self.line(self.app.backend)}",
                           style="bold" if terminal else ""))
        table = make_table("", "check", "result")
        for finding in self.findings:
            result = Text(self.line(finding.detail))
            if finding.fix and finding.status in ("fail", "warn"):
                result.append(f"\nfix: {self.line(finding.fix)}", style="cyan" if terminal else "")
            table.add_row(Text(finding.status.upper() if finding.status == "fail" else finding.status,
                               style=styles.get(finding.status, "") if terminal else ""),
                          finding.name, result)
        print_renderable(console, table)
        if self.config:
            config = make_table("setting", "value", "source", title="effective configuration")
            for name, item in self.config.items():
                value = item["value"]
                shown = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
                config.add_row(name, Text(escape_text(scrub(shown, self.app.secrets))),
                               Text(escape_text(item["source"])))
            print_renderable(console, config)
        failed = [f.name for f in self.findings if f.status == "fail"]
        if failed:
            console.print(Text(f"problems: {', '.join(failed)} (exit {EXIT_BACKEND})",
                               style="bold red" if terminal else ""))
        else:
            console.print(Text("all good", style="green" if terminal else ""))


def hook_check(doctor: Doctor, host: str) -> None:
    """`--hook HOST`: the hook's self-test on the hook's own backend (the streak file, or DISTBRAKE_URL)."""
    from ..hosts.run import HookOptions, self_test

    options = HookOptions(doctor.app.url, doctor.app.timeout, doctor.app.key_prefix, doctor.app.max_repeats)
    try:
        passed, line = self_test(host, options)
    except Exception as error:
        passed, line = False, f"hook {host}: {type(error).__name__}: {error}"
    doctor.add(f"hook {host}", "ok" if passed else "fail", line,
               "" if passed else f"run: distbrake hook {host} --self-test (see the README's Coding agents section)")


@command("doctor")
@click.option("--hook", "hook_host", type=click.Choice(["claude-code", "codex", "gemini", "cursor"]), default=None,
              help="Also check a coding agent's hook end to end (`distbrake hook HOST --self-test`).")
def doctor_command(app: App, as_json: bool, hook_host: str | None = None) -> None:
    """Diagnose the backend: connection, version, mode, latency, script, permissions, config.

    Exit 4 when something is wrong (each problem comes with its fix).
    The end-to-end check writes one probe key under the prefix and deletes it.
    """
    doctor = Doctor(app)
    doctor.run()
    if hook_host is not None:
        hook_check(doctor, hook_host)
    if as_json:
        emit_json(doctor.to_json())
    else:
        doctor.print()
    if not doctor.ok:
        raise click.exceptions.Exit(EXIT_BACKEND)
