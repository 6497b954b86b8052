"""A batch written and its replies read at once, without a timer or a task per write or per reply.

redis.asyncio writes each command under `asyncio.wait_for` (a task and a
timer per write); `write_all` writes a connected connection's batch straight
to its stream. Both leave the timeout to the caller: the batch's deadline
bounds the whole exchange.

redis.asyncio reads a pipeline's replies one `read_response` at a time, each
a chain of coroutines and a timer. `read_replies` takes them from the
connection's own hiredis reader (the parser redis-py built for it, so error
replies are redis-py's exception classes) and awaits the socket only when
the reader runs dry (a RESP3 push goes to redis-py's handler, as it would).
Without hiredis it reads them the usual way. `SyncExchange` is the same
for one command on a sync connection: written to its socket, the reply taken
from its hiredis reader (the socket's own timeout bounds each wait); a
connection not connected yet, or without hiredis, goes redis-py's way
(`exchange`).
"""

from __future__ import annotations

import math
from typing import Any, cast

import redis.exceptions

__all__ = ["SyncExchange", "exchange", "read_replies", "write_all"]

_HIREDIS: Any
try:  # redis-py's own hiredis parsers: their reader, error classes and "not enough data" marker
    from redis._parsers import hiredis as _HIREDIS
    NOT_ENOUGH_DATA, ASYNC_PARSER, SYNC_PARSER = (
        _HIREDIS.NOT_ENOUGH_DATA, _HIREDIS._AsyncHiredisParser, _HIREDIS._HiredisParser
    )
except (ImportError, AttributeError):  # pragma: no cover - another redis-py: every read goes the usual way
    NOT_ENOUGH_DATA = ASYNC_PARSER = SYNC_PARSER = None
try:
    from redis._parsers.socket import SERVER_CLOSED_CONNECTION_ERROR as SERVER_CLOSED
except ImportError:  # pragma: no cover - another redis-py
    SERVER_CLOSED = "Connection closed by server."


async def write_all(connection: Any, packed: list[bytes]) -> None:
    """Write `packed` on `connection` (connecting it first the usual way, as redis-py would)."""
    writer = getattr(connection, "_writer", None)
    if writer is None or not connection.is_connected or getattr(connection, "health_check_interval", None):
        await connection.send_packed_command(packed)
        return
    try:
        writer.writelines(packed)
        await writer.drain()
    except OSError as error:
        await connection.disconnect(nowait=True)
        raise redis.exceptions.ConnectionError(f"Error while writing to socket: {error.args}") from error
    except BaseException:  # interrupted half-way: the connection may hold half a command
        await connection.disconnect(nowait=True)
        raise


async def read_replies(connection: Any, count: int) -> list[Any]:
    """`count` replies from `connection`; an error reply is returned as its exception, not raised."""
    parser = getattr(connection, "_parser", None)
    reader = getattr(parser, "_reader", None)
    if type(parser) is not ASYNC_PARSER or reader is None or not getattr(parser, "_connected", False):
        return await _one_by_one(connection, count)
    hiredis_parser = cast(Any, parser)
    push = getattr(hiredis_parser, "_hiredis_PushNotificationType", None) or _NoPush
    replies: list[Any] = []
    gets, fill = reader.gets, hiredis_parser.read_from_socket
    while len(replies) < count:
        reply = gets()
        if reply is NOT_ENOUGH_DATA:
            try:
                await fill()
            except OSError as error:
                raise redis.exceptions.ConnectionError(f"Error while reading: {error.args}") from error
            continue
        if isinstance(reply, redis.exceptions.ConnectionError):
            raise reply
        if isinstance(reply, push):  # RESP3: a push the server sent unasked is not a reply; redis-py handles it
            await hiredis_parser.handle_push_response(reply)
            continue
        replies.append(reply)
    return replies


class _NoPush:
    """No reply is one of these (hiredis without push notifications)."""


async def _one_by_one(connection: Any, count: int) -> list[Any]:
    replies: list[Any] = []
    for _ in range(count):
        try:
            replies.append(await connection.read_response(timeout=math.inf))
        except redis.exceptions.ResponseError as error:
            replies.append(error)
    return replies


class SyncExchange:
    """One command at a time on one sync connection, with what it reads of the connection (its socket, hiredis
    reader and read buffer) looked up again only when the socket is not the one last seen (a new connect): one
    attribute test per command. The reply is read the way redis-py's hiredis parser reads it (`read_from_socket`)."""

    __slots__ = ("_buffer", "_parser", "_push", "_reader", "_sock", "connection")

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self._sock: Any = None  # the socket the rest was read for (kept: its id is never another socket's)
        self._parser: Any = None
        self._reader: Any = None
        self._buffer: Any = None
        self._push: Any = _NoPush

    def __call__(self, packed: bytes) -> Any:
        """Send one packed command and return its reply (an error reply raised)."""
        sock = getattr(self.connection, "_sock", None)
        if sock is None or (sock is not self._sock and not self._bind(sock)):
            return exchange(self.connection, packed)
        try:
            sock.sendall(packed)
        except TimeoutError:
            self.connection.disconnect()
            raise redis.exceptions.TimeoutError("Timeout writing to socket") from None
        except OSError as error:
            self.connection.disconnect()
            raise redis.exceptions.ConnectionError(f"Error while writing to socket: {error.args}") from error
        reader, buffer = self._reader, self._buffer
        while True:
            reply = reader.gets()
            while reply is NOT_ENOUGH_DATA:
                try:
                    size = sock.recv_into(buffer)
                except TimeoutError:
                    raise redis.exceptions.TimeoutError("Timeout reading from socket") from None
                except OSError as error:
                    raise redis.exceptions.ConnectionError(f"Error while reading: {error.args}") from error
                if not size:
                    raise redis.exceptions.ConnectionError(SERVER_CLOSED)
                reader.feed(buffer, 0, size)
                reply = reader.gets()
            if isinstance(reply, self._push):  # RESP3: a push the server sent unasked is not the reply
                self._parser.handle_push_response(reply)
                continue
            if isinstance(reply, (redis.exceptions.ResponseError, redis.exceptions.ConnectionError)):
                raise reply
            return reply

    def _bind(self, sock: Any) -> bool:
        """Read the connection's parser, reader and buffer for `sock`; False: its commands go `exchange`'s way."""
        connection = self.connection
        parser = getattr(connection, "_parser", None)
        reader = getattr(parser, "_reader", None)
        buffer = getattr(parser, "_buffer", None)
        self._sock = None
        if type(parser) is not SYNC_PARSER or reader is None or not isinstance(buffer, bytearray) or (
            connection.health_check_interval
        ):
            return False
        self._parser, self._reader, self._buffer = parser, reader, buffer
        self._push = getattr(parser, "_hiredis_PushNotificationType", None) or _NoPush
        self._sock = sock
        return True


def exchange(connection: Any, packed: bytes) -> Any:
    """Send one packed command on a sync redis-py connection the connection's own way (connecting it first if need
    be) and return its reply (an error reply raised): what `SyncExchange` falls back to."""
    connection.send_packed_command([packed])
    return connection.read_response()
