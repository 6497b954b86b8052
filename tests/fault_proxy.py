"""A small fault-injecting TCP proxy between a Redis client and a real redis-server.

The proxy runs an asyncio event loop in a background thread of its own, so a
test (sync or asyncio) drives it with plain method calls. It understands just
enough RESP to pair each command with its reply, which is what the faults need:

* ``pass_through()``: bytes go both ways unchanged (the default);
* ``drop_replies(n)``: the next ``n`` commands matching ``commands`` (default
  EVAL/EVALSHA) are forwarded and *executed* by Redis, but their (non-error)
  reply is thrown away and the client connection is closed: the client sees
  a lost reply for a command that did run. The mode then goes back to
  pass-through by itself;
* ``black_hole()``: connections are accepted and everything sent is
  swallowed; nothing is ever answered (also on connections already open);
* ``refuse()``: every connection, open or new, is closed at once;
* ``latency(seconds)``: every write towards Redis waits that long first (a
  slow network: one round trip costs at least that much; 0 to stop).

Counters (read them from any thread): ``connections`` (accepted so far),
``commands`` (forwarded to Redis), ``dropped`` (replies thrown away).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Self

from tests.servers.process import HOST, Managed
from tests.servers.resp import command_name, resp_end

__all__ = ["FaultProxy", "ProxyMode"]

ProxyMode = Literal["pass", "drop", "black_hole", "refuse"]

READ_SIZE = 65536


@dataclass(eq=False)
class _Link:
    """One client connection and its upstream connection."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    pending: deque[str] = field(default_factory=deque)  # names of commands awaiting replies
    closed: bool = False

    def close(self) -> None:
        # Every call closes both (closing a writer twice is a no-op): an upstream connected after the link
        # was closed (a refuse() or close_connections() while it connected) is closed by the next call.
        self.closed = True
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.close()


class FaultProxy(Managed):
    """A TCP proxy to ``upstream`` with switchable faults; see the module text."""

    def __init__(self, upstream: tuple[str, int], *, port: int = 0) -> None:
        self.upstream = upstream
        self._requested_port = port
        self.port = 0
        self.mode: ProxyMode = "pass"
        self.drop_commands: frozenset[str] = frozenset({"EVAL", "EVALSHA"})
        self.delay = 0.0
        self._drops_left = 0
        self._lock = threading.Lock()
        self.connections = 0
        self.commands = 0
        self.dropped = 0
        self._links: set[_Link] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self._ready = threading.Event()
        self._started = False
        self._closed = False
        self._stopping = False  # the proxy is closing: a connection accepted now is closed at once

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> Self:
        if self._started:
            return self
        self._started = True
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = future.result(timeout=10)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._accept, HOST, self._requested_port)
        return int(self._server.sockets[0].getsockname()[1])

    async def _shutdown(self) -> None:
        # The listener is closed last, once no task is left. asyncio accepts a connection in two steps: the
        # accept, then a task that wraps the socket in a transport and attaches it to the server. A server
        # closed between the two fails that attach (Python 3.11: an AssertionError, swallowed by asyncio): the
        # transport, never closed, outlives the loop and is collected in some later test, whose run it fails
        # (ResourceWarning: unclosed transport, an unraisable exception). So the listener stays open while the
        # tasks end (a connection accepted meanwhile is closed at once, see `_accept`), and is closed in the
        # same step that found no task left (no accept can start without an await in between).
        with self._lock:
            self._stopping = True
        # Closed links end their tasks by themselves (EOF); cancel only what is left. Until no task is left: a
        # transport left open when the loop closes would also be collected in some later test.
        while tasks := [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]:
            for link in list(self._links):
                link.close()
            _, pending = await asyncio.wait(tasks, timeout=5)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def close(self) -> None:
        """Close every connection and the listener, stop the thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._started:
            asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self._loop.close()

    @property
    def address(self) -> tuple[str, int]:
        return (HOST, self.port)

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}"

    # -- modes (callable from any thread) ------------------------------------------

    def _set_mode(self, mode: ProxyMode) -> None:
        with self._lock:
            self.mode = mode
            self._drops_left = 0
        if mode == "refuse" and self._started:
            self._call(self._close_all)

    def _call(self, function: Callable[[], None]) -> None:
        async def run() -> None:
            function()

        asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=10)

    def _close_all(self) -> None:
        for link in list(self._links):
            link.close()

    def pass_through(self) -> None:
        self._set_mode("pass")

    def black_hole(self) -> None:
        self._set_mode("black_hole")

    def refuse(self) -> None:
        self._set_mode("refuse")

    def drop_replies(self, n: int, commands: tuple[str, ...] = ("EVAL", "EVALSHA")) -> None:
        """Forward the next ``n`` matching commands, lose their replies (see the module text)."""
        with self._lock:
            self.mode = "drop"
            self.drop_commands = frozenset(c.upper() for c in commands)
            self._drops_left = n

    def latency(self, seconds: float) -> None:
        """Delay every write towards Redis by ``seconds`` (in any mode that forwards)."""
        with self._lock:
            self.delay = seconds

    @property
    def drops_left(self) -> int:
        with self._lock:
            return self._drops_left

    def close_connections(self) -> None:
        """Close every open connection now (the mode is unchanged)."""
        self._call(self._close_all)

    # -- the proxy -----------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with self._lock:
            self.connections += 1
            mode = self.mode
            stopping = self._stopping
        link = _Link(writer)
        self._links.add(link)
        try:
            if mode == "refuse" or stopping:
                return
            if mode == "black_hole":
                await self._swallow(reader)
                return
            try:
                up_reader, link.upstream = await asyncio.open_connection(*self.upstream)
            except OSError:
                return
            if link.closed:  # closed while it connected (refuse(), close_connections()): the upstream too
                return
            await asyncio.gather(
                self._client_to_upstream(reader, link),
                self._upstream_to_client(up_reader, link),
            )
        except (OSError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a connection task ends quietly, whatever ended it (asyncio would log a cancellation)
        finally:
            link.close()
            self._links.discard(link)
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await writer.wait_closed()
            if link.upstream is not None:
                with contextlib.suppress(OSError, asyncio.CancelledError):
                    await link.upstream.wait_closed()

    async def _swallow(self, reader: asyncio.StreamReader) -> None:
        while await reader.read(READ_SIZE):
            pass

    async def _read(self, reader: asyncio.StreamReader, link: _Link) -> tuple[bytes, ProxyMode] | None:
        """The next bytes from ``reader`` and the mode they arrive in; None once the link is closed or at EOF."""
        if link.closed:
            return None
        data = await reader.read(READ_SIZE)
        if not data:
            return None
        with self._lock:
            return data, self.mode

    async def _client_to_upstream(self, reader: asyncio.StreamReader, link: _Link) -> None:
        buf = bytearray()
        while (chunk := await self._read(reader, link)) is not None:
            data, mode = chunk
            if mode == "refuse":
                break
            if mode == "black_hole":
                continue
            buf += data
            start = 0
            count = 0
            while (end := resp_end(buf, start)) is not None:
                link.pending.append(command_name(bytes(buf[start:end])))
                start = end
                count += 1
            if start and link.upstream is not None:
                with self._lock:
                    self.commands += count
                    delay = self.delay
                if delay:
                    await asyncio.sleep(delay)  # the simulated network, never an assertion's wait
                link.upstream.write(bytes(buf[:start]))
                del buf[:start]
        link.close()

    def _should_drop(self, command: str, reply: bytes) -> bool:
        with self._lock:
            if self.mode != "drop" or command not in self.drop_commands or reply[:1] == b"-":
                return False
            self._drops_left -= 1
            self.dropped += 1
            if self._drops_left <= 0:
                self.mode = "pass"
            return True

    async def _upstream_to_client(self, reader: asyncio.StreamReader, link: _Link) -> None:
        buf = bytearray()
        while (chunk := await self._read(reader, link)) is not None:
            data, mode = chunk
            if mode in ("black_hole", "refuse"):
                continue
            buf += data
            start = 0
            out = bytearray()
            while (end := resp_end(buf, start)) is not None:
                reply = bytes(buf[start:end])
                start = end
                if reply[:1] == b">":  # a RESP3 push belongs to no command
                    out += reply
                    continue
                command = link.pending.popleft() if link.pending else ""
                if self._should_drop(command, reply):
                    # Redis ran it; the client never hears: answer what came before, then hang up.
                    if out:
                        link.client.write(bytes(out))
                    link.close()
                    return
                out += reply
            del buf[:start]
            if out:
                link.client.write(bytes(out))
        link.close()
