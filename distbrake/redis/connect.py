"""A backend URL -> a redis-py client (sync or asyncio), configured for the brake.

Every client built here gets the brake's timeout budget: each attempt may use
45% of `timeout_seconds` (connect and read alike) and redis-py retries a
failed command once (`Retry(NoBackoff(), 1)`), so one check never waits longer
than `timeout_seconds`; a Sentinel-managed client asks its sentinels within
that budget too (see `_sentinel_kwargs`). The retry is safe because every check carries a call
id (the host's, or a random one): a retried check that did reach Redis is
recognised and not counted twice.
"""

from __future__ import annotations

import collections
import concurrent.futures
import queue
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel
from redis.backoff import NoBackoff

from ..errors import InvalidURLError
from ..urls import ParsedURL, parse_number, parse_url
from .script import variant_for_hosts

__all__ = [
    "CONNECTORS", "Connector", "LazyClient", "async_client", "connector", "memory_server", "script_variant",
    "sync_client",
]

_TLS_OPTIONS = {
    "ssl_ca_certs": str,
    "ssl_ca_path": str,
    "ssl_certfile": str,
    "ssl_keyfile": str,
    "ssl_cert_reqs": str,
    "ssl_check_hostname": bool,
    "ssl_min_version": str,
}
_OTHER_OPTIONS = {"client_name": str, "max_connections": int, "sentinel_password": str,
                  "sentinel_username": str}
# The values redis-py understands, checked when the client is built: a bad one would otherwise
# fail only at the first connection (and a brake that fails open would just fall back, silently).
_CERT_REQS = ("none", "optional", "required")
_TLS_VERSIONS = {
    name.lower().replace("_", "."): version
    for name, version in (("TLSv1", ssl.TLSVersion.TLSv1), ("TLSv1_1", ssl.TLSVersion.TLSv1_1),
                          ("TLSv1_2", ssl.TLSVersion.TLSv1_2), ("TLSv1_3", ssl.TLSVersion.TLSv1_3))
}
_PATH_OPTIONS = ("ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile")

# Each of the two attempts (the first and its one retry) may take this share of the
# timeout, connect and read alike: two of them leave a tenth of it for the rest.
ATTEMPT_SHARE = 0.45

_memory_lock = threading.Lock()
if TYPE_CHECKING:
    import fakeredis

_memory_servers: dict[str, fakeredis.FakeServer] = {}


def memory_server(name: str) -> fakeredis.FakeServer:
    """The in-process fake server for `memory://name`, shared by every brake of this process.

    fakeredis is imported here, when memory:// is first used, never by `import distbrake`.
    """
    import fakeredis

    with _memory_lock:
        server = _memory_servers.get(name)
        if server is None:
            server = _memory_servers[name] = fakeredis.FakeServer(version=(7, 0))
        return server


class LazyClient:
    """A client built on first use (and built again after a failed attempt).

    With `wait`, a use waits at most that long for the build: a build that
    takes longer (redis-py's cluster client reads its startup nodes one after
    another, each within the attempt's timeout) goes on in the background, and
    the use fails as the backend failing (redis-py's `TimeoutError`), so no
    check waits on a build past its budget; a later use takes the client once
    it is built.
    """

    def __init__(self, build: Callable[[], Any], wait: float | None = None) -> None:
        self._build = build
        self._wait = wait
        self._client: Any = None
        self._lock = threading.Lock()
        self._pending: concurrent.futures.Future[Any] | None = None
        self._closes = 0  # how many times the client was closed: a build from before a close is not kept

    def __getattr__(self, name: str) -> Any:
        client = self._client
        if client is None:
            client = self._built()
        return getattr(client, name)

    def _built(self) -> Any:
        with self._lock:
            if self._client is not None:
                return self._client
            if self._wait is None:
                self._client = self._build()
                return self._client
            pending = self._pending
            if pending is None or (pending.done() and pending.exception() is not None):
                pending = self._pending = concurrent.futures.Future()
                threading.Thread(target=self._run, args=(pending,), name="distbrake-client-build",
                                 daemon=True).start()
            closes = self._closes
        try:
            client = pending.result(timeout=self._wait)
        except concurrent.futures.TimeoutError:
            raise redis.exceptions.TimeoutError(
                f"the client was not built within {self._wait:.3f} s (its startup nodes do not answer)"
            ) from None
        with self._lock:
            if self._closes != closes:  # closed while it was being built: `close` closes it (_close_built)
                raise redis.exceptions.ConnectionError("the client was closed while it was being built")
            self._client = client
        return client

    def _run(self, pending: concurrent.futures.Future[Any]) -> None:
        try:
            pending.set_result(self._build())
        except BaseException as error:  # handed to the use waiting for it (or the next one)
            pending.set_exception(error)

    def close(self) -> None:
        """Close the client if it was ever built (or when a build under way ends): closing never connects.

        A use after `close` builds a client anew (as redis-py's own clients reconnect after `close`)."""
        with self._lock:
            client, pending = self._client, self._pending
            self._client, self._pending, self._closes = None, None, self._closes + 1
        if client is not None:
            client.close()
        elif pending is not None:
            pending.add_done_callback(_close_built)


def _close_built(built: concurrent.futures.Future[Any]) -> None:
    if built.exception() is None:
        built.result().close()


def _bool(url: ParsedURL, name: str, text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise InvalidURLError(f"invalid backend URL {url.redacted!r}: {name} must be true or false")


def _text_option(url: ParsedURL, name: str, text: str) -> Any:
    """A text option's value as redis-py takes it, or `InvalidURLError` now (not at connect)."""
    def bad(why: str) -> InvalidURLError:
        return InvalidURLError(f"invalid backend URL {url.redacted!r}: {name} {why}")

    if name == "ssl_cert_reqs":
        if text.lower() not in _CERT_REQS:
            raise bad(f"must be one of {', '.join(_CERT_REQS)}")
        return text.lower()
    if name == "ssl_min_version":
        version = _TLS_VERSIONS.get(text.lower().replace("_", "."))
        if version is None:
            raise bad("must be a TLS version: TLSv1.2 or TLSv1.3 (also TLSv1, TLSv1.1, "
                      "or written TLSv1_2)")
        return version
    if name == "client_name" and not all("!" <= c <= "~" for c in text):
        # Redis refuses CLIENT SETNAME with spaces, newlines or other special characters.
        raise bad("may hold only printable ASCII characters without spaces")
    if name in _PATH_OPTIONS and not text:
        raise bad("must name a file or directory")
    return text


def _options(url: ParsedURL) -> dict[str, Any]:
    allowed = {**_OTHER_OPTIONS, **(_TLS_OPTIONS if url.tls else {})}
    options: dict[str, Any] = {}
    for name, text in url.options.items():
        kind = allowed.get(name)
        if kind is None:
            known = ", ".join(sorted(allowed))
            raise InvalidURLError(
                f"invalid backend URL {url.redacted!r}: unknown option {name!r} (known: {known})"
            )
        if kind is bool:
            options[name] = _bool(url, name, text)
        elif kind is int:
            number = parse_number(text)
            if number is None or number < 1:
                raise InvalidURLError(
                    f"invalid backend URL {url.redacted!r}: {name} must be a number from 1")
            options[name] = number
        else:
            options[name] = _text_option(url, name, text)
    return options


def _common(url: ParsedURL, timeout: float, retry: Any) -> dict[str, Any]:
    attempt = timeout * ATTEMPT_SHARE
    kwargs: dict[str, Any] = {
        "socket_timeout": attempt,
        "socket_connect_timeout": attempt,
        "retry": retry,
        "username": url.username,
        "password": url.password,
    }
    options = _options(url)
    for name in ("sentinel_password", "sentinel_username"):
        options.pop(name, None)
    kwargs.update(options)
    if url.tls:
        kwargs["ssl"] = True
    return kwargs


def _sentinel_kwargs(url: ParsedURL, timeout: float, retry: Any) -> dict[str, Any]:
    """The sentinels' budget: asking all of them once, twice over (the command's retry), fits the timeout.

    redis-py asks the sentinels one after another to find the master, and a
    failed command (the master not found) is retried once: so the sentinels
    share one attempt's budget, and none gets a retry of its own
    (without `retry`, redis-py 8 retries 10 times with backoff: seconds).
    """
    options = url.options
    share = timeout * ATTEMPT_SHARE / len(url.hosts)
    extra: dict[str, Any] = {
        "socket_timeout": share, "socket_connect_timeout": share, "retry": type(retry)(NoBackoff(), 0),
    }
    if "sentinel_password" in options:
        extra["password"] = options["sentinel_password"]
    if "sentinel_username" in options:
        extra["username"] = options["sentinel_username"]
    return extra


def _where(parsed: ParsedURL, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The client arguments of a single node: its address (TCP or Unix socket), db and options."""
    if parsed.connector == "unix":
        kwargs.pop("ssl", None)
        return {"unix_socket_path": parsed.path, "db": parsed.db, **kwargs}
    host, port = parsed.hosts[0]
    return {"host": host, "port": port, "db": parsed.db, **kwargs}


class FairQueue(queue.LifoQueue[Any]):
    """The sync blocking pool's queue of connections, served in turn.

    redis-py's `BlockingConnectionPool` waits on a `LifoQueue`: a thread that
    releases its connection and asks again at once takes it back ahead of
    the threads already waiting, which then starve until their timeout (and
    the brake took that for an outage). Here a getter takes a connection only
    when no one who asked earlier is still waiting; the most recently
    released connection is still the one handed out.
    """

    def __init__(self, maxsize: int = 0) -> None:
        super().__init__(maxsize)
        self._line: collections.deque[threading.Condition] = collections.deque()  # the getters waiting, in turn

    def _put(self, item: Any) -> None:
        super()._put(item)
        if self._line:
            self._line[0].notify()  # only the one whose turn it is

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        with self.mutex:
            line = self._line
            if self._qsize() and not line:  # no one waiting: at once (the common case)
                item = self._get()
                self.not_full.notify()
                return item
            if not block:
                raise queue.Empty
            me = threading.Condition(self.mutex)
            line.append(me)
            try:
                end = None if timeout is None else time.monotonic() + timeout
                while not (self._qsize() and line[0] is me):
                    if end is None:
                        me.wait()
                        continue
                    left = end - time.monotonic()
                    if left <= 0:
                        raise queue.Empty
                    me.wait(left)
                item = self._get()
                self.not_full.notify()
                return item
            finally:
                line.remove(me)
                if line and self._qsize():
                    line[0].notify()  # the next in line may take one now


def _limited(client: Any, blocking_pool: Any, timeout: float, parsed: ParsedURL) -> Any:
    """`client` as it is, or, with `?max_connections=N`, on a pool that never opens more than N.

    redis-py's plain pool raises "Too many connections" past its limit (which
    the brake would take for an outage); a blocking pool makes a check wait
    for a free connection, up to the brake's timeout. Its connection class
    and settings are the ones redis-py chose for the URL.
    """
    pool = client.connection_pool
    if "max_connections" not in parsed.options:  # redis-py's own default (100 in redis-py 8) is no limit of ours
        return client
    fair = {"queue_class": FairQueue} if blocking_pool is redis.BlockingConnectionPool else {}  # threads in turn
    blocking = blocking_pool(
        connection_class=pool.connection_class, max_connections=pool.max_connections,
        timeout=timeout, **fair, **pool.connection_kwargs,
    )
    return type(client).from_pool(blocking)  # the client owns the pool: closing it closes the pool


def _sync_kwargs(parsed: ParsedURL, timeout: float) -> dict[str, Any]:
    return _common(parsed, timeout, redis.retry.Retry(NoBackoff(), 1))


def _async_kwargs(parsed: ParsedURL, timeout: float) -> dict[str, Any]:
    return _common(parsed, timeout, redis.asyncio.retry.Retry(NoBackoff(), 1))


def _memory_sync(parsed: ParsedURL, timeout: float) -> Any:
    import fakeredis

    return fakeredis.FakeRedis(server=memory_server(parsed.path))


def _memory_async(parsed: ParsedURL, timeout: float) -> Any:
    import fakeredis

    return fakeredis.FakeAsyncRedis(server=memory_server(parsed.path))


def _single_sync(parsed: ParsedURL, timeout: float) -> Any:
    client = redis.Redis(**_where(parsed, _sync_kwargs(parsed, timeout)))
    return _limited(client, redis.BlockingConnectionPool, timeout, parsed)


def _single_async(parsed: ParsedURL, timeout: float) -> Any:
    client = redis.asyncio.Redis(**_where(parsed, _async_kwargs(parsed, timeout)))
    return _limited(client, redis.asyncio.BlockingConnectionPool, timeout, parsed)


def _cluster_sync(parsed: ParsedURL, timeout: float) -> Any:
    kwargs = _sync_kwargs(parsed, timeout)
    nodes = [redis.cluster.ClusterNode(h, p) for h, p in parsed.hosts]  # type: ignore[no-untyped-call]
    # redis-py's sync cluster client connects when it is built; build it on
    # first use instead, so a brake made while the cluster is down still
    # starts (its checks go to the failure policy until the cluster answers).
    # A use waits for the build at most the check's budget (less a margin for the check's own command).
    return LazyClient(lambda: redis.cluster.RedisCluster(startup_nodes=nodes, **kwargs), wait=timeout * 0.9)


def _cluster_async(parsed: ParsedURL, timeout: float) -> Any:
    nodes = [redis.asyncio.cluster.ClusterNode(h, p) for h, p in parsed.hosts]
    return redis.asyncio.cluster.RedisCluster(startup_nodes=nodes, **_async_kwargs(parsed, timeout))


def _sentinel_sync(parsed: ParsedURL, timeout: float) -> Any:
    kwargs = _sync_kwargs(parsed, timeout)
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        list(parsed.hosts), sentinel_kwargs=_sentinel_kwargs(parsed, timeout, kwargs["retry"]), **kwargs
    )
    return sentinel.master_for(parsed.path, db=parsed.db)  # type: ignore[no-untyped-call,unused-ignore]


def _sentinel_async(parsed: ParsedURL, timeout: float) -> Any:
    kwargs = _async_kwargs(parsed, timeout)
    sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        list(parsed.hosts), sentinel_kwargs=_sentinel_kwargs(parsed, timeout, kwargs["retry"]), **kwargs
    )
    return sentinel.master_for(parsed.path, db=parsed.db)


def _standard(parsed: ParsedURL) -> str:
    return variant_for_hosts(parsed.hosts)  # "redis", or a service's known by its host name (Upstash)


@dataclass(frozen=True, slots=True)
class Connector:
    """How one backend kind (`ParsedURL.connector`) is reached: its sync and asyncio clients, built from a
    parsed URL and the brake's timeout, and the variant of the script its server runs (see script.py)."""

    sync: Callable[[ParsedURL, float], Any]
    asynchronous: Callable[[ParsedURL, float], Any]
    script_variant: Callable[[ParsedURL], str] = _standard


#: The connectors by backend kind, as `urls.SCHEMES` maps each URL scheme to a kind (a new backend: a
#: scheme there, a connector here).
CONNECTORS: dict[str, Connector] = {
    "memory": Connector(_memory_sync, _memory_async),
    "redis": Connector(_single_sync, _single_async),
    "unix": Connector(_single_sync, _single_async),
    "cluster": Connector(_cluster_sync, _cluster_async),
    "sentinel": Connector(_sentinel_sync, _sentinel_async),
}


def connector(url: str | ParsedURL) -> Connector:
    """The connector of `url`'s backend kind."""
    return CONNECTORS[(parse_url(url) if isinstance(url, str) else url).connector]


def script_variant(url: ParsedURL) -> str:
    """The variant of the script the server at `url` runs (see script.VARIANTS)."""
    return CONNECTORS[url.connector].script_variant(url)


def sync_client(url: str | ParsedURL, timeout: float) -> Any:
    """A redis-py (or fakeredis) client for `url`, sync flavour."""
    parsed = parse_url(url) if isinstance(url, str) else url
    return CONNECTORS[parsed.connector].sync(parsed, timeout)


def async_client(url: str | ParsedURL, timeout: float) -> Any:
    """A redis.asyncio (or fakeredis) client for `url`."""
    parsed = parse_url(url) if isinstance(url, str) else url
    return CONNECTORS[parsed.connector].asynchronous(parsed, timeout)
