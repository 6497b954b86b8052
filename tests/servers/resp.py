"""RESP on the wire: encode a command, read a reply, find where a value ends, send one command."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Sequence
from typing import IO, Any

__all__ = [
    "RespError",
    "command_name",
    "encode_command",
    "pairs_to_dict",
    "parse_info",
    "read_reply",
    "redis_command",
    "resp_end",
]

_AGGREGATES = frozenset(b"*~>")  # n elements follow
_MAPS = frozenset(b"%|")  # n pairs follow
_BLOBS = frozenset(b"$!=")  # n bytes + CRLF follow
_LINES = frozenset(b"+-:_#,(")  # the line is the whole value


class RespError(Exception):
    """An error reply (``-ERR ...``) from Redis, raised by :func:`redis_command`."""


# ---------------------------------------------------------------------------
# tiny RESP2 client (admin/readiness only; tests should use redis-py)
# ---------------------------------------------------------------------------


def encode_command(args: Sequence[object]) -> bytes:
    """One command as a RESP array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def read_reply(f: IO[bytes]) -> Any:
    """One RESP2 reply from ``f``: str / int / None / nested lists, or a :class:`RespError`."""
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
        return [read_reply(f) for _ in range(n)]
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
        sock.sendall(b"".join(encode_command(c) for c in commands))
        with sock.makefile("rb") as f:
            replies = [read_reply(f) for _ in commands]
    finally:
        sock.close()
        raw.close()
    for reply in replies:
        if isinstance(reply, RespError):
            raise reply
    return replies[-1]


def parse_info(text: str) -> dict[str, str]:
    """The ``key:value`` lines of an ``INFO`` (or ``CLUSTER INFO``) reply."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and ":" in line:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def pairs_to_dict(flat: Sequence[Any]) -> dict[str, Any]:
    """``[k1, v1, k2, v2, ...]`` (a RESP2 map) -> dict."""
    return {str(flat[i]): flat[i + 1] for i in range(0, len(flat) - 1, 2)}


# ---------------------------------------------------------------------------
# framing a byte stream (the fault proxy pairs commands with replies)
# ---------------------------------------------------------------------------


class _Incomplete(Exception):
    pass


def _value_end(buf: bytes | bytearray, pos: int) -> int:
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        raise _Incomplete
    kind = buf[pos]
    if kind in _LINES:
        return eol + 2
    if kind not in _AGGREGATES and kind not in _MAPS and kind not in _BLOBS:
        return eol + 2  # an inline command: the line is the command
    size = int(buf[pos + 1 : eol])
    if kind in _BLOBS:
        if size < 0:
            return eol + 2
        end = eol + 2 + size + 2
        if end > len(buf):
            raise _Incomplete
        return end
    end = eol + 2
    for _ in range(max(size, 0) * (2 if kind in _MAPS else 1)):
        end = _value_end(buf, end)
    return end


def resp_end(buf: bytes | bytearray, pos: int = 0) -> int | None:
    """Where the RESP2/RESP3 value starting at ``pos`` ends, or None if it is incomplete."""
    if pos >= len(buf):
        return None
    try:
        return _value_end(buf, pos)
    except _Incomplete:
        return None


def command_name(raw: bytes) -> str:
    """The (upper-cased) name of a command in RESP array form, e.g. ``EVALSHA``."""
    if raw[:1] != b"*":
        return raw.split(b" ", 1)[0].strip().decode(errors="replace").upper()
    head = raw.find(b"\r\n")
    first = raw.find(b"\r\n", head + 2)
    size = int(raw[head + 3 : first])
    return raw[first + 2 : first + 2 + size].decode(errors="replace").upper()
