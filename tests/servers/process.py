"""Real redis-server processes: free ports, polling, redis.conf, the kill-them-all registry, RedisServer."""

# Everything here starts genuine ``redis-server`` processes (no mocks, no Docker) on
# free ports of 127.0.0.1, each in its own temporary directory, and waits for them
# by polling with a short interval under an overall deadline (never a fixed sleep).
#
# Every process is registered in a process-global registry: ``close()`` (or leaving
# the ``with`` block) kills it and removes its directory, and an ``atexit`` hook
# does the same for anything a failing test left behind.  On Linux the children
# also get ``PR_SET_PDEATHSIG`` = SIGKILL (when started from the main thread) so
# they die even if the test process itself is SIGKILLed.
#
# Configuration is written to a ``redis.conf`` in the node's directory (so
# ``restart()`` reuses it verbatim); ``extra_args`` in command-line form
# (``["--user", "brake on >pw ~distbrake:* +ping", "--maxmemory", "10mb"]``) are
# translated into config-file directives, which is what makes repeated ``--user``
# lines work.
#
# The system Redis on 127.0.0.1:6379 is never touched: every ``redis-cli`` call
# gets an explicit ``-p``.

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from tests.servers.resp import RespError, parse_info, redis_command

if TYPE_CHECKING:  # pragma: no cover - typing only
    import redis

__all__ = [
    "HOST",
    "Managed",
    "RedisServer",
    "RedisStartupError",
    "ServerGroup",
    "free_port",
    "free_ports",
    "stop_all",
    "wait_replicated",
    "wait_until",
]

HOST = "127.0.0.1"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"

# Poll interval for every readiness loop: short, always under a deadline.
POLL_INTERVAL = 0.02
CLUSTER_BUS_OFFSET = 10000
MAX_CLUSTER_PORT = 65535 - CLUSTER_BUS_OFFSET  # 55535
# Set DISTBRAKE_KEEP_REDIS_DIRS=1 to keep node directories (logs, configs) after close().
KEEP_DIRS = os.environ.get("DISTBRAKE_KEEP_REDIS_DIRS", "") not in ("", "0")
# Error replies that still prove a server is up and serving commands.
AUTH_ERRORS = ("NOAUTH", "WRONGPASS", "NOPERM")


class RedisStartupError(RuntimeError):
    """A server did not come up (or a topology did not settle) before its deadline."""


# ---------------------------------------------------------------------------
# polling helper
# ---------------------------------------------------------------------------


def wait_until(
    predicate: Callable[[], object],
    *,
    timeout: float,
    message: str | Callable[[], str],
    interval: float = POLL_INTERVAL,
) -> Any:
    """Call ``predicate`` until it returns something truthy (which is returned).

    Exceptions from the predicate count as "not yet" (the last one is chained).
    Raises :class:`RedisStartupError` with ``message`` when ``timeout`` passes.
    """
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while True:
        try:
            result = predicate()
        except Exception as exc:  # any failure means "not ready yet"
            last_exc = exc
            result = None
        if result:
            return result
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            if last_exc is not None:
                text = f"{text}\nlast error: {last_exc!r}"
            raise RedisStartupError(f"timed out after {timeout:.1f}s: {text}") from last_exc
        time.sleep(interval)


# ---------------------------------------------------------------------------
# ports
# ---------------------------------------------------------------------------

_reserved_ports: set[int] = set()
_ports_lock = threading.Lock()


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A free TCP port on 127.0.0.1 whose cluster bus port (``port + 10000``) is free too.

    Ports come from binding port 0 (so the kernel picks), are always <= 55535 and
    are never handed out twice by this process (nor is ``port +/- 10000``).
    """
    with _ports_lock:
        for _ in range(500):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((HOST, 0))
                port = int(s.getsockname()[1])
            bus = port + CLUSTER_BUS_OFFSET
            if port > MAX_CLUSTER_PORT or port in (6379, 26379):
                continue
            if {port, bus} & _reserved_ports:
                continue
            if not _port_is_free(bus):
                continue
            _reserved_ports.update((port, bus))
            return port
    raise RuntimeError("could not find a free port pair (port, port+10000) on 127.0.0.1")


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports from :func:`free_port`."""
    return [free_port() for _ in range(n)]


# ---------------------------------------------------------------------------
# config helpers
# ---------------------------------------------------------------------------


def quote(value: str) -> str:
    """Quote one token for redis.conf (sdssplitargs double-quote rules)."""
    escaped = (
        value.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    return f'"{escaped}"'


def directive(name: str, values: Iterable[str]) -> str:
    """One redis.conf line: ``name "v1" "v2"``."""
    return " ".join([name, *(quote(v) for v in values)])


def args_to_directives(args: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Group command-line style args (``--name v1 v2 --other v``) into directives.

    A value of a ``--user`` directive is split on whitespace, so both
    ``["--user", "brake on >pw +ping"]`` and ``["--user", "brake", "on", ...]`` work.
    """
    groups: list[tuple[str, list[str]]] = []
    for arg in args:
        if arg.startswith("--") and len(arg) > 2:
            groups.append((arg[2:], []))
        elif not groups:
            raise ValueError(f"extra_args must start with an --option, got {arg!r}")
        elif groups[-1][0].lower() == "user":
            groups[-1][1].extend(arg.split())
        else:
            groups[-1][1].append(arg)
    return groups


# ---------------------------------------------------------------------------
# process registry / cleanup, child processes
# ---------------------------------------------------------------------------

_live: dict[int, RedisServer] = {}
_registry_lock = threading.Lock()


def stop_all() -> None:
    """Kill every server this process started and remove their directories."""
    with _registry_lock:
        servers = list(_live.values())
    for server in servers:
        with contextlib.suppress(Exception):
            server.close()


atexit.register(stop_all)

_PR_SET_PDEATHSIG = 1
_libc: Any = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError):
        _libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def child_env() -> dict[str, str]:
    """The environment of every redis-server / redis-cli child (no inherited REDISCLI_AUTH)."""
    env = dict(os.environ)
    env.pop("REDISCLI_AUTH", None)
    env["REDISCLI_HISTFILE"] = "/dev/null"
    return env


def run_quietly(cmd: Sequence[str], *, timeout: float, **options: Any) -> subprocess.CompletedProcess[bytes]:
    """Run a helper command (redis-cli, openssl) to the end: no stdin, output captured, no raise."""
    return subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL, timeout=timeout, check=False, **options)


def output(result: subprocess.CompletedProcess[bytes]) -> str:
    """What a :func:`run_quietly` command printed, stdout then stderr."""
    return (result.stdout + result.stderr).decode(errors="replace")


# ---------------------------------------------------------------------------
# lifecycle shared by servers, groups of servers and the fault proxy
# ---------------------------------------------------------------------------


class Managed:
    """``with thing:`` starts it and closes it on the way out, whatever happened inside."""

    def start(self) -> Self:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ServerGroup(Managed):
    """Several servers brought up together (all closed if any part fails) and closed together."""

    _started = False

    def _servers(self) -> list[RedisServer]:
        """Every server of the group, in start (and log) order."""
        raise NotImplementedError

    def _close_order(self) -> list[RedisServer]:
        return self._servers()

    def _bring_up(self) -> None:
        """Start the servers and wait until the topology has settled."""
        raise NotImplementedError

    def start(self) -> Self:
        if self._started:
            return self
        try:
            self._bring_up()
        except BaseException:
            self.close()
            raise
        self._started = True
        return self

    def close(self) -> None:
        for node in self._close_order():
            node.close()

    def stop(self) -> None:
        self.close()

    def _logs(self, lines: int = 15) -> str:
        return "\n".join(n.log_tail(lines) for n in self._servers())

    def _wait_settled(self, problem: Callable[[], str | None], what: str, timeout: float) -> None:
        """Poll ``problem`` (None once settled) under ``timeout``; the last problem goes in the error."""
        last: list[str | None] = ["not checked yet"]

        def settled() -> bool:
            last[0] = problem()
            return last[0] is None

        wait_until(settled, timeout=timeout, message=lambda: f"{what}: {last[0]}\n{self._logs(8)}")


def start_together(nodes: Sequence[RedisServer]) -> None:
    """Spawn every node, then wait for each (they boot in parallel)."""
    for node in nodes:
        node.start(wait=False)
    for node in nodes:
        node.wait_ready()


# ---------------------------------------------------------------------------
# single node
# ---------------------------------------------------------------------------


class RedisServer(Managed):
    """One ``redis-server`` process on 127.0.0.1 in a fresh temporary directory.

    Not started by the constructor: call :meth:`start` (returns ``self``) or use
    it as a context manager (``with RedisServer() as srv:``), which starts it and
    on exit kills it and removes its directory.
    """

    host: str = HOST
    kind: str = "redis"

    def __init__(
        self,
        *,
        port: int | None = None,
        appendonly: bool = False,
        password: str | None = None,
        acl_users: Sequence[str] = (),
        unix_socket: bool = False,
        extra_args: Sequence[str] = (),
        extra_config: Sequence[str] = (),
        startup_timeout: float = 10.0,
        name: str | None = None,
    ) -> None:
        """
        port: fixed port (default: :func:`free_port`).
        appendonly: ``appendonly yes`` (AOF in ``<dir>/appendonlydir``; survives restart).
        password: ``requirepass`` for the default user (and ``masterauth``).
        acl_users: ACL rules, one user per string, e.g. ``"brake on >pw ~distbrake:* +ping"``.
        unix_socket: also listen on ``<dir>/redis.sock`` (see :attr:`unix_socket`).
        extra_args: command-line style options, e.g. ``["--user", "...", "--maxmemory", "1mb"]``.
        extra_config: raw redis.conf lines appended last.
        """
        self._auto_port = port is None
        self.port: int = free_port() if port is None else port
        self.appendonly = appendonly
        self.password = password
        self.acl_users = list(acl_users)
        self.extra_args = list(extra_args)
        self.extra_config = list(extra_config)
        self.startup_timeout = startup_timeout
        self.name = name or self.kind
        self.dir = Path(tempfile.mkdtemp(prefix=f"distbrake-{self.name}-"))
        self.config_path = self.dir / f"{self.kind}.conf"
        self.log_path = self.dir / f"{self.kind}.log"
        self.stdout_path = self.dir / "stdout.log"
        self._directives = args_to_directives(self.extra_args)
        self.unix_socket: str | None = None
        for dname, values in self._directives:
            if dname.lower() == "unixsocket" and values:
                self.unix_socket = values[0]
        if unix_socket and self.unix_socket is None:
            self.unix_socket = str(self.dir / "redis.sock")
        if self.unix_socket is not None and len(self.unix_socket.encode()) > 100:
            raise ValueError(f"unix socket path too long for AF_UNIX: {self.unix_socket}")
        self.process: subprocess.Popen[bytes] | None = None
        self._paused = False
        self._closed = False
        self._started_once = False
        self._spawn_log_offset = 0
        with _registry_lock:
            _live[id(self)] = self

    # -- addresses -------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:N`` (no credentials; see :meth:`url_with`)."""
        return f"redis://{self.host}:{self.port}"

    def url_with(
        self, username: str | None = None, password: str | None = None, db: int = 0
    ) -> str:
        """The URL with (URL-quoted) credentials and database number."""
        scheme, _, rest = self.url.partition("://")
        auth = ""
        if password is not None:
            user = urllib.parse.quote(username or "", safe="")
            auth = f"{user}:{urllib.parse.quote(password, safe='')}@"
        return f"{scheme}://{auth}{rest}/{db}"

    @property
    def unix_url(self) -> str | None:
        """``unix:///path/redis.sock`` when a unix socket is configured."""
        return None if self.unix_socket is None else f"unix://{self.unix_socket}"

    # -- state -----------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def is_running(self) -> bool:
        """Process alive (possibly paused)."""
        return self.process is not None and self.process.poll() is None

    @property
    def is_paused(self) -> bool:
        return self._paused and self.is_running

    # -- configuration ---------------------------------------------------

    def _listen_lines(self) -> list[str]:
        return [f"port {self.port}"]

    def _process_lines(self) -> list[str]:
        """Where it listens, runs, keeps its files and logs: the head of every config."""
        return [
            *self._listen_lines(),
            f"bind {HOST}",
            "daemonize no",
            f"dir {quote(str(self.dir))}",
            f"logfile {quote(self.log_path.name)}",
        ]

    def _given_lines(self) -> list[str]:
        """What the caller asked for (``extra_args``, then ``extra_config``): the tail of every config."""
        return [*(directive(name, values) for name, values in self._directives), *self.extra_config]

    def config_lines(self) -> list[str]:
        """The redis.conf written before every (re)start."""
        lines = [
            *self._process_lines(),
            'save ""',
            f"appendonly {'yes' if self.appendonly else 'no'}",
            # Redis 7 defaults to a 5 s delay before a diskless full sync.
            "repl-diskless-sync-delay 0",
            "enable-debug-command local",
        ]
        if self.unix_socket is not None and not any(
            d.lower() == "unixsocket" for d, _ in self._directives
        ):
            lines += [f"unixsocket {quote(self.unix_socket)}", "unixsocketperm 700"]
        if self.password is not None:
            lines += [
                directive("requirepass", [self.password]),
                directive("masterauth", [self.password]),
            ]
        for rule in self.acl_users:
            lines.append(directive("user", rule.split()))
        return lines + self._given_lines()

    def _command_line(self) -> list[str]:
        return [REDIS_SERVER, str(self.config_path)]

    # -- lifecycle -------------------------------------------------------

    def start(self, *, wait: bool = True) -> Self:
        """Start (no-op if running); with ``wait`` block until it answers PING."""
        if self._closed:
            raise RuntimeError(f"{self.name} was closed")
        if self.is_running:
            return self
        self._spawn()
        if wait:
            self.wait_ready()
        return self

    def _write_config(self) -> None:
        self.config_path.write_text("\n".join(self.config_lines()) + "\n")

    def _spawn(self) -> None:
        self._write_config()
        self._spawn_log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        in_main = threading.current_thread() is threading.main_thread()
        with open(self.stdout_path, "ab") as out:
            self.process = subprocess.Popen(
                self._command_line(),
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=child_env(),
                start_new_session=True,  # Ctrl-C in the terminal does not reach it
                # Only prctl(PR_SET_PDEATHSIG) runs in the child; the death signal is tied
                # to the forking thread, hence main thread only.
                preexec_fn=_die_with_parent if (in_main and _libc is not None) else None,  # noqa: PLW1509
            )
        self._paused = False

    def probe(self) -> tuple[bool, str]:
        """One readiness check: (answered?, detail)."""
        try:
            reply = redis_command(self.host, self.port, "PING", timeout=0.5, **self._credentials())
        except RespError as exc:
            # An auth error still proves the server is up and serving commands.
            text = str(exc)
            return text.startswith(AUTH_ERRORS), text
        except OSError as exc:
            return False, repr(exc)
        return reply == "PONG", repr(reply)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Poll until the server answers; on failure raise with the log tail."""
        timeout = self.startup_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        retries = 3
        detail = "not probed yet"
        while True:
            proc = self.process
            if proc is None:
                raise RedisStartupError(f"{self.name} on port {self.port} was not started")
            code = proc.poll()
            if code is not None:
                if (
                    self._auto_port
                    and not self._started_once
                    and retries > 0
                    and self._lost_port_race()
                ):
                    # Someone grabbed our port between free_port() and bind(): pick another.
                    retries -= 1
                    self.port = free_port()
                    self._spawn()
                    continue
                self.process = None
                raise RedisStartupError(
                    f"{self.name} (port {self.port}) exited with code {code} during startup\n"
                    f"{self.log_tail()}"
                )
            ok, detail = self.probe()
            if ok and proc.poll() is None:
                self._started_once = True
                return
            if time.monotonic() >= deadline:
                raise RedisStartupError(
                    f"{self.name} (port {self.port}, pid {proc.pid}) did not answer within "
                    f"{timeout:.1f}s; last probe: {detail}\n{self.log_tail()}"
                )
            time.sleep(POLL_INTERVAL)

    def _lost_port_race(self) -> bool:
        text = ""
        if self.log_path.exists():
            with open(self.log_path, "rb") as f:
                f.seek(self._spawn_log_offset)
                text = f.read().decode(errors="replace")
        return "Address already in use" in text

    def log_tail(self, lines: int = 40) -> str:
        """Last lines of the server log and of its stdout/stderr (config errors land there)."""
        parts = []
        for path in (self.log_path, self.stdout_path):
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                if tail:
                    parts.append(f"--- {path} (last {len(tail)} lines) ---\n" + "\n".join(tail))
        return "\n".join(parts) or f"(no log output in {self.dir})"

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful: SIGTERM (after SIGCONT if paused), wait; SIGKILL if it takes too long."""
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if self._paused:
                    proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.process = None
        self._paused = False

    def kill(self) -> None:
        """SIGKILL (a crash); the process is reaped. Works on a paused server too."""
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        self.process = None
        self._paused = False

    def restart(self, *, graceful: bool = True, wait: bool = True) -> Self:
        """Stop (SIGTERM, or SIGKILL with ``graceful=False``) and start on the same port and dir."""
        if self.is_running:
            if graceful:
                self.stop()
            else:
                self.kill()
        return self.start(wait=wait)

    def pause(self) -> None:
        """SIGSTOP: the port keeps accepting connections but nothing is answered."""
        if not self.is_running or self.process is None:
            raise RuntimeError(f"{self.name} is not running")
        self.process.send_signal(signal.SIGSTOP)
        self._paused = True

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
        self._paused = False

    def close(self) -> None:
        """Kill the process and remove the directory; idempotent."""
        self.kill()
        self._closed = True
        with _registry_lock:
            _live.pop(id(self), None)
        if not KEEP_DIRS:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __repr__(self) -> str:
        state = "paused" if self.is_paused else ("running" if self.is_running else "stopped")
        return f"<{type(self).__name__} {self.name} {self.host}:{self.port} {state}>"

    # -- convenience -----------------------------------------------------

    def _credentials(self) -> dict[str, Any]:
        """How the built-in client reaches this server: its password (and TLS, see subclasses)."""
        return {"password": self.password}

    def command(self, *args: object, timeout: float = 2.0) -> Any:
        """Run one command over the tiny built-in client (authenticated if ``password``)."""
        return redis_command(self.host, self.port, *args, timeout=timeout, **self._credentials())

    def info(self, section: str = "replication") -> dict[str, str]:
        return parse_info(self.command("INFO", section))

    def client(self, **kwargs: Any) -> redis.Redis:
        """A redis-py client for this node (password preset; kwargs override).

        Retries are off by default (``retry=Retry(NoBackoff(), 0)``): redis-py 8's own
        default retries 10 times with exponential backoff, which turns every expected
        connection failure in a test into seconds of waiting.
        """
        import redis as redis_py
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        options: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "password": self.password,
            "retry": Retry(NoBackoff(), 0),
        }
        options.update(kwargs)
        return redis_py.Redis(**options)


def wait_replicated(
    master: RedisServer, replicas: Sequence[RedisServer], timeout: float = 10.0
) -> None:
    """Wait until every replica has processed the master's replication stream up to
    the master's current offset (i.e. all writes acknowledged so far are on them).

    Unlike ``WAIT`` this does not depend on which connection did the writes.
    """
    target = int(master.info("replication")["master_repl_offset"])

    def caught_up() -> bool:
        for replica in replicas:
            info = replica.info("replication")
            if info.get("master_link_status") != "up":
                return False
            if int(info.get("slave_repl_offset", "-1")) < target:
                return False
        return True

    wait_until(
        caught_up,
        timeout=timeout,
        message=lambda: f"replicas {[r.port for r in replicas]} did not reach offset {target}",
    )
