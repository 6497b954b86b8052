"""Which server `doctor` talks to, and its mode, from what the server says (issue 12.13).

Valkey fills `redis_version` (7.2.4) and, with extended-redis-compatibility,
`redis_mode` only for compatibility; its own fields are `server_name:valkey`,
`valkey_version` and (Valkey 8) `server_mode`. So `doctor` used to call a
3-master Valkey 8 Cluster "Redis 7.2.4, mode single". `identify_server` is
tested here on INFO replies of each flavour (the Redis 7.0 ones as this
machine's redis-server 7.0.15 answers; the others written after the servers'
INFO code), as raw text and as redis-py parses it; then `doctor` on those
replies, and on real servers: a single node, a cluster, Sentinel.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import redis
from redis._parsers.helpers import parse_info

from distbrake.cli.app import App
from distbrake.cli.doctor import Doctor
from distbrake.cli.server_identity import ServerIdentity, identify_server, info_fields
from tests.servers import SentinelSetup
from tests.servers.process import REDIS_SERVER
from tests.test_cli import as_json, run

REDIS_7_SINGLE = """\
# Server
redis_version:7.0.15
redis_git_sha1:00000000
redis_git_dirty:0
redis_build_id:ae4d7c971a948f0
redis_mode:standalone
os:Linux 6.1.0-18-amd64 x86_64
arch_bits:64
monotonic_clock:POSIX clock_gettime
multiplexing_api:epoll
atomicvar_api:c11-builtin
gcc_version:12.2.0
process_id:32017
process_supervised:no
run_id:164bb10914d4fc201617eeec012b8c63b3487d0b
tcp_port:6379
server_time_usec:1796121732081924
uptime_in_seconds:364
uptime_in_days:0
hz:10
configured_hz:10
lru_clock:959620
executable:/usr/bin/redis-server
config_file:/etc/redis/redis.conf
io_threads_active:0
"""
REDIS_7_CLUSTER_NODE = REDIS_7_SINGLE.replace("redis_mode:standalone", "redis_mode:cluster")
VALKEY_8_SINGLE = """\
# Server
redis_version:7.2.4
server_name:valkey
valkey_version:8.0.2
redis_git_sha1:00000000
redis_git_dirty:0
redis_build_id:4a52ebfa1b1bd2f8
server_mode:standalone
os:Linux 6.1.0-18-amd64 x86_64
arch_bits:64
monotonic_clock:POSIX clock_gettime
multiplexing_api:epoll
atomicvar_api:c11-builtin
gcc_version:12.2.0
process_id:1
process_supervised:no
run_id:0f7c9a4e1f7b8f3d2a0d5c6b7e8f9a0b1c2d3e4f
tcp_port:6379
server_time_usec:1733052000123456
uptime_in_seconds:5321
uptime_in_days:0
hz:10
configured_hz:10
lru_clock:1234567
executable:/usr/local/bin/valkey-server
config_file:/etc/valkey/valkey.conf
io_threads_active:0
availability_zone:
listener0:name=tcp,bind=*,bind=-::*,port=6379
"""
VALKEY_8_CLUSTER_NODE = VALKEY_8_SINGLE.replace("server_mode:standalone", "server_mode:cluster")
# Valkey 8 with `extended-redis-compatibility yes`: its mode field is called redis_mode again.
VALKEY_8_COMPAT_CLUSTER_NODE = VALKEY_8_SINGLE.replace("server_mode:standalone",
                                                       "redis_mode:cluster")
# A Redis-compatible server that says nothing but a Redis version (no run_id, no server name).
UNKNOWN_COMPATIBLE = """\
# Server
redis_version:7.2.0
redis_mode:standalone
arch_bits:64
tcp_port:6379
uptime_in_seconds:812
uptime_in_days:0
"""
DRAGONFLY_LIKE = """\
# Server
redis_version:7.4.0
dragonfly_version:df-v1.25.2
redis_mode:standalone
arch_bits:64
os:Linux 6.1.0-18-amd64 x86_64
thread_count:2
multiplexing_api:epoll
tcp_port:6379
uptime_in_seconds:77
uptime_in_days:0
"""
KEYDB_LIKE = (REDIS_7_SINGLE.replace("redis_version:7.0.15", "redis_version:6.3.4")
              .replace("executable:/usr/bin/redis-server", "executable:/usr/local/bin/keydb-server"))
SENTINEL_PROCESS = REDIS_7_SINGLE.replace("redis_mode:standalone", "redis_mode:sentinel")
CLUSTER_ON = "# Cluster\ncluster_enabled:1\n"
CLUSTER_OFF = "# Cluster\ncluster_enabled:0\n"

def known(product: str, version: str, mode: str, detail: str = "", redis_version: str | None = None) -> ServerIdentity:
    """The identity a case expects; its Redis version is its own version unless it says otherwise."""
    return ServerIdentity(product, version, mode, detail, version if redis_version is None else redis_version)


CASES: list[tuple[str, str, str | None, ServerIdentity]] = [
    ("redis 7.0 single", REDIS_7_SINGLE, CLUSTER_OFF, known("Redis", "7.0.15", "single")),
    ("redis 7 cluster node", REDIS_7_CLUSTER_NODE, CLUSTER_ON, known("Redis", "7.0.15", "cluster")),
    ("valkey 8 single", VALKEY_8_SINGLE, CLUSTER_OFF, known("Valkey", "8.0.2", "single", redis_version="7.2.4")),
    ("valkey 8 cluster node", VALKEY_8_CLUSTER_NODE, CLUSTER_ON,
     known("Valkey", "8.0.2", "cluster", redis_version="7.2.4")),
    ("valkey 8 cluster node, redis compatibility", VALKEY_8_COMPAT_CLUSTER_NODE, CLUSTER_ON,
     known("Valkey", "8.0.2", "cluster", redis_version="7.2.4")),
    # No INFO cluster (a server without it): the mode field alone says cluster.
    ("valkey 8 cluster node, no INFO cluster", VALKEY_8_CLUSTER_NODE, None,
     known("Valkey", "8.0.2", "cluster", redis_version="7.2.4")),
    ("unknown, redis_version only", UNKNOWN_COMPATIBLE, CLUSTER_OFF,
     known("Redis-compatible", "7.2.0", "single", "redis_version 7.2.0")),
    ("dragonfly-like", DRAGONFLY_LIKE, None, known("Dragonfly", "1.25.2", "single", redis_version="7.4.0")),
    ("keydb-like", KEYDB_LIKE, CLUSTER_ON, known("KeyDB", "6.3.4", "cluster")),
    ("sentinel process", SENTINEL_PROCESS, None, known("Redis", "7.0.15", "sentinel")),
]


@pytest.mark.parametrize(("server", "cluster", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_identify_server_from_info_text_and_from_redis_py(
    server: str, cluster: str | None, expected: ServerIdentity
) -> None:
    assert identify_server(server, cluster) == expected
    # redis-py hands INFO over parsed (numbers as int/float): the same answer.
    parsed_cluster = parse_info(cluster) if cluster is not None else None
    assert identify_server(parse_info(server), parsed_cluster) == expected


def test_names_as_doctor_shows_them() -> None:
    assert identify_server(VALKEY_8_CLUSTER_NODE, CLUSTER_ON).name == "Valkey 8.0.2"
    assert identify_server(REDIS_7_SINGLE).name == "Redis 7.0.15"
    assert identify_server(UNKNOWN_COMPATIBLE).name == (
        "Redis-compatible server (redis_version 7.2.0)")
    assert info_fields("# Server\r\nredis_version:7.0.15\r\n") == {"redis_version": "7.0.15"}


class CapturedNode:
    """A node client that answers INFO with captured replies, parsed as redis-py parses them."""

    def __init__(self, server: str, cluster: str | None, memory: str = "maxmemory:0\n"
                 "maxmemory_policy:noeviction\n") -> None:
        self.replies = {"server": server, "cluster": cluster, "memory": memory}

    def info(self, section: str) -> dict[str, Any]:
        reply = self.replies[section]
        if reply is None:
            raise redis.exceptions.ResponseError("unknown section")
        return dict(parse_info(reply))


def _doctor(kind: str, nodes: list[tuple[str, Any]]) -> tuple[Doctor, bool]:
    doctor = Doctor(App())
    return doctor, doctor.server_info(kind, nodes)


def test_doctor_names_a_valkey_cluster_and_its_mode() -> None:
    """The issue's case: a 3-master Valkey 8 Cluster, which doctor called "Redis 7.2.4, mode single"."""
    nodes = [(f"10.0.0.{i}:6379", CapturedNode(VALKEY_8_CLUSTER_NODE, CLUSTER_ON)) for i in (1, 2, 3)]
    doctor, ok = _doctor("cluster", nodes)
    assert ok
    found = {f.name: f for f in doctor.findings}
    assert found["server"].detail == "Valkey 8.0.2, mode cluster (3 master(s))"
    report = doctor.to_json()
    assert (report["mode"], report["server_product"], report["server_version"]) == (
        "cluster", "Valkey", "8.0.2")
    assert report["server"] == "Valkey 8.0.2"


def test_doctor_refuses_a_valkey_cluster_node_behind_a_single_node_url() -> None:
    """Only `cluster_enabled:1` / `server_mode:cluster` tell it: Valkey 8 has no redis_mode."""
    doctor, ok = _doctor("redis", [("10.0.0.1:6379", CapturedNode(VALKEY_8_CLUSTER_NODE, CLUSTER_ON))])
    assert not ok
    mode = next(f for f in doctor.findings if f.name == "mode")
    assert mode.status == "fail" and "is a Cluster node (INFO reports cluster mode)" in mode.detail
    assert mode.fix == "use redis+cluster://host:port[,host:port...]"


def test_doctor_on_an_unknown_compatible_server_says_what_info_says() -> None:
    doctor, ok = _doctor("redis", [("db:6379", CapturedNode(UNKNOWN_COMPATIBLE, None))])
    assert ok
    server = next(f for f in doctor.findings if f.name == "server")
    assert server.detail == "Redis-compatible server (redis_version 7.2.0), mode single (1 node)"
    assert doctor.to_json()["server_product"] == "Redis-compatible"


# -- real servers -------------------------------------------------------------------------------

# The product of the redis-server on PATH (the machine's Redis, or Valkey or another Redis in a CI cell).
LIVE_PRODUCT = "Valkey" if "valkey" in subprocess.run([REDIS_SERVER, "--version"], capture_output=True, text=True,
                                                        check=True).stdout.lower() else "Redis"


def test_live_info_of_a_real_single_node_and_cluster(redis_url: str, cluster_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        single = identify_server(client.info("server"), client.info("cluster"))
    assert (single.product, single.mode) == (LIVE_PRODUCT, "single")
    with redis.Redis.from_url(redis_url) as client:
        reported = client.info("server")
    assert single.version == reported.get("valkey_version", reported["redis_version"])

    report = as_json(run("--url", cluster_url, "doctor", "--json"))
    assert report["ok"] is True, report["checks"]
    assert report["server_product"] == LIVE_PRODUCT and report["mode"] == "cluster"
    server = next(c for c in report["checks"] if c["name"] == "server")
    assert server["detail"] == f"{LIVE_PRODUCT} {report['server_version']}, mode cluster (3 master(s))"


def test_doctor_through_sentinel_and_at_a_sentinel_process() -> None:
    with SentinelSetup(replicas=1, sentinels=1) as setup:
        managed = run("--url", setup.sentinel_url, "doctor", "--json")
        host, port = setup.sentinel_address
        at_sentinel = run("--url", f"redis://{host}:{port}", "doctor", "--json")
    report = as_json(managed)
    assert managed.returncode == 0, json.dumps(report["checks"])
    assert report["mode"] == "sentinel" and report["server_product"] == LIVE_PRODUCT
    server = next(c for c in report["checks"] if c["name"] == "server")
    assert server["detail"].endswith(
        "mode sentinel (the master of service 'mymaster', found through Sentinel)")

    wrong = as_json(at_sentinel)
    assert at_sentinel.returncode == 4
    mode = next(c for c in wrong["checks"] if c["name"] == "mode")
    assert mode["status"] == "fail" and "is a Sentinel process, not a data node" in mode["detail"]
    assert mode["fix"].startswith("use redis+sentinel://")
