"""Self-test of the real-Redis test infrastructure in ``tests/servers/``."""

# redis.sentinel is untyped.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import redis.cluster
import redis.exceptions
import redis.sentinel
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.retry import Retry

from distbrake.redis_errors import classify
from tests import servers as rs
from tests.servers import process

NO_RETRY = Retry(NoBackoff(), 0)  # redis-py 8 retries 10x with backoff by default


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A reaped child is gone; an unreaped zombie would still answer kill(0).
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ", 1)[1][0] != "Z"


@pytest.fixture
def server() -> Iterator[rs.RedisServer]:
    with rs.RedisServer() as srv:
        yield srv


def test_free_ports_are_distinct_and_cluster_safe() -> None:
    ports = rs.free_ports(20)
    assert len(set(ports)) == 20
    for port in ports:
        assert 1024 < port <= 55535
        assert port + 10000 not in ports
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free


def test_single_server_answers_and_cleans_up() -> None:
    srv = rs.RedisServer(unix_socket=True)
    with srv:
        assert srv.url == f"redis://127.0.0.1:{srv.port}"
        assert srv.port != 6379
        with redis.Redis.from_url(srv.url) as client:
            assert client.ping()
            client.set("k", "v")
            assert client.get("k") == b"v"
            assert client.config_get("appendonly") == {"appendonly": "no"}
        assert srv.unix_socket is not None
        with redis.Redis(unix_socket_path=srv.unix_socket) as uclient:
            assert uclient.get("k") == b"v"
        pid = srv.pid
        assert pid is not None and _pid_alive(pid)
        directory = srv.dir
    assert not _pid_alive(pid)
    assert not directory.exists()
    assert srv not in process._live.values()


def test_startup_failure_reports_log_tail() -> None:
    srv = rs.RedisServer(extra_args=["--no-such-directive", "x"], startup_timeout=5)
    with pytest.raises(rs.RedisStartupError, match="no-such-directive"), srv:
        pass
    srv.close()


def test_aof_restart_keeps_data_on_same_port() -> None:
    with rs.RedisServer(appendonly=True) as srv:
        port = srv.port
        with srv.client() as client:
            client.set("distbrake:aof", "1")
        srv.restart()  # SIGTERM, then start again
        assert srv.port == port
        with srv.client() as client:
            assert client.get("distbrake:aof") == b"1"
            client.set("distbrake:aof2", "2")
        old_pid = srv.pid
        srv.restart(graceful=False)  # SIGKILL: AOF write() happened before the reply
        assert srv.pid != old_pid
        with srv.client() as client:
            assert client.mget("distbrake:aof", "distbrake:aof2") == [b"1", b"2"]


def test_kill_then_start_again(server: rs.RedisServer) -> None:
    server.kill()
    assert not server.is_running
    with pytest.raises(redis.exceptions.ConnectionError), server.client() as client:
        client.ping()
    server.start()
    with server.client() as client:
        assert client.ping()


def test_pause_simulates_a_hung_server(server: rs.RedisServer) -> None:
    with server.client(socket_timeout=0.3, socket_connect_timeout=0.3) as client:
        assert client.ping()
        server.pause()
        assert server.is_paused
        with pytest.raises(redis.exceptions.TimeoutError):
            client.ping()
        server.resume()
        assert client.ping()
    server.pause()  # close() must cope with a stopped process


def test_requirepass() -> None:
    with rs.RedisServer(password="s3cret pw") as srv:
        with redis.Redis(host=srv.host, port=srv.port, retry=NO_RETRY) as anonymous:
            with pytest.raises(redis.exceptions.AuthenticationError):
                anonymous.ping()
        with srv.client() as client:
            assert client.ping()
        with redis.Redis.from_url(srv.url_with(password="s3cret pw")) as client:
            assert client.ping()


@pytest.mark.parametrize("style", ["extra_args", "acl_users"])
def test_acl_user_is_limited(style: str) -> None:
    rule = "brake on >pw ~distbrake:* +evalsha +eval +script|load +ping +hset +hget"
    other = "other on >pw2 ~* +@all"
    by_args = style == "extra_args"
    with rs.RedisServer(
        password="adminpw",
        extra_args=["--user", rule, "--user", other] if by_args else [],
        acl_users=[] if by_args else [rule, other],
    ) as srv:
        users = srv.command("ACL", "USERS")
        assert sorted(users) == ["brake", "default", "other"]
        with srv.client(username="brake", password="pw", decode_responses=True) as brake:
            assert brake.ping()
            script = "return redis.call('HSET', KEYS[1], 'n', ARGV[1])"
            assert brake.eval(script, 1, "distbrake:s1", "x") == 1
            sha = brake.script_load("return redis.call('HGET', KEYS[1], 'n')")
            assert brake.evalsha(sha, 1, "distbrake:s1") == "x"
            # A command refused inside a script: each server words it its own way (Redis 7.0 "can't run this
            # command", Redis 7.2+ and Valkey "ACL failure in script: ... no permissions"); what users see is
            # the library's classification of it, an ACL refusal.
            with pytest.raises(redis.exceptions.ResponseError) as refused:
                brake.eval("return redis.call('DEL', KEYS[1])", 1, "distbrake:s1")
            assert classify(refused.value).cause == "permission", refused.value
            with pytest.raises(redis.exceptions.NoPermissionError):
                brake.eval(script, 1, "elsewhere:s1", "x")  # key outside ~distbrake:*
            with pytest.raises(redis.exceptions.NoPermissionError):
                brake.hgetall("distbrake:s1")  # HGETALL not granted
            with pytest.raises(redis.exceptions.NoPermissionError):
                brake.flushall()
        with srv.client(username="other", password="pw2") as other:
            assert other.hget("distbrake:s1", "n") == b"x"


def test_tls_right_ca_works_wrong_ca_fails() -> None:
    with rs.TLSRedisServer() as srv:
        assert srv.url == f"rediss://127.0.0.1:{srv.port}"
        assert Path(srv.ca_path).exists() and Path(srv.wrong_ca_path).exists()
        with srv.client() as client:  # check_hostname on: SAN IP 127.0.0.1
            assert client.ping()
        with redis.Redis.from_url(srv.url, ssl_ca_certs=srv.ca_path) as client:
            assert client.ping()
        # SAN DNS:localhost verifies too.
        ctx = ssl.create_default_context(cafile=srv.ca_path)
        with (
            socket.create_connection((srv.host, srv.port), timeout=2) as raw,
            ctx.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            tls.sendall(b"PING\r\n")
            assert tls.recv(64) == b"+PONG\r\n"

        with srv.client(ssl_ca_certs=srv.wrong_ca_path) as bad:
            with pytest.raises(redis.exceptions.ConnectionError) as excinfo:
                bad.ping()
        assert "certificate verify failed" in str(excinfo.value).lower()
        wrong_ctx = srv.ssl_context(cafile=srv.wrong_ca_path)
        with pytest.raises(ssl.SSLCertVerificationError):
            rs.redis_command(srv.host, srv.port, "PING", ssl_context=wrong_ctx)

        # Plain text to the TLS port is not served.
        with redis.Redis(host=srv.host, port=srv.port, socket_timeout=2, retry=NO_RETRY) as plain:
            with pytest.raises(redis.exceptions.ConnectionError):
                plain.ping()


def test_tls_with_client_certificates() -> None:
    with rs.TLSRedisServer(tls_auth_clients=True, password="pw") as srv:
        with srv.client() as client:
            assert client.ping()
        with srv.client(ssl_certfile=None, ssl_keyfile=None) as no_cert:
            with pytest.raises(redis.exceptions.ConnectionError):
                no_cert.ping()


def _one_key_per_slot() -> list[str]:
    keys: dict[int, str] = {}
    n = 0
    while len(keys) < 16384:
        key = f"distbrake:{n}"
        keys.setdefault(key_slot(key.encode()), key)
        n += 1
    return list(keys.values())


def test_cluster_three_masters_accepts_keys_in_all_slots() -> None:
    with rs.RedisCluster() as cluster:
        assert len(cluster.nodes) == 3
        assert len(cluster.masters) == 3
        assert cluster.startup_nodes == [n.address for n in cluster.masters]
        assert cluster.url == "redis+cluster://" + ",".join(
            f"127.0.0.1:{p}" for _, p in cluster.startup_nodes
        )
        keys = _one_key_per_slot()
        with cluster.client() as client:
            pipe = client.pipeline()
            for key in keys:
                pipe.set(key, "1")
            assert all(pipe.execute())
            assert client.get(keys[-1]) == b"1"
        sizes = [int(m.command("DBSIZE")) for m in cluster.masters]
        assert sum(sizes) == 16384
        assert all(size > 4000 for size in sizes)
        owner = cluster.node_for_key(keys[0])
        assert int(owner.command("EXISTS", keys[0])) == 1


def test_cluster_with_replicas_fails_over() -> None:
    with rs.RedisCluster(replicas_per_master=1) as cluster:
        assert len(cluster.nodes) == 6
        assert len(cluster.masters) == 3
        assert len(cluster.replicas) == 3
        with cluster.client() as client:
            client.set("distbrake:{failover}", "kept")
        master = cluster.node_for_key("distbrake:{failover}")
        (replica,) = cluster.replicas_of(master)
        rs.wait_replicated(master, [replica])
        assert int(replica.command("DBSIZE")) == 1

        promoted = cluster.kill_master_and_wait_failover(master)

        assert promoted is replica
        assert not master.is_running
        assert promoted in cluster.masters and master not in cluster.masters
        assert cluster.node_for_key("distbrake:{failover}") is promoted
        with cluster.client() as client:
            assert client.get("distbrake:{failover}") == b"kept"
            client.set("distbrake:{failover}", "after")

        # The old master comes back (same port/dir, nodes.conf kept) as a replica.
        master.start()
        cluster.wait_healthy()
        assert master in cluster.replicas_of(promoted)


def test_sentinel_discovery_and_failover() -> None:
    with rs.SentinelSetup() as setup:
        _, sport = setup.sentinel_address
        assert setup.sentinel_url == f"redis+sentinel://127.0.0.1:{sport}/mymaster"
        sentinel = setup.sentinel_client(socket_timeout=1)
        assert sentinel.discover_master("mymaster") == ("127.0.0.1", setup.master.port)
        assert sentinel.discover_slaves("mymaster") == [("127.0.0.1", setup.replica.port)]
        master = sentinel.master_for("mymaster")
        master.set("distbrake:sentinel", "1")
        rs.wait_replicated(setup.master, setup.replicas)
        replica = sentinel.slave_for("mymaster")
        assert replica.get("distbrake:sentinel") == b"1"
        replica.close()
        master.close()

        new_master = setup.kill_master_and_wait_failover()

        assert new_master is setup.replica
        assert sentinel.discover_master("mymaster") == ("127.0.0.1", setup.replica.port)
        master = sentinel.master_for("mymaster")
        assert master.get("distbrake:sentinel") == b"1"
        master.close()
        for s in sentinel.sentinels:
            s.close()
