"""The physical floors of the bench: a raw socket, CPU pinning, and a pipelined raw-socket load.

* `RawConnection`: a plain Python socket writing pre-encoded commands and
  parsing replies with one hiredis reader (no client library in between):
  the floor of one round trip.
* `pinned`: client and server on one CPU while a figure runs (`--pin-cpu`),
  which reproduces the busy-machine state steadily; unpinned, on an idle
  machine, every round trip is dominated by CPU wake-ups.
* `server_time_per_call`: the server's own CPU time (INFO `used_cpu_*`, all
  in) and its scripts' time (INFO `commandstats`, the EVALSHAs alone) per
  command while our pipelined raw-socket load (16 commands per write,
  several connections) keeps it busy: what `server_cost` and
  `server_record` compare.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from distbrake.urls import ParsedURL

__all__ = ["RawConnection", "ServerTime", "pinned", "resp", "server_time_per_call"]

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def resp(*parts: bytes | str | int) -> bytes:
    """One command in Redis's wire format."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode("utf-8")
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class RawConnection:
    """A socket to the server of a redis:// or unix:// URL, replies parsed by hiredis."""

    def __init__(self, parsed: ParsedURL, timeout: float) -> None:
        import hiredis

        if parsed.connector == "unix":
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(timeout)
            sock.connect(parsed.path)
        elif parsed.connector == "redis":
            host, port = parsed.hosts[0]
            sock = socket.create_connection((host, port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if parsed.tls:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        else:
            raise ValueError(f"no raw connection to a {parsed.connector} URL")
        self.sock = sock
        self.reader = hiredis.Reader()
        if parsed.password is not None:
            auth = (parsed.username, parsed.password) if parsed.username else (parsed.password,)
            self.call(resp("AUTH", *auth))
        if parsed.db:
            self.call(resp("SELECT", parsed.db))

    def call(self, packed: bytes) -> Any:
        """Send one packed command and return its reply (an error reply is raised)."""
        self.sock.sendall(packed)
        return self.replies(1)[0]

    def replies(self, count: int) -> list[Any]:
        """Read `count` replies (an error reply is raised)."""
        out: list[Any] = []
        reader, recv = self.reader, self.sock.recv
        while len(out) < count:
            reply = reader.gets()
            if reply is False:
                data = recv(65536)
                if not data:
                    raise ConnectionError("the server closed the connection")
                reader.feed(data)
                continue
            if isinstance(reply, Exception):
                raise reply
            out.append(reply)
        return out

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def server_pid(parsed: ParsedURL, info: dict[str, Any]) -> int | None:
    """The pid of the server, when it runs on this machine (a Unix socket or a loopback address)."""
    local = parsed.connector == "unix" or (parsed.connector == "redis" and parsed.hosts[0][0] in LOCAL_HOSTS)
    pid = info.get("process_id")
    if not local or not isinstance(pid, int):
        return None
    try:
        os.sched_getaffinity(pid)
    except OSError:  # not ours to see (another container, another user)
        return None
    return pid


@contextlib.contextmanager
def pinned(enabled: bool, server: int | None) -> Iterator[str]:
    """Pin this process (and the server's pid, if given) to one CPU for the block; yields a note.

    The CPU is the last one this process may run on; both affinities are put
    back afterwards.
    """
    if not enabled:
        yield "unpinned"
        return
    ours = os.sched_getaffinity(0)
    cpu = max(ours)
    theirs = None
    if server is not None:
        try:
            theirs = os.sched_getaffinity(server)
            os.sched_setaffinity(server, {cpu})
        except OSError:
            theirs = None
    os.sched_setaffinity(0, {cpu})
    try:
        yield f"client and server pinned to CPU {cpu}" if theirs is not None else (
            f"client pinned to CPU {cpu} (the server is not local: unpinned)")
    finally:
        os.sched_setaffinity(0, ours)
        if theirs is not None and server is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(server, theirs)


class ServerTime(NamedTuple):
    """Seconds per command of a load: the server's CPU, all in (INFO cpu: network I/O and parsing too), and the
    time its EVALSHAs took inside it (INFO commandstats: the scripts alone, which client speed does not enter)."""

    cpu: float
    script: float


def _server_counters(connection: RawConnection) -> tuple[float, float, int]:
    """The server's CPU seconds so far, and its EVALSHAs' microseconds and calls so far."""
    text = connection.call(resp("INFO", "cpu", "commandstats")).decode("ascii", "replace")
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    evalsha = dict(part.split("=", 1) for part in fields.get("cmdstat_evalsha", "calls=0,usec=0").split(","))
    return (float(fields["used_cpu_user"]) + float(fields["used_cpu_sys"]), float(evalsha["usec"]),
            int(evalsha["calls"]))


def server_time_per_call(
    connections: Sequence[RawConnection], info: RawConnection, commands: Sequence[bytes], depth: int = 16,
) -> ServerTime:
    """The server's time per command while `connections` send `commands` (EVALSHAs), `depth` per write.

    Every connection has one write of `depth` commands in flight, so the
    server always has work queued (as with `redis-benchmark -P 16`).
    """
    batches = [b"".join(commands[i:i + depth]) for i in range(0, len(commands), depth)]
    sizes = [len(commands[i:i + depth]) for i in range(0, len(commands), depth)]
    cpu, usec, calls = _server_counters(info)
    pending: list[tuple[RawConnection, int]] = []
    index = 0
    while index < len(batches) or pending:
        for connection in connections:  # one write in flight on each connection
            if index < len(batches) and not any(c is connection for c, _ in pending):
                connection.sock.sendall(batches[index])
                pending.append((connection, sizes[index]))
                index += 1
        connection, size = pending.pop(0)
        connection.replies(size)
    cpu_after, usec_after, calls_after = _server_counters(info)
    return ServerTime((cpu_after - cpu) / len(commands), (usec_after - usec) / 1e6 / max(1, calls_after - calls))
