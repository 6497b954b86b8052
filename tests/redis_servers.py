"""Real Redis processes for the test-suite: single nodes, TLS nodes, clusters, sentinel.

Everything here starts genuine ``redis-server`` processes (no mocks, no Docker) on
free ports of 127.0.0.1, each in its own temporary directory, and waits for them
by polling with a short interval under an overall deadline (never a fixed sleep).

Every process is registered in a process-global registry: ``close()`` (or leaving
the ``with`` block) kills it and removes its directory, and an ``atexit`` hook
does the same for anything a failing test left behind.  On Linux the children
also get ``PR_SET_PDEATHSIG`` = SIGKILL (when started from the main thread) so
they die even if the test process itself is SIGKILLed.

Configuration is written to a ``redis.conf`` in the node's directory (so
``restart()`` reuses it verbatim); ``extra_args`` in command-line form
(``["--user", "brake on >pw ~distbrake:* +ping", "--maxmemory", "10mb"]``) are
translated into config-file directives, which is what makes repeated ``--user``
lines work.

The system Redis on 127.0.0.1:6379 is never touched: every ``redis-cli`` call
gets an explicit ``-p``.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Self

if TYPE_CHECKING:  # pragma: no cover - typing only
    import redis
    import redis.cluster
    import redis.sentinel

__all__ = [
    "HOST",
    "ClusterNodeInfo",
    "RedisCluster",
    "RedisServer",
    "RedisStartupError",
    "RespError",
    "SentinelServer",
    "SentinelSetup",
    "TLSFiles",
    "TLSRedisServer",
    "free_port",
    "free_ports",
    "redis_command",
    "stop_all",
    "tls_files",
    "wait_replicated",
    "wait_until",
]

HOST = "127.0.0.1"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"
OPENSSL = shutil.which("openssl") or "/usr/bin/openssl"

# Poll interval for every readiness loop: short, always under a deadline.
POLL_INTERVAL = 0.02
CLUSTER_BUS_OFFSET = 10000
MAX_CLUSTER_PORT = 65535 - CLUSTER_BUS_OFFSET  # 55535
# Set DISTBRAKE_KEEP_REDIS_DIRS=1 to keep node directories (logs, configs) after close().
KEEP_DIRS = os.environ.get("DISTBRAKE_KEEP_REDIS_DIRS", "") not in ("", "0")


class RedisStartupError(RuntimeError):
    """A server did not come up (or a topology did not settle) before its deadline."""


class RespError(Exception):
    """An error reply (``-ERR ...``) from Redis, raised by :func:`redis_command`."""


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
# tiny RESP2 client (admin/readiness only; tests should use redis-py)
# ---------------------------------------------------------------------------


def _encode_command(args: Sequence[object]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _read_reply(f: IO[bytes]) -> Any:
    line = f.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed by server")
    kind, body = line[:1], line[1:-2]
    if kind == b"+":
        return body.decode()
    if kind == b"-":
        return RespError(body.decode(errors="replace"))
    if kind == b":":
        return int(body)
    if kind == b"$":
        n = int(body)
        if n < 0:
            return None
        data = f.read(n + 2)
        if len(data) != n + 2:
            raise ConnectionError("connection closed by server")
        return data[:-2].decode(errors="replace")
    if kind == b"*":
        n = int(body)
        if n < 0:
            return None
        return [_read_reply(f) for _ in range(n)]
    raise ConnectionError(f"unexpected RESP reply {line!r}")


def redis_command(
    host: str,
    port: int,
    *args: object,
    password: str | None = None,
    username: str | None = None,
    timeout: float = 2.0,
    ssl_context: ssl.SSLContext | None = None,
) -> Any:
    """Send one command on a fresh connection (after ``AUTH`` if a password is given).

    Returns str / int / None / nested lists; raises :class:`RespError` on an error
    reply and ``OSError`` on connection problems.  Used by the fixtures for
    readiness and topology checks so they do not depend on redis-py's parsing.
    """
    commands: list[Sequence[object]] = []
    if password is not None:
        commands.append(("AUTH", username, password) if username else ("AUTH", password))
    commands.append(args)
    raw = socket.create_connection((host, port), timeout=timeout)
    sock: socket.socket = raw
    try:
        if ssl_context is not None:
            sock = ssl_context.wrap_socket(raw, server_hostname=host)
        sock.sendall(b"".join(_encode_command(c) for c in commands))
        with sock.makefile("rb") as f:
            replies = [_read_reply(f) for _ in commands]
    finally:
        sock.close()
        raw.close()
    for reply in replies:
        if isinstance(reply, RespError):
            raise reply
    return replies[-1]


def _parse_info(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and ":" in line:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def _pairs_to_dict(flat: Sequence[Any]) -> dict[str, Any]:
    return {str(flat[i]): flat[i + 1] for i in range(0, len(flat) - 1, 2)}


# ---------------------------------------------------------------------------
# config helpers
# ---------------------------------------------------------------------------


def _quote(value: str) -> str:
    """Quote one token for redis.conf (sdssplitargs double-quote rules)."""
    escaped = (
        value.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    return f'"{escaped}"'


def _directive(name: str, values: Iterable[str]) -> str:
    return " ".join([name, *(_quote(v) for v in values)])


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
# process registry / cleanup
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


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("REDISCLI_AUTH", None)
    env["REDISCLI_HISTFILE"] = "/dev/null"
    return env


# ---------------------------------------------------------------------------
# single node
# ---------------------------------------------------------------------------


class RedisServer:
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

    def config_lines(self) -> list[str]:
        """The redis.conf written before every (re)start."""
        lines = [
            *self._listen_lines(),
            f"bind {HOST}",
            "daemonize no",
            f"dir {_quote(str(self.dir))}",
            f"logfile {_quote(self.log_path.name)}",
            'save ""',
            f"appendonly {'yes' if self.appendonly else 'no'}",
            # Redis 7 defaults to a 5 s delay before a diskless full sync.
            "repl-diskless-sync-delay 0",
            "enable-debug-command local",
        ]
        if self.unix_socket is not None and not any(
            d.lower() == "unixsocket" for d, _ in self._directives
        ):
            lines += [f"unixsocket {_quote(self.unix_socket)}", "unixsocketperm 700"]
        if self.password is not None:
            lines += [
                _directive("requirepass", [self.password]),
                _directive("masterauth", [self.password]),
            ]
        for rule in self.acl_users:
            lines.append(_directive("user", rule.split()))
        lines += [_directive(name, values) for name, values in self._directives]
        lines += self.extra_config
        return lines

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
                env=_child_env(),
                start_new_session=True,  # Ctrl-C in the terminal does not reach it
                # Only prctl(PR_SET_PDEATHSIG) runs in the child; the death signal is tied
                # to the forking thread, hence main thread only.
                preexec_fn=_die_with_parent if (in_main and _libc is not None) else None,  # noqa: PLW1509
            )
        self._paused = False

    def probe(self) -> tuple[bool, str]:
        """One readiness check: (answered?, detail)."""
        try:
            reply = redis_command(self.host, self.port, "PING", password=self.password, timeout=0.5)
        except RespError as exc:
            # An auth error still proves the server is up and serving commands.
            text = str(exc)
            return text.startswith(("NOAUTH", "WRONGPASS", "NOPERM")), text
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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "paused" if self.is_paused else ("running" if self.is_running else "stopped")
        return f"<{type(self).__name__} {self.name} {self.host}:{self.port} {state}>"

    # -- convenience -----------------------------------------------------

    def command(self, *args: object, timeout: float = 2.0) -> Any:
        """Run one command over the tiny built-in client (authenticated if ``password``)."""
        return redis_command(self.host, self.port, *args, password=self.password, timeout=timeout)

    def info(self, section: str = "replication") -> dict[str, str]:
        return _parse_info(self.command("INFO", section))

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


# ---------------------------------------------------------------------------
# TLS
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TLSFiles:
    """PEM files made at test time: a CA, a server cert (SAN IP:127.0.0.1, DNS:localhost),
    a client cert (for ``tls-auth-clients yes``) and a second, unrelated CA."""

    directory: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    wrong_ca_cert: Path
    wrong_ca_key: Path


_OPENSSL_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = distbrake-test
[v3_ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
[v3_server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
[v3_client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
"""

_tls_files: TLSFiles | None = None
_tls_lock = threading.Lock()


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        [OPENSSL, *args],
        cwd=cwd,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
        check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"openssl {' '.join(args)} failed ({result.returncode}):\n"
            f"{result.stdout.decode(errors='replace')}{result.stderr.decode(errors='replace')}"
        )


def _cleanup_tls_dir(path: Path) -> None:
    if not KEEP_DIRS:
        shutil.rmtree(path, ignore_errors=True)


def tls_files() -> TLSFiles:
    """Generate (once per process, EC P-256, 2-day validity) and return the TLS files."""
    global _tls_files
    with _tls_lock:
        if _tls_files is not None:
            return _tls_files
        if not Path(OPENSSL).exists():
            raise RuntimeError("the openssl CLI is needed to make test certificates")
        d = Path(tempfile.mkdtemp(prefix="distbrake-tls-"))
        atexit.register(_cleanup_tls_dir, d)
        (d / "openssl.cnf").write_text(_OPENSSL_CNF)
        newkey = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        for ca in ("ca", "wrong-ca"):
            _openssl(
                "req",
                "-x509",
                "-new",
                *newkey,
                "-keyout",
                f"{ca}.key",
                "-out",
                f"{ca}.crt",
                "-days",
                "2",
                "-config",
                "openssl.cnf",
                "-extensions",
                "v3_ca",
                "-subj",
                f"/O=distbrake tests/CN=distbrake {ca} {secrets.token_hex(4)}",
                cwd=d,
            )
        for leaf, cn in (("server", "localhost"), ("client", "distbrake-client")):
            _openssl(
                "req",
                "-new",
                *newkey,
                "-keyout",
                f"{leaf}.key",
                "-out",
                f"{leaf}.csr",
                "-config",
                "openssl.cnf",
                "-subj",
                f"/O=distbrake tests/CN={cn}",
                cwd=d,
            )
            _openssl(
                "x509",
                "-req",
                "-in",
                f"{leaf}.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-set_serial",
                f"0x{secrets.token_hex(8)}",
                "-days",
                "2",
                "-sha256",
                "-extfile",
                "openssl.cnf",
                "-extensions",
                f"v3_{leaf}",
                "-out",
                f"{leaf}.crt",
                cwd=d,
            )
        for key in d.glob("*.key"):
            key.chmod(0o600)
        _tls_files = TLSFiles(
            directory=d,
            ca_cert=d / "ca.crt",
            ca_key=d / "ca.key",
            server_cert=d / "server.crt",
            server_key=d / "server.key",
            client_cert=d / "client.crt",
            client_key=d / "client.key",
            wrong_ca_cert=d / "wrong-ca.crt",
            wrong_ca_key=d / "wrong-ca.key",
        )
        return _tls_files


class TLSRedisServer(RedisServer):
    """A TLS-only node (``port 0``, ``tls-port N``); readiness is checked with
    ``redis-cli --tls --cacert``.  :attr:`port` is the TLS port."""

    kind = "redis-tls"

    def __init__(self, *, tls_auth_clients: bool = False, **kwargs: Any) -> None:
        """tls_auth_clients: require client certificates (use :attr:`client_cert_path`)."""
        self.tls = tls_files()
        self.tls_auth_clients = tls_auth_clients
        super().__init__(**kwargs)

    @property
    def ca_path(self) -> str:
        return str(self.tls.ca_cert)

    @property
    def wrong_ca_path(self) -> str:
        """A CA that did not sign the server certificate: verification must fail."""
        return str(self.tls.wrong_ca_cert)

    @property
    def cert_path(self) -> str:
        return str(self.tls.server_cert)

    @property
    def key_path(self) -> str:
        return str(self.tls.server_key)

    @property
    def client_cert_path(self) -> str:
        return str(self.tls.client_cert)

    @property
    def client_key_path(self) -> str:
        return str(self.tls.client_key)

    @property
    def url(self) -> str:
        """``rediss://127.0.0.1:N``."""
        return f"rediss://{self.host}:{self.port}"

    def _listen_lines(self) -> list[str]:
        return [
            "port 0",
            f"tls-port {self.port}",
            f"tls-cert-file {_quote(self.cert_path)}",
            f"tls-key-file {_quote(self.key_path)}",
            f"tls-ca-cert-file {_quote(self.ca_path)}",
            f"tls-auth-clients {'yes' if self.tls_auth_clients else 'no'}",
        ]

    def ssl_context(
        self, *, cafile: str | None = None, client_cert: bool | None = None
    ) -> ssl.SSLContext:
        """A verifying client context (CA: ours unless ``cafile``), plus client cert if needed."""
        ctx = ssl.create_default_context(cafile=cafile or self.ca_path)
        if client_cert if client_cert is not None else self.tls_auth_clients:
            ctx.load_cert_chain(self.client_cert_path, self.client_key_path)
        return ctx

    def probe(self) -> tuple[bool, str]:
        cmd = [REDIS_CLI, "--tls", "--cacert", self.ca_path, "-h", self.host, "-p", str(self.port)]
        if self.tls_auth_clients:
            cmd += ["--cert", self.client_cert_path, "--key", self.client_key_path]
        if self.password is not None:
            cmd += ["--no-auth-warning", "-a", self.password]
        cmd.append("PING")
        try:
            result = subprocess.run(
                cmd,
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=5,
                env=_child_env(),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            return False, repr(exc)
        out = (result.stdout + result.stderr).decode(errors="replace").strip()
        if result.returncode == 0 and (
            out == "PONG" or out.startswith(("NOAUTH", "WRONGPASS", "NOPERM"))
        ):
            return True, out
        return False, out

    def command(self, *args: object, timeout: float = 2.0) -> Any:
        return redis_command(
            self.host,
            self.port,
            *args,
            password=self.password,
            timeout=timeout,
            ssl_context=self.ssl_context(),
        )

    def client(self, **kwargs: Any) -> redis.Redis:
        """redis-py client over TLS verifying against :attr:`ca_path`."""
        options: dict[str, Any] = {"ssl": True, "ssl_ca_certs": self.ca_path}
        if self.tls_auth_clients:
            options.update(ssl_certfile=self.client_cert_path, ssl_keyfile=self.client_key_path)
        options.update(kwargs)
        return super().client(**options)


# ---------------------------------------------------------------------------
# cluster
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterNodeInfo:
    """One line of ``CLUSTER NODES`` as seen by some node."""

    node_id: str
    host: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    link_state: str
    slots: tuple[str, ...] = field(default=())

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def is_failing(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})

    @classmethod
    def parse_all(cls, text: str) -> list[ClusterNodeInfo]:
        nodes = []
        for line in text.splitlines():
            fields = line.split()
            if len(fields) < 8:
                continue
            address = fields[1].split(",")[0]  # ip:port@cport[,hostname]
            host, _, rest = address.rpartition(":")
            nodes.append(
                cls(
                    node_id=fields[0],
                    host=host,
                    port=int(rest.split("@")[0]),
                    flags=frozenset(fields[2].split(",")),
                    master_id=None if fields[3] == "-" else fields[3],
                    link_state=fields[7],
                    slots=tuple(s for s in fields[8:] if not s.startswith("[")),
                )
            )
        return nodes


class RedisCluster:
    """``masters`` masters (+``replicas_per_master`` replicas each) made with
    ``redis-cli --cluster create``, waited on until every node reports
    ``cluster_state:ok``, all nodes agree on the topology and every replica's
    link is up.  Use as a context manager or call :meth:`start` / :meth:`close`."""

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas_per_master: int = 0,
        password: str | None = None,
        appendonly: bool = False,
        node_timeout_ms: int = 2000,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
    ) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.password = password
        self.replicas_per_master = replicas_per_master
        self.node_timeout_ms = node_timeout_ms
        self.startup_timeout = startup_timeout
        cluster_args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(node_timeout_ms),
            # Always let a replica take over, however stale: keeps failover tests deterministic.
            "--cluster-replica-validity-factor",
            "0",
        ]
        total = masters * (1 + replicas_per_master)
        self.nodes: list[RedisServer] = [
            RedisServer(
                password=password,
                appendonly=appendonly,
                extra_args=[*cluster_args, *extra_args],
                startup_timeout=startup_timeout,
                name=f"cluster-node{i}",
            )
            for i in range(total)
        ]
        self.initial_masters: list[RedisServer] = []
        self._node_ids: dict[int, str] = {}
        self._started = False

    # -- addresses -------------------------------------------------------

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """(host, port) of the masters as created (static, even after a failover)."""
        return [n.address for n in (self.initial_masters or self.nodes)]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``."""
        return "redis+cluster://" + ",".join(f"{h}:{p}" for h, p in self.startup_nodes)

    def _by_port(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(f"no cluster node on port {port}")

    # -- lifecycle -------------------------------------------------------

    def start(self) -> Self:
        if self._started:
            return self
        try:
            for node in self.nodes:
                node.start(wait=False)
            for node in self.nodes:
                node.wait_ready()
            self._create()
            self.wait_healthy(self.startup_timeout)
            self._node_ids = {n.port: str(n.command("CLUSTER", "MYID")) for n in self.nodes}
            self.initial_masters = self.masters
        except BaseException:
            self.close()
            raise
        self._started = True
        return self

    def _create(self) -> None:
        cmd = [REDIS_CLI, "--cluster", "create", *(f"{n.host}:{n.port}" for n in self.nodes)]
        cmd += ["--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"]
        if self.password is not None:
            cmd += ["--no-auth-warning", "-a", self.password]
        try:
            result = subprocess.run(
                cmd,
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=self.startup_timeout,
                env=_child_env(),
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise RedisStartupError(
                f"redis-cli --cluster create timed out: {exc}\n{self._logs()}"
            ) from exc
        out = (result.stdout + result.stderr).decode(errors="replace")
        if result.returncode != 0 or "[OK] All 16384 slots covered" not in out:
            raise RedisStartupError(
                f"redis-cli --cluster create failed ({result.returncode}):\n{out}\n{self._logs()}"
            )

    def _logs(self, lines: int = 15) -> str:
        return "\n".join(n.log_tail(lines) for n in self.nodes)

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    stop = close

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- topology --------------------------------------------------------

    def running_nodes(self) -> list[RedisServer]:
        """Nodes whose process is alive and not paused."""
        return [n for n in self.nodes if n.is_running and not n.is_paused]

    def view(self, node: RedisServer | None = None) -> list[ClusterNodeInfo]:
        """``CLUSTER NODES`` as seen by ``node`` (default: the first running node)."""
        node = node or self.running_nodes()[0]
        return ClusterNodeInfo.parse_all(node.command("CLUSTER", "NODES"))

    def node_id(self, node: RedisServer) -> str:
        if node.port not in self._node_ids:
            self._node_ids[node.port] = str(node.command("CLUSTER", "MYID"))
        return self._node_ids[node.port]

    @property
    def masters(self) -> list[RedisServer]:
        """Current masters owning slots, as a running node sees them now (live query)."""
        return [
            self._by_port(i.port)
            for i in sorted(self.view(), key=lambda i: i.port)
            if i.is_master and i.slots and "fail" not in i.flags
        ]

    @property
    def replicas(self) -> list[RedisServer]:
        """Current replicas (live query)."""
        return [
            self._by_port(i.port)
            for i in sorted(self.view(), key=lambda i: i.port)
            if "slave" in i.flags and "fail" not in i.flags
        ]

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        mid = self.node_id(master)
        return [
            self._by_port(i.port) for i in self.view() if "slave" in i.flags and i.master_id == mid
        ]

    def node_for_key(self, key: str | bytes) -> RedisServer:
        """The master currently serving ``key``'s slot."""
        slot = int(self.running_nodes()[0].command("CLUSTER", "KEYSLOT", key))
        for info in self.view():
            if not info.is_master or "fail" in info.flags:
                continue
            for spec in info.slots:
                lo, _, hi = spec.partition("-")
                if int(lo) <= slot <= int(hi or lo):
                    return self._by_port(info.port)
        raise LookupError(f"no master serves slot {slot}")

    def _health_problem(self) -> str | None:
        """None if healthy, else a description of what is not settled yet."""
        running = self.running_nodes()
        if not running:
            return "no running nodes"
        running_ports = {n.port for n in running}
        signature: dict[int, tuple[str, int | None, tuple[str, ...]]] | None = None
        for node in running:
            info = _parse_info(node.command("CLUSTER", "INFO"))
            if info.get("cluster_state") != "ok" or info.get("cluster_slots_assigned") != "16384":
                state, slots = info.get("cluster_state"), info.get("cluster_slots_assigned")
                return f"{node.port}: cluster_state={state} slots_assigned={slots}"
            view = ClusterNodeInfo.parse_all(node.command("CLUSTER", "NODES"))
            ports_by_id = {i.node_id: i.port for i in view}
            seen = {i.port: i for i in view if i.port in running_ports}
            if set(seen) != running_ports:
                return f"{node.port} does not know {sorted(running_ports - set(seen))} yet"
            for i in seen.values():
                if i.is_failing or ("myself" not in i.flags and i.link_state != "connected"):
                    return f"{node.port} sees {i.port} as {sorted(i.flags)} {i.link_state}"
            sig = {
                i.port: (
                    "master" if i.is_master else "replica",
                    ports_by_id.get(i.master_id or ""),
                    i.slots,
                )
                for i in seen.values()
            }
            if signature is None:
                signature = sig
            elif sig != signature:
                return f"nodes disagree on the topology (seen from {node.port})"
            if "slave" in seen[node.port].flags:
                link = node.info("replication").get("master_link_status")
                if link != "up":
                    return f"replica {node.port}: master_link_status={link}"
        return None

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Wait until every running node says cluster_state:ok, all agree on roles and
        slots, and every running replica's link is up."""
        problem: list[str | None] = ["not checked yet"]

        def healthy() -> bool:
            problem[0] = self._health_problem()
            return problem[0] is None

        wait_until(
            healthy,
            timeout=timeout,
            message=lambda: f"cluster not healthy: {problem[0]}\n{self._logs(8)}",
        )

    def kill_master_and_wait_failover(
        self, master: RedisServer, timeout: float = 30.0
    ) -> RedisServer:
        """SIGKILL ``master``, wait (bounded) until one of its replicas is promoted and
        every surviving node is healthy again; returns the promoted node."""
        candidates = {r.port for r in self.replicas_of(master)}
        if not candidates:
            raise ValueError(f"{master!r} has no replica to fail over to")
        master.kill()

        def promoted() -> RedisServer | None:
            survivors = self.running_nodes()
            chosen: set[int] = set()
            for node in survivors:
                info = _parse_info(node.command("CLUSTER", "INFO"))
                if info.get("cluster_state") != "ok":
                    return None
                winners = {
                    i.port
                    for i in ClusterNodeInfo.parse_all(node.command("CLUSTER", "NODES"))
                    if i.port in candidates and i.is_master and i.slots
                }
                if len(winners) != 1:
                    return None
                chosen |= winners
            return self._by_port(chosen.pop()) if len(chosen) == 1 else None

        node: RedisServer = wait_until(
            promoted,
            timeout=timeout,
            message=lambda: f"no replica of {master.port} was promoted\n{self._logs(8)}",
        )
        self.wait_healthy(timeout)
        return node

    def client(self, **kwargs: Any) -> redis.cluster.RedisCluster:
        """redis-py cluster client over :attr:`startup_nodes`."""
        from redis.cluster import ClusterNode
        from redis.cluster import RedisCluster as PyRedisCluster

        options: dict[str, Any] = {
            "startup_nodes": [
                ClusterNode(h, p)  # type: ignore[no-untyped-call]
                for h, p in self.startup_nodes
            ],
            "password": self.password,
        }
        options.update(kwargs)
        return PyRedisCluster(**options)


# ---------------------------------------------------------------------------
# sentinel
# ---------------------------------------------------------------------------


class SentinelServer(RedisServer):
    """A ``redis-server --sentinel`` process monitoring one service."""

    kind = "sentinel"

    def __init__(
        self,
        *,
        service_name: str,
        master_port: int,
        quorum: int = 1,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        auth_pass: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.service_name = service_name
        self.master_port = master_port
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.auth_pass = auth_pass
        super().__init__(**kwargs)

    def config_lines(self) -> list[str]:
        s = self.service_name
        lines = [
            f"port {self.port}",
            f"bind {HOST}",
            "daemonize no",
            f"dir {_quote(str(self.dir))}",
            f"logfile {_quote(self.log_path.name)}",
            f"sentinel monitor {s} {HOST} {self.master_port} {self.quorum}",
            f"sentinel down-after-milliseconds {s} {self.down_after_ms}",
            f"sentinel failover-timeout {s} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {s} 1",
        ]
        if self.auth_pass is not None:
            lines.append(_directive(f"sentinel auth-pass {s}", [self.auth_pass]))
        lines += [_directive(name, values) for name, values in self._directives]
        lines += self.extra_config
        return lines

    def _write_config(self) -> None:
        # Sentinel rewrites its config (known replicas, epochs): keep that on restart.
        if not self.config_path.exists():
            super()._write_config()

    def _command_line(self) -> list[str]:
        return [REDIS_SERVER, str(self.config_path), "--sentinel"]

    def probe(self) -> tuple[bool, str]:
        try:
            reply = redis_command(self.host, self.port, "PING", timeout=0.5)
        except (OSError, RespError) as exc:
            return False, repr(exc)
        return reply == "PONG", repr(reply)

    def command(self, *args: object, timeout: float = 2.0) -> Any:
        return redis_command(self.host, self.port, *args, timeout=timeout)


class SentinelSetup:
    """One master + ``replicas`` replicas + ``sentinels`` sentinels (quorum 1 by
    default) monitoring ``service_name``.  Ready when the master's replicas are
    online and every sentinel reports the master and knows every replica."""

    def __init__(
        self,
        *,
        service_name: str = "mymaster",
        replicas: int = 1,
        sentinels: int = 1,
        quorum: int = 1,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        password: str | None = None,
        appendonly: bool = False,
        startup_timeout: float = 20.0,
    ) -> None:
        self.service_name = service_name
        self.password = password
        self.startup_timeout = startup_timeout
        self.master = RedisServer(password=password, appendonly=appendonly, name="sentinel-master")
        self.replicas: list[RedisServer] = [
            RedisServer(
                password=password,
                appendonly=appendonly,
                extra_args=["--replicaof", HOST, str(self.master.port)],
                name=f"sentinel-replica{i}",
            )
            for i in range(replicas)
        ]
        self.sentinels: list[SentinelServer] = [
            SentinelServer(
                service_name=service_name,
                master_port=self.master.port,
                quorum=quorum,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
                auth_pass=password,
                name=f"sentinel{i}",
            )
            for i in range(sentinels)
        ]
        self._started = False

    @property
    def replica(self) -> RedisServer:
        return self.replicas[0]

    @property
    def sentinel(self) -> SentinelServer:
        return self.sentinels[0]

    @property
    def data_nodes(self) -> list[RedisServer]:
        return [self.master, *self.replicas]

    @property
    def sentinel_address(self) -> tuple[str, int]:
        return self.sentinel.address

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [s.address for s in self.sentinels]

    @property
    def sentinel_url(self) -> str:
        """``redis+sentinel://127.0.0.1:SPORT[,...]/mymaster``."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinel_addresses)
        return f"redis+sentinel://{hosts}/{self.service_name}"

    def start(self) -> Self:
        if self._started:
            return self
        try:
            for node in self.data_nodes:
                node.start(wait=False)
            for node in self.data_nodes:
                node.wait_ready()
            # Replicas must be online first: a sentinel learns about replicas from the
            # master's INFO, which it only re-reads every 10 s in the steady state.
            wait_until(
                self._replicas_online,
                timeout=self.startup_timeout,
                message=lambda: f"replicas did not sync\n{self._logs()}",
            )
            for sentinel in self.sentinels:
                sentinel.start(wait=False)
            for sentinel in self.sentinels:
                sentinel.wait_ready()
            self.wait_sentinels_agree(self.master, self.startup_timeout)
        except BaseException:
            self.close()
            raise
        self._started = True
        return self

    def _logs(self, lines: int = 15) -> str:
        return "\n".join(n.log_tail(lines) for n in [*self.data_nodes, *self.sentinels])

    def _replicas_online(self, master: RedisServer | None = None) -> bool:
        master = master or self.master
        info = master.info("replication")
        expected = {r.port for r in self.replicas if r is not master and r.is_running}
        online = {
            int(_pairs_from_slave_line(v).get("port", "0"))
            for k, v in info.items()
            if k.startswith("slave")
            and k[5:].isdigit()
            and _pairs_from_slave_line(v).get("state") == "online"
        }
        return expected <= online

    def wait_sentinels_agree(self, master: RedisServer, timeout: float = 20.0) -> None:
        """Wait until every sentinel names ``master`` for the service, sees it up, knows
        every other running data node as a connected replica and (with several
        sentinels) knows the other sentinels."""
        problem: list[str] = ["not checked yet"]

        def agreed() -> bool:
            for sentinel in self.sentinels:
                if not sentinel.is_running:
                    continue
                addr = sentinel.command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name)
                if addr != [HOST, str(master.port)]:
                    problem[0] = f"sentinel {sentinel.port} reports master {addr}"
                    return False
                flags = str(
                    _pairs_to_dict(sentinel.command("SENTINEL", "MASTER", self.service_name))[
                        "flags"
                    ]
                )
                if flags != "master":
                    problem[0] = f"sentinel {sentinel.port} master flags {flags}"
                    return False
                known = {
                    int(d["port"]): d
                    for d in map(
                        _pairs_to_dict, sentinel.command("SENTINEL", "REPLICAS", self.service_name)
                    )
                }
                for node in self.data_nodes:
                    if node is master or not node.is_running:
                        continue
                    d = known.get(node.port)
                    if (
                        d is None
                        or d.get("flags") != "slave"
                        or d.get("master-link-status") != "ok"
                    ):
                        problem[0] = (
                            f"sentinel {sentinel.port} replica {node.port}: {d and d.get('flags')}"
                        )
                        return False
                others = sentinel.command("SENTINEL", "SENTINELS", self.service_name)
                if len(others) < sum(1 for s in self.sentinels if s.is_running) - 1:
                    problem[0] = f"sentinel {sentinel.port} knows {len(others)} other sentinels"
                    return False
            return True

        wait_until(
            agreed,
            timeout=timeout,
            message=lambda: f"sentinels not settled: {problem[0]}\n{self._logs(8)}",
        )

    def current_master_address(self) -> tuple[str, int]:
        """What the first running sentinel says the master is."""
        sentinel = next(s for s in self.sentinels if s.is_running)
        host, port = sentinel.command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name)
        return str(host), int(port)

    def current_master(self) -> RedisServer:
        _, port = self.current_master_address()
        return next(n for n in self.data_nodes if n.port == port)

    def kill_master_and_wait_failover(self, timeout: float = 30.0) -> RedisServer:
        """SIGKILL the current master; wait until the sentinels promote a replica which
        then reports role:master; returns the new master."""
        old = self.current_master()
        old.kill()

        def promoted() -> RedisServer | None:
            _, port = self.current_master_address()
            if port == old.port:
                return None
            new = next(n for n in self.data_nodes if n.port == port)
            return new if new.info("replication").get("role") == "master" else None

        new_master: RedisServer = wait_until(
            promoted,
            timeout=timeout,
            message=lambda: f"no failover away from {old.port}\n{self._logs(8)}",
        )
        # Until then redis-py's Sentinel.discover_master may still refuse the new master.
        self.wait_sentinels_agree(new_master, timeout)
        return new_master

    def close(self) -> None:
        for node in [*self.sentinels, *self.data_nodes]:
            node.close()

    stop = close

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def sentinel_client(self, **kwargs: Any) -> redis.sentinel.Sentinel:
        """redis-py ``Sentinel`` over all sentinels (data-node password preset)."""
        from redis.sentinel import Sentinel

        options: dict[str, Any] = {"password": self.password}
        options.update(kwargs)
        return Sentinel(self.sentinel_addresses, **options)  # type: ignore[no-untyped-call]


def _pairs_from_slave_line(value: str) -> dict[str, str]:
    """``ip=127.0.0.1,port=1234,state=online,...`` -> dict."""
    return dict(part.split("=", 1) for part in value.split(",") if "=" in part)
