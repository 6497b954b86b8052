"""Security: what never leaves the process, what never shows, and who may do what.

* A call's arguments never reach Redis (MONITOR sees every command, and every
  stored value is searched), never reach a log line (every logger at DEBUG,
  stderr too) and never reach an error (str, repr, pickle, tracebacks and the
  whole __cause__/__context__ chain).
* A Redis password never shows: not in errors (wrong password, unreachable
  host, bad URL, TLS failure), log lines, `repr()` of a brake or of
  `BrakeSettings`.
* TLS works with the test CA and is refused with a wrong one.
* ACL: the minimal user (README: BRAKE_ACL_RULES) runs every operation;
  dropping any one of its commands breaks one; a user without them gets a
  clear error.
* Key isolation: brakes with different key prefixes never see each other, and
  `clear_all` deletes only its own keys.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import secrets
import socket
import sys
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import redis

from distbrake import (
    AsyncDistributedBrake,
    BrakeSettings,
    BrakeUnavailableError,
    DistbrakeError,
    DistributedBrake,
    InvalidURLError,
    LoopBrakeError,
    UnsupportedArgumentsError,
    session_key,
)
from distbrake.settings import load_settings
from tests.servers import HOST, RedisCluster, RedisServer, TLSRedisServer, free_port

# Secrets are made at run time, so that no source line a traceback shows can hold one.
SECRET = "sk-live-" + secrets.token_hex(12)
ADMIN_PW = "admin-" + secrets.token_hex(8)
BRAKE_PW = "brake-" + secrets.token_hex(8)
TLS_PW = "tls-" + secrets.token_hex(8)
WRONG_PW = "wrong-" + secrets.token_hex(8)
PASSWORDS = (ADMIN_PW, BRAKE_PW, TLS_PW, WRONG_PW)
DRIVER_ERRORS = (redis.RedisError, redis.exceptions.RedisClusterException)  # the latter is no RedisError

#: The minimal ACL rules for a brake with the default key prefix on database 0
#: (the README shows this line; `+select` is needed too for a database other than 0).
BRAKE_ACL_COMMANDS = (
    "+evalsha", "+script|load", "+hget", "+hset", "+time", "+pexpire",  # check (the script)
    "+hmget", "+pttl", "+scan", "+del", "+ping",  # inspect, sessions, clear, clear_all, ping
    "+get", "+set",  # the kill switch: read by every brake (kill_switch), set by block_all
)
BRAKE_ACL_RULES = "~distbrake:* resetchannels -@all " + " ".join(BRAKE_ACL_COMMANDS)


def secret_args() -> list[Any]:
    """Arguments carrying SECRET in every place one can hide."""
    return [
        {"token": SECRET},
        {"nested": {"deeper": [{"k": SECRET}, [SECRET]]}},
        {SECRET: 1},  # in a key
        {"outer": {SECRET: {"x": [1, 2]}}},  # in a nested key
        {"blob": "x" * 5000 + SECRET + "y" * 5000},  # in a 10 KB argument
        [SECRET] * 3,
        SECRET,
    ]


def exception_texts(error: BaseException) -> list[str]:
    """Every way an error shows: str, repr, args, attributes, pickle, traceback; whole chain."""
    texts = ["".join(traceback.format_exception(error))]
    seen: set[int] = set()
    stack: list[BaseException | None] = [error]
    while stack:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        texts += [str(current), repr(current), repr(current.args), repr(getattr(current, "__dict__", {}))]
        try:
            texts.append(pickle.dumps(current).decode("latin-1"))
        except Exception as failure:  # a driver error that cannot pickle: its text is checked above
            texts.append(repr(failure))
        stack += [current.__cause__, current.__context__]
    return texts


def assert_absent(needles: tuple[str, ...] | str, *texts: str) -> None:
    for needle in (needles,) if isinstance(needles, str) else needles:
        for text in texts:
            assert needle not in text, f"{needle[:12]}... found in {text[:200]!r}"


class Monitor:
    """MONITOR over a raw socket: every command the server runs, scripts' calls included."""

    def __init__(self, port: int, password: str | None = None) -> None:
        self.port, self.password = port, password
        self.sock = socket.create_connection((HOST, port), timeout=5)
        if password is not None:
            self.sock.sendall(f"AUTH {password}\r\n".encode())
            assert self._read_until(b"\r\n").startswith(b"+OK")
        self.sock.sendall(b"MONITOR\r\n")
        assert self._read_until(b"\r\n").startswith(b"+OK")

    def _read_until(self, marker: bytes, timeout: float = 10.0) -> bytes:
        data = b""
        deadline = time.monotonic() + timeout
        while marker not in data:
            assert time.monotonic() < deadline, f"MONITOR never showed {marker!r}"
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            chunk = self.sock.recv(65536)
            assert chunk, "MONITOR connection closed"
            data += chunk
        return data

    def stop(self) -> str:
        """Everything seen so far (up to an ECHO sent now), as text."""
        marker = f"monitor-end-{uuid.uuid4().hex}"
        with redis.Redis(host=HOST, port=self.port, password=self.password) as client:
            client.echo(marker)
        data = self._read_until(marker.encode())
        self.sock.close()
        return data.decode("latin-1")


def every_stored_byte(client: Any) -> bytes:
    """Every key, and every field and value of every hash, of the whole database."""
    out: list[bytes] = []
    for key in client.scan_iter(count=1000):
        out.append(key)
        kind = client.type(key)
        if kind == b"hash":
            for name, value in client.hgetall(key).items():
                out += [name, value]
        elif kind == b"string":
            out.append(client.get(key) or b"")
    return b"".join(out)


@pytest.fixture
def debug_logging() -> Iterator[None]:
    """Every logger at DEBUG (distbrake's, redis-py's, asyncio's, the root), a handler on stderr."""
    names = ["", "distbrake", "redis", "redis.connection", "redis.cluster", "redis.asyncio", "asyncio",
             *logging.root.manager.loggerDict]
    saved = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.DEBUG)
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.DEBUG)
    logging.getLogger().addHandler(handler)
    yield
    logging.getLogger().removeHandler(handler)
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


# -- servers owned by this module -------------------------------------------------------------


@pytest.fixture(scope="module")
def secure_server() -> Iterator[RedisServer]:
    """requirepass for the default user, the minimal `brake` user, and a `weak` user (ping only)."""
    users = [f"brake on >{BRAKE_PW} {BRAKE_ACL_RULES}", f"weak on >{BRAKE_PW} ~distbrake:* resetchannels -@all +ping"]
    with RedisServer(password=ADMIN_PW, acl_users=users, name="secure") as server:
        yield server


@pytest.fixture
def secure(secure_server: RedisServer) -> RedisServer:
    secure_server.command("FLUSHALL")
    secure_server.command("SCRIPT", "FLUSH")
    return secure_server


@pytest.fixture(scope="module")
def tls_server() -> Iterator[TLSRedisServer]:
    with TLSRedisServer(password=TLS_PW, name="tls-secure") as server:
        yield server


def tls_url(server: TLSRedisServer, ca: str, password: str = TLS_PW) -> str:
    return (f"rediss://:{password}@{HOST}:{server.port}/0?ssl_ca_certs={ca}"
            "&ssl_cert_reqs=required&ssl_check_hostname=false")


def brake_user_url(server: RedisServer, user: str = "brake", password: str = BRAKE_PW) -> str:
    return f"redis://{user}:{password}@{HOST}:{server.port}/0"


# -- arguments never reach Redis -------------------------------------------------------------------


async def test_arguments_never_reach_redis_commands_or_stored_values(redis_server: RedisServer, redis_url: str) -> None:
    monitor = Monitor(redis_server.port)
    sync = DistributedBrake.from_url(redis_url, on_backend_error="closed")
    aio = AsyncDistributedBrake.from_url(redis_url, on_backend_error="closed")
    try:
        for i, args in enumerate(secret_args()):
            session = f"session-{i}"
            sync.check("read_file", args, session_id=session, call_id=SECRET + "-call")
            sync.check("read_file", args, session_id=session)
            with pytest.raises(LoopBrakeError):
                await aio.check("read_file", args, session_id=session, call_id=SECRET + "-other")
            assert (await aio.inspect(session)) is not None and sync.inspect(session) is not None
        await asyncio.gather(*(aio.check("t", args, session_id=f"burst-{i}") for i, args in enumerate(secret_args())))
        assert len(list(sync.sessions())) == 2 * len(secret_args())
        stored = every_stored_byte(sync.client)
        assert sync.clear("session-0") and await aio.clear("session-1")
    finally:
        sync.close()
        await aio.aclose()
    seen = monitor.stop()
    assert seen.count('"EVALSHA"') >= 4 * len(secret_args()) and '"HSET"' in seen  # MONITOR saw the checks
    assert SECRET not in seen
    assert SECRET.encode() not in stored and b"read_file" in stored  # the tool name is kept, not the args


# -- arguments never reach a log line -----------------------------------------------------------------


@pytest.mark.usefixtures("debug_logging")
async def test_arguments_never_reach_a_log_line(
    redis_url: str, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    down = RedisServer(name="going-down").start()
    down_url = down.url
    brakes: list[Any] = []
    try:
        for policy in ("closed", "open", "local"):
            brakes += [DistributedBrake.from_url(redis_url, on_backend_error=policy),
                       DistributedBrake.from_url(down_url, on_backend_error=policy, timeout_seconds=0.2),
                       AsyncDistributedBrake.from_url(down_url, on_backend_error=policy, timeout_seconds=0.2)]
        down.kill()
        for brake in brakes:
            for args in secret_args():
                for _ in range(3):
                    try:
                        result = brake.check("read_file", args, session_id="s", call_id=None)
                        if asyncio.iscoroutine(result):
                            await result
                    except (LoopBrakeError, BrakeUnavailableError):
                        pass
            with pytest.raises(UnsupportedArgumentsError):
                result = brake.check("read_file", {"token": SECRET, "bad": {SECRET}}, session_id="s")
                if asyncio.iscoroutine(result):
                    await result
    finally:
        for brake in brakes:
            if isinstance(brake, AsyncDistributedBrake):
                await brake.aclose()
            else:
                brake.close()
        down.close()
    captured = capfd.readouterr()
    assert "denied" in caplog.text and "Redis unreachable (ConnectionError)" in caplog.text  # the log did run
    records = "\n".join(f"{r.getMessage()} {r.args!r} {r.exc_text}" for r in caplog.records)
    assert_absent(SECRET, caplog.text, records, captured.err, captured.out)


# -- arguments never reach an error -------------------------------------------------------------------


async def test_arguments_never_reach_an_error(redis_url: str) -> None:
    errors: list[BaseException] = []
    server = RedisServer(name="killed").start()
    sync = DistributedBrake.from_url(redis_url, on_backend_error="closed")
    closed = DistributedBrake.from_url(server.url, on_backend_error="closed", timeout_seconds=0.5)
    aclosed = AsyncDistributedBrake.from_url(server.url, on_backend_error="closed", timeout_seconds=0.5)
    try:
        for i, args in enumerate(secret_args()):
            assert closed.check("read_file", args, session_id=f"k{i}").decided_by == "redis"
            assert (await aclosed.check("read_file", args, session_id=f"a{i}")).decided_by == "redis"
        server.kill()
        for i, args in enumerate(secret_args()):
            for _ in range(2):
                sync.check("read_file", args, session_id=f"s{i}")
            with pytest.raises(LoopBrakeError) as denied:
                sync.check("read_file", args, session_id=f"s{i}")
            with pytest.raises(BrakeUnavailableError) as unavailable:
                closed.check("read_file", args, session_id=f"k{i}")
            with pytest.raises(BrakeUnavailableError) as aunavailable:
                await aclosed.check("read_file", args, session_id=f"a{i}")
            with pytest.raises(UnsupportedArgumentsError) as unsupported:
                sync.check("read_file", {"args": args, "not json": {SECRET}}, session_id="u")
            errors += [denied.value, unavailable.value, aunavailable.value, unsupported.value]
    finally:
        sync.close()
        closed.close()
        await aclosed.aclose()
        server.close()
    assert any(isinstance(e.__cause__, redis.ConnectionError) for e in errors)  # the chain was there to search
    for error in errors:
        assert isinstance(error, DistbrakeError)
        assert_absent(SECRET, *exception_texts(error))
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)


# -- a password never shows ---------------------------------------------------------------------------


def url_kinds(password: str, port: int) -> list[str]:
    return [
        f"redis://user:{password}@{HOST}:{port}/0",
        f"redis://:{password}@{HOST}:{port}",
        f"rediss://user:{password}@{HOST}:{port}?ssl_cert_reqs=required",
        f"redis+cluster://user:{password}@{HOST}:{port},{HOST}:{port + 1}",
        f"redis+sentinel://user:{password}@{HOST}:{port}/mymaster",
        f"redis+sentinel://{HOST}:{port}/mymaster?sentinel_password={password}",
        f"redis+unix://user:{password}@/tmp/no-such.sock?db=1",
        f"unix://:{password}@/tmp/no-such.sock",
    ]


@pytest.mark.parametrize("url", url_kinds("PASSWORD", 1), ids=lambda u: u.split(":", 1)[0] + "-" + u[-12:])
async def test_a_password_never_shows_in_repr_of_brakes_or_settings(url: str) -> None:
    url = url.replace("PASSWORD", ADMIN_PW)
    settings = BrakeSettings(url=url)
    sync = DistributedBrake(redis.Redis(), url=url)  # the sync cluster client would connect at once
    aio = AsyncDistributedBrake.from_url(url)  # no I/O until the first check
    try:
        texts = [repr(settings), str(settings), repr(load_settings(url=url)), repr(sync), str(sync), repr(aio),
                 sync.backend, aio.backend, repr(sync.settings), repr(aio.settings)]
        assert_absent(ADMIN_PW, *texts)
        assert "***" in repr(sync) and "***" in repr(settings)
    finally:
        sync.close()
        await aio.aclose()


@pytest.mark.usefixtures("debug_logging")
async def test_a_password_never_shows_when_redis_refuses_or_is_unreachable(
    secure: RedisServer, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    unreachable = free_port()  # nobody listens there
    urls = [
        (f"redis://:{WRONG_PW}@{HOST}:{secure.port}/0", "AuthenticationError"),
        (f"redis://brake:{WRONG_PW}@{HOST}:{secure.port}/0", "AuthenticationError"),
        (f"redis://nobody:{ADMIN_PW}@{HOST}:{secure.port}/0", "AuthenticationError"),
        (f"redis://user:{ADMIN_PW}@{HOST}:{unreachable}/0", "ConnectionError"),
        (f"redis+sentinel://user:{ADMIN_PW}@{HOST}:{unreachable}/mymaster?sentinel_password={ADMIN_PW}",
         "Error"),
        # redis-py 8.2 names it RedisClusterUnreachableError (a RedisClusterException); 8.0 and 8.1 the base class
        (f"redis+cluster://user:{ADMIN_PW}@{HOST}:{unreachable}", "RedisCluster(Exception|UnreachableError)"),
    ]
    errors: list[BaseException] = []
    for url, failure in urls:
        aio = AsyncDistributedBrake.from_url(url, on_backend_error="closed", timeout_seconds=0.5)
        try:
            with pytest.raises(BrakeUnavailableError, match=failure) as acaught:
                await aio.check("t", {"q": 1}, session_id="s")
            errors.append(acaught.value)
            if "sentinel" not in url:  # without the patch to connect.py each sentinel call takes seconds
                with pytest.raises(DRIVER_ERRORS) as araw:
                    await aio.inspect("s")
                errors.append(araw.value)
        finally:
            await aio.aclose()
        try:
            sync = DistributedBrake.from_url(url, on_backend_error="closed", timeout_seconds=0.5)
        except DRIVER_ERRORS as error:  # see test_deployments: the sync cluster client connects at build
            errors.append(error)
            continue
        try:
            with pytest.raises(BrakeUnavailableError, match=failure) as caught:
                sync.check("t", {"q": 1}, session_id="s")
            errors.append(caught.value)
            for operation in (sync.inspect, sync.clear) if "sentinel" not in url else ():  # see the check's chain
                with pytest.raises(DRIVER_ERRORS) as raw:
                    operation("s")
                errors.append(raw.value)
        finally:
            sync.close()
    for raised in errors:
        assert_absent(PASSWORDS, *exception_texts(raised))
    captured = capfd.readouterr()
    assert "AuthenticationError (configuration: wrong password)" in caplog.text
    assert_absent(PASSWORDS, caplog.text, captured.err, captured.out,
                  "\n".join(f"{r.getMessage()} {r.args!r}" for r in caplog.records))


@pytest.mark.parametrize(
    "template",
    [
        "redis://user:{pw}@localhost:abc",  # bad port
        "redis//user:{pw}@localhost:6379",  # no "://"
        "user:{pw}@localhost:6379",  # no scheme
        "redis://user:{pw}/x@localhost:6379",  # an unescaped "/" in the password
        "redis://user:{pw}?x@localhost:6379",  # an unescaped "?"
        "redis://user:{pw}#x@127.0.0.1:1",  # an unescaped "#"
        "redis://user:{pw}@x@127.0.0.1:1",  # an unescaped "@"
        "redis://127.0.0.1:1/0?password={pw}",  # a password where no option takes one
        "redis+sentinel://127.0.0.1:1/mymaster?sentinel_password={pw}&bogus=1",
    ],
)
async def test_a_password_in_a_malformed_url_never_shows(template: str, caplog: pytest.LogCaptureFixture) -> None:
    """Whatever goes wrong with the URL, at build or at the first check, the password stays hidden."""
    url = template.format(pw=ADMIN_PW)
    texts: list[str] = []
    for cls in (DistributedBrake, AsyncDistributedBrake):
        try:
            brake = cls.from_url(url, on_backend_error="closed", timeout_seconds=0.5)
        except InvalidURLError as error:
            texts += exception_texts(error)
            continue
        texts += [repr(brake), brake.backend]
        try:
            result = brake.check("t", {}, session_id="s")
            if asyncio.iscoroutine(result):
                await result
        except BrakeUnavailableError as error:
            texts += exception_texts(error)
        finally:
            if isinstance(brake, AsyncDistributedBrake):
                await brake.aclose()
            else:
                brake.close()
    assert_absent(ADMIN_PW, *texts, caplog.text)


# -- TLS --------------------------------------------------------------------------------------------------


async def test_tls_with_the_test_ca_works_sync_and_async(tls_server: TLSRedisServer) -> None:
    url = tls_url(tls_server, tls_server.ca_path)
    sync = DistributedBrake.from_url(url, on_backend_error="closed", timeout_seconds=5)
    aio = AsyncDistributedBrake.from_url(url, on_backend_error="closed", timeout_seconds=5)
    try:
        assert sync.ping() and await aio.ping()
        assert [sync.check("t", {"tls": 1}, session_id="tls").count for _ in range(2)] == [1, 2]
        with pytest.raises(LoopBrakeError):
            await aio.check("t", {"tls": 1}, session_id="tls")
        state = await aio.inspect("tls")
        assert state is not None and state.count == 3
        assert sync.clear_all() == 1
        assert_absent(TLS_PW, repr(sync), repr(aio))
    finally:
        sync.close()
        await aio.aclose()


async def test_tls_with_a_wrong_ca_is_refused(tls_server: TLSRedisServer, caplog: pytest.LogCaptureFixture) -> None:
    url = tls_url(tls_server, tls_server.wrong_ca_path)
    sync = DistributedBrake.from_url(url, on_backend_error="closed", timeout_seconds=2)
    aio = AsyncDistributedBrake.from_url(url, on_backend_error="closed", timeout_seconds=2)
    try:
        with pytest.raises(BrakeUnavailableError, match="ConnectionError") as caught:
            sync.check("t", {}, session_id="s")
        with pytest.raises(BrakeUnavailableError, match="ConnectionError") as acaught:
            await aio.check("t", {}, session_id="s")
        chain = exception_texts(caught.value) + exception_texts(acaught.value)
        assert any("certificate verify failed" in text for text in chain)
        assert_absent(TLS_PW, *chain, caplog.text)
    finally:
        sync.close()
        await aio.aclose()


async def test_tls_without_verification_options_still_verifies(tls_server: TLSRedisServer) -> None:
    """rediss:// alone verifies against the system CAs: the test CA is not among them."""
    url = f"rediss://:{TLS_PW}@{HOST}:{tls_server.port}"
    with DistributedBrake.from_url(url, on_backend_error="closed", timeout_seconds=2) as brake:
        with pytest.raises(BrakeUnavailableError, match="ConnectionError"):
            brake.check("t", {}, session_id="s")


# -- ACL ----------------------------------------------------------------------------------------------------


async def run_every_operation(url: str) -> None:
    """check (allowed, allowed, denied), inspect, sessions, clear, clear_all, the kill switch, ping: sync and
    async."""
    sync = DistributedBrake.from_url(url, on_backend_error="closed", timeout_seconds=2)
    aio = AsyncDistributedBrake.from_url(url, on_backend_error="closed", timeout_seconds=2)
    try:
        assert sync.ping() and await aio.ping()
        assert sync.check("search", {"q": 1}, session_id="acl").count == 1
        assert (await aio.check("search", {"q": 1}, session_id="acl")).count == 2
        with pytest.raises(LoopBrakeError):
            sync.check("search", {"q": 1}, session_id="acl")
        state = sync.inspect("acl")
        astate = await aio.inspect("acl")
        assert state is not None and astate is not None and state.count == astate.count == 3
        assert [s.session_id for s in sync.sessions()] == ["acl"]
        assert [s.session_id async for s in aio.sessions("a*")] == ["acl"]
        assert sync.clear("acl") and not await aio.clear("acl")
        await aio.check("search", {"q": 1}, session_id="acl2")
        assert await aio.clear_all() == 1 and sync.clear_all() == 0
        sync.block_all(reason="acl")
        assert (await aio.kill_switch()) is not None and await aio.unblock_all() and sync.kill_switch() is None
    finally:
        sync.close()
        await aio.aclose()


async def test_the_minimal_acl_user_can_do_everything(secure: RedisServer) -> None:
    await run_every_operation(brake_user_url(secure))


async def test_the_minimal_acl_user_is_minimal(secure: RedisServer) -> None:
    """Without any one of its commands, some operation of the brake fails."""
    for dropped in BRAKE_ACL_COMMANDS:
        user = "minus_" + dropped.strip("+").replace("|", "_")
        rules = [r for r in BRAKE_ACL_RULES.split() if r != dropped]
        secure.command("ACL", "SETUSER", user, "reset", "on", f">{BRAKE_PW}", *rules)
        secure.command("SCRIPT", "FLUSH")
        with pytest.raises((BrakeUnavailableError, redis.ResponseError)) as caught:
            await run_every_operation(brake_user_url(secure, user))
        assert "NoPermissionError" in str(caught.value) or "permission" in str(caught.value).lower() or (
            "ResponseError" in str(caught.value)), (dropped, caught.value)
        secure.command("FLUSHALL")


#: What redis-py's cluster client needs on top (topology and command table).
CLUSTER_ACL_COMMANDS = ("+cluster|slots", "+command")


async def test_the_minimal_acl_user_works_on_the_cluster(redis_cluster: RedisCluster, cluster_url: str) -> None:
    user = "brake_" + secrets.token_hex(4)
    for node in redis_cluster.nodes:
        node.command("ACL", "SETUSER", user, "reset", "on", f">{BRAKE_PW}", *BRAKE_ACL_RULES.split(),
                     *CLUSTER_ACL_COMMANDS)
    try:
        hosts = cluster_url.split("://", 1)[1]
        await run_every_operation(f"redis+cluster://{user}:{BRAKE_PW}@{hosts}")
    finally:
        for node in redis_cluster.nodes:
            node.command("ACL", "DELUSER", user)


async def test_a_user_without_the_brake_commands_gets_a_clear_error(secure: RedisServer) -> None:
    for url in (brake_user_url(secure, "weak"), brake_user_url(secure)):
        prefix = "distbrake" if "weak" in url else "elsewhere"  # the brake user may not touch other keys
        sync = DistributedBrake.from_url(url, on_backend_error="closed", key_prefix=prefix)
        aio = AsyncDistributedBrake.from_url(url, on_backend_error="closed", key_prefix=prefix)
        try:
            with pytest.raises(BrakeUnavailableError, match="NoPermissionError") as caught:
                sync.check("t", {"token": SECRET}, session_id="s")
            with pytest.raises(BrakeUnavailableError, match="NoPermissionError") as acaught:
                await aio.check("t", {"token": SECRET}, session_id="s")
            for error in (caught.value, acaught.value):
                assert "unavailable" in str(error) and '"t"' in str(error)
                assert_absent((SECRET, *PASSWORDS), *exception_texts(error))
        finally:
            sync.close()
            await aio.aclose()
    assert secure.command("DBSIZE") == 0


async def test_the_brake_user_with_the_default_password_user_alongside(secure: RedisServer) -> None:
    """The default user (requirepass) and the brake user share the data: one fleet, two logins."""
    admin_url = f"redis://:{ADMIN_PW}@{HOST}:{secure.port}/0"
    with DistributedBrake.from_url(admin_url, on_backend_error="closed") as admin, \
            DistributedBrake.from_url(brake_user_url(secure), on_backend_error="closed") as limited:
        assert admin.check("t", {}, session_id="shared").count == 1
        assert limited.check("t", {}, session_id="shared").count == 2
        state = admin.inspect("shared")
        assert state is not None and state.count == 2


# -- key isolation -----------------------------------------------------------------------------------------


@pytest.fixture
async def two_prefixes(redis_url: str) -> AsyncIterator[tuple[DistributedBrake, AsyncDistributedBrake]]:
    a = DistributedBrake.from_url(redis_url, key_prefix="teamA", on_backend_error="closed")
    b = AsyncDistributedBrake.from_url(redis_url, key_prefix="teamA:b", on_backend_error="closed")
    yield a, b
    a.close()
    await b.aclose()


async def test_key_prefixes_isolate_brakes(
    redis_url: str, two_prefixes: tuple[DistributedBrake, AsyncDistributedBrake]
) -> None:
    a, b = two_prefixes
    admin = redis.Redis.from_url(redis_url)
    try:
        foreign = {"unrelated:key": b"keep", "teamA": b"keep", "teamA:short": b"keep", "teamAB:" + "x" * 18: b"keep",
                   "distbrake:" + "y" * 18: b"keep", session_key("s1", "teamA") + "x": b"keep"}
        admin.mset(foreign)
        admin.hset("teamA:hash", mapping={"s": "x", "h": "y"})
        for session in ("s1", "s2", "s3"):
            assert a.check("t", {}, session_id=session).count == 1
        for session in ("s1", "s2"):
            assert (await b.check("t", {}, session_id=session)).count == 1
            assert (await b.check("t", {}, session_id=session)).count == 2
        assert a.check("t", {}, session_id="s1").count == 2  # b's streak never touched a's
        assert sorted(s.session_id for s in a.sessions()) == ["s1", "s2", "s3"]
        assert sorted([s.session_id async for s in b.sessions()]) == ["s1", "s2"]
        assert a.clear_all() == 3
        assert a.inspect("s1") is None and (await b.inspect("s1")) is not None
        assert await b.clear_all() == 2
        remaining = {k.decode() if isinstance(k, bytes) else k for k in admin.keys("*")}
        assert remaining == {*foreign, "teamA:hash"}
        assert all(admin.get(k) == v for k, v in foreign.items())
    finally:
        admin.close()


async def test_a_foreign_key_under_the_prefix_never_breaks_listing(redis_url: str) -> None:
    """A key someone else wrote that happens to match the slot pattern is skipped, not fatal."""
    admin = redis.Redis.from_url(redis_url)
    sync = DistributedBrake.from_url(redis_url, on_backend_error="closed")
    aio = AsyncDistributedBrake.from_url(redis_url, on_backend_error="closed")
    try:
        width = len(session_key("x").split(":", 1)[1])
        admin.set("distbrake:" + "Z" * width, "a string, not a slot")
        admin.rpush("distbrake:" + "L" * width, "a list")
        admin.hset("distbrake:" + "H" * width, mapping={"other": "fields"})
        sync.check("t", {}, session_id="mine")
        assert [s.session_id for s in sync.sessions()] == ["mine"]
        assert [s.session_id async for s in aio.sessions()] == ["mine"]
    finally:
        admin.close()
        sync.close()
        await aio.aclose()


def test_inspect_never_shows_arguments_only_a_hash_prefix(redis_url: str) -> None:
    with DistributedBrake.from_url(redis_url) as brake:
        verdict = brake.check("t", {"token": SECRET}, session_id="s")
        state = brake.inspect("s")
        assert state is not None and state.hash_prefix == verdict.hash_prefix and len(state.hash_prefix) == 12
        assert_absent(SECRET, repr(state), repr(verdict), repr(list(brake.sessions())))

