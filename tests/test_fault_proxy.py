"""The fault proxy itself (tests/fault_proxy.py): closing it leaves no connection of its own open."""

from __future__ import annotations

import gc
import socket
import threading
import warnings
from typing import Any

from tests.fault_proxy import FaultProxy
from tests.servers.process import HOST, free_port

WAIT = 10.0  # an upper bound on each wait, never a target


def test_a_connection_accepted_as_the_proxy_closes_is_closed_with_it() -> None:
    """asyncio accepts in two steps (the accept, then a task that makes the transport and attaches it to the
    server). A close() whose shutdown runs between the two used to close the server first: the attach failed
    (swallowed by asyncio), and the transport stayed open until the garbage collector found it, in some later
    test, failing that test (ResourceWarning: unclosed transport). The proxy's loop is held so that the order
    is that one every time: the shutdown is queued, then the pending connection is accepted, then both run."""
    proxy = FaultProxy((HOST, free_port())).start()  # the upstream is never dialled here
    loop: Any = proxy._loop
    held, queued = threading.Event(), threading.Event()
    enqueue = loop.call_soon_threadsafe

    def hold() -> None:  # runs on the proxy's loop: it goes on once close() has queued its shutdown
        held.set()
        queued.wait(WAIT)

    def enqueued(*args: Any, **kwargs: Any) -> Any:
        handle = enqueue(*args, **kwargs)
        queued.set()
        return handle

    enqueue(hold)
    assert held.wait(WAIT)
    loop.call_soon_threadsafe = enqueued
    client = socket.create_connection(proxy.address, timeout=WAIT)  # completed by the kernel, not accepted yet
    gc_was_enabled = gc.isenabled()
    gc.disable()  # only the collection below may find a leaked transport, in this thread, under this filter
    try:
        closer = threading.Thread(target=proxy.close)
        closer.start()
        closer.join(WAIT * 3)
        assert not closer.is_alive()
        with client:
            assert client.recv(1) == b""  # the proxy hung up on it (a leaked socket stays open: no EOF)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gc.collect()
    finally:
        if gc_was_enabled:
            gc.enable()
    assert proxy.connections == 1
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
