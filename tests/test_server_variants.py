"""Redis-compatible servers and services, named and handled (issue 27, item 5).

What cannot run here (the managed services, Garnet, Dragonfly, KeyDB) is handled from the replies they
document or their INFO code writes: each INFO below is written after that server's INFO code (Garnet's
GarnetInfoMetrics, Dragonfly's and KeyDB's server sections) or a captured ElastiCache reply, and Garnet's
Lua refusal is its CmdStrings.RESP_ERR_LUA_DISABLED. Upstash and the serverless AWS services document their
endpoints' host names, not their INFO: a terse INFO stands for theirs (an INFO field naming Upstash, as
other servers name themselves, is assumed, not captured). Upstash's scripts take a global lock unless their
shebang sets `allow-key-locking`, a flag Redis refuses: the brake sends that variant of its script when,
and only when, its URL's host is an Upstash endpoint; a wire test shows what it sends there, and the real
servers here show why no other server gets it. `doctor` and `bench` never send a script without a key
(ElastiCache Serverless refuses one): MONITOR on a real server shows it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis._parsers.helpers import parse_info

from distbrake import DistributedBrake
from distbrake.cli.app import App
from distbrake.cli.doctor import Doctor
from distbrake.cli.server_identity import ServerIdentity, identify_server, service_of_host
from distbrake.redis.script import VARIANTS, brake_script, script_source, variant_for_hosts
from tests.test_cli import as_json, run
from tests.test_server_identity import (
    CLUSTER_OFF,
    CLUSTER_ON,
    DRAGONFLY_LIKE,
    KEYDB_LIKE,
    REDIS_7_SINGLE,
    CapturedNode,
)

UPSTASH_HOST = "us1-merry-cat-32748.upstash.io"
SERVERLESS_HOST = "my-cache-abc123.serverless.use1.cache.amazonaws.com"
MEMORYDB_HOST = "clustercfg.my-db.abc123.memorydb.us-east-1.amazonaws.com"

# Garnet's INFO server, field by field as GarnetInfoMetrics writes it.
GARNET = """\
# Server
garnet_version:1.0.84
os:Unix 6.1.0.18
processor_count:2
arch_bits:64
uptime_in_seconds:42
uptime_in_days:0
monitor_task:enabled
monitor_freq:0
latency_monitor:disabled
run_id:6cb9ba1bd2a1b0f2bb1f5c4a6e0d8e7d1c3a9b55
redis_version:7.2.5
redis_mode:standalone
"""
# An ElastiCache node's INFO server (captured; its os field names the service).
ELASTICACHE = """\
# Server
redis_version:7.1.0
redis_git_sha1:0
redis_git_dirty:0
redis_build_id:0
redis_mode:standalone
os:Amazon ElastiCache
arch_bits:64
run_id:96a2800c5c08b5e9eb409ab60da9f11acd3669cd
tcp_port:6379
uptime_in_seconds:13838909
executable:-
config_file:-
"""
# A service that says little in INFO: only its endpoint's host name tells it.
TERSE = "# Server\nredis_version:7.2.4\n"
UPSTASH_FIELD = TERSE + "upstash_version:1.10.3\n"
GARNET_LUA_OFF = "ERR This instance has Lua scripting support disabled"


def known(product: str, version: str, mode: str, redis_version: str) -> ServerIdentity:
    return ServerIdentity(product, version, mode, "", redis_version)


@pytest.mark.parametrize(("server", "cluster", "host", "expected"), [
    (GARNET, CLUSTER_OFF, "", known("Garnet", "1.0.84", "single", "7.2.5")),
    (GARNET.replace("redis_mode:standalone", "redis_mode:cluster"), CLUSTER_ON, "",
     known("Garnet", "1.0.84", "cluster", "7.2.5")),
    (DRAGONFLY_LIKE, None, "", known("Dragonfly", "1.25.2", "single", "7.4.0")),
    (KEYDB_LIKE, CLUSTER_OFF, "", known("KeyDB", "6.3.4", "single", "6.3.4")),
    (TERSE + "keydb_version:6.3.4\n", None, "", known("KeyDB", "6.3.4", "single", "7.2.4")),
    (ELASTICACHE, CLUSTER_OFF, "", known("ElastiCache", "7.1.0", "single", "7.1.0")),
    (TERSE, None, UPSTASH_HOST, known("Upstash", "7.2.4", "single", "7.2.4")),
    (UPSTASH_FIELD, None, "", known("Upstash", "1.10.3", "single", "7.2.4")),
    (TERSE, None, SERVERLESS_HOST, known("ElastiCache Serverless", "7.2.4", "cluster", "7.2.4")),
    (ELASTICACHE, CLUSTER_OFF, SERVERLESS_HOST.upper(), known("ElastiCache Serverless", "7.1.0", "cluster", "7.1.0")),
    (TERSE, None, MEMORYDB_HOST, known("MemoryDB", "7.2.4", "cluster", "7.2.4")),
    (REDIS_7_SINGLE, CLUSTER_OFF, "redis.internal.example", known("Redis", "7.0.15", "single", "7.0.15")),
], ids=["garnet", "garnet cluster", "dragonfly", "keydb", "keydb field", "elasticache", "upstash host",
        "upstash field", "elasticache serverless", "serverless host in capitals", "memorydb", "redis"])
def test_each_server_is_named_from_its_info_and_host(
    server: str, cluster: str | None, host: str, expected: ServerIdentity
) -> None:
    assert identify_server(server, cluster, host) == expected
    parsed_cluster = parse_info(cluster) if cluster is not None else None
    assert identify_server(parse_info(server), parsed_cluster, host) == expected  # as redis-py hands it over


def test_hosts_that_only_look_like_a_service_are_not_one() -> None:
    for host in ("upstash.io.example.com", "my.cache.amazonaws.com", "memorydb.example.com", "localhost", ""):
        assert service_of_host(host) is None, host
    assert service_of_host("db.upstash.io.") == "Upstash"  # a fully qualified name's final dot


def doctor_on(kind: str, node: CapturedNode, host: str = "", variant: str = "redis") -> tuple[Doctor, bool]:
    doctor = Doctor(App())
    return doctor, doctor.server_info(kind, [(f"{host or 'db'}:6379", node)], host, variant)


def findings(doctor: Doctor) -> dict[str, Any]:
    return {f.name: f for f in doctor.findings}


def test_doctor_on_upstash_says_the_brake_sends_the_key_locking_variant() -> None:
    doctor, ok = doctor_on("redis", CapturedNode(TERSE, None), UPSTASH_HOST, "upstash")
    assert ok
    found = findings(doctor)
    assert found["server"].detail == "Upstash 7.2.4, mode single (1 node)"
    assert found["server notes"].status == "ok"
    assert "'#!lua flags=allow-key-locking'" in found["server notes"].detail
    assert doctor.to_json()["server_product"] == "Upstash"


def test_doctor_warns_when_upstash_is_reached_through_another_host_name() -> None:
    doctor, ok = doctor_on("redis", CapturedNode(UPSTASH_FIELD, None), "10.1.2.3", "redis")
    assert ok
    note = findings(doctor)["server notes"]
    assert note.status == "warn" and "global lock" in note.detail
    assert "<db>.upstash.io" in note.fix


@pytest.mark.parametrize("host", [SERVERLESS_HOST, MEMORYDB_HOST])
def test_doctor_refuses_a_serverless_cluster_behind_a_single_node_url(host: str) -> None:
    doctor, ok = doctor_on("redis", CapturedNode(TERSE, None), host)
    assert not ok
    mode = findings(doctor)["mode"]
    assert mode.status == "fail" and "Cluster node" in mode.detail and "+cluster://" in mode.fix
    doctor, ok = doctor_on("cluster", CapturedNode(TERSE, None), host)
    assert ok
    assert "always a Cluster" in findings(doctor)["server notes"].detail


@pytest.mark.parametrize(("info", "caveat"), [
    (GARNET, "only when started with --lua"), (DRAGONFLY_LIKE, "touches only the key it declares"),
    (KEYDB_LIKE, "active replication"), (ELASTICACHE, "every node must allow"),
])
def test_doctor_gives_each_servers_caveat(info: str, caveat: str) -> None:
    doctor, ok = doctor_on("redis", CapturedNode(info, CLUSTER_OFF))
    assert ok
    assert caveat in findings(doctor)["server notes"].detail


def test_doctor_on_redis_and_valkey_adds_no_notes() -> None:
    doctor, ok = doctor_on("redis", CapturedNode(REDIS_7_SINGLE, CLUSTER_OFF))
    assert ok and "server notes" not in findings(doctor)


class GarnetWithoutLua:
    """A node that refuses every script as Garnet started without --lua does."""

    def script_load(self, source: str) -> str:
        raise redis.exceptions.ResponseError(GARNET_LUA_OFF)


def test_doctor_tells_garnet_without_lua_to_start_with_lua() -> None:
    doctor = Doctor(App())
    doctor.script([("garnet:6379", GarnetWithoutLua())])
    script = findings(doctor)["script"]
    assert script.status == "fail" and "runs no Lua scripts" in script.detail
    assert script.fix == "Garnet: start it with --lua (the brake is one Lua script)"


# -- the Upstash variant of the script ------------------------------------------------------------------------


def test_only_an_upstash_endpoint_gets_the_upstash_script() -> None:
    upstash = DistributedBrake.from_url(f"rediss://default:pw@{UPSTASH_HOST}:6379")
    plain = DistributedBrake.from_url("redis://127.0.0.1:6379")
    try:
        assert upstash.script.variant == "upstash"
        assert upstash.script.text == "#!lua flags=allow-key-locking\n" + script_source()
        assert upstash.script.sha == brake_script("upstash").sha != brake_script().sha
        assert plain.script.variant == "redis" and plain.script.text == script_source()
    finally:
        upstash.close()
        plain.close()
    assert variant_for_hosts([(UPSTASH_HOST.upper() + ".", 6379)]) == "upstash"
    assert variant_for_hosts([(UPSTASH_HOST, 6379), ("10.0.0.1", 6379)]) == "redis"
    assert variant_for_hosts([]) == "redis"


def test_redis_refuses_the_upstash_shebang_so_only_upstash_gets_it(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url) as client:
        with pytest.raises(redis.exceptions.ResponseError, match="allow-key-locking"):
            client.script_load(brake_script("upstash").text)
        assert client.script_load(brake_script().text) == brake_script().sha
    with DistributedBrake.from_url(redis_url) as brake:
        assert [brake.check("t", {"a": 1}, session_id="s").count for _ in range(2)] == [1, 2]


@pytest.fixture
def upstash_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, list[bytes]]]:
    """A listener standing in for an Upstash endpoint: UPSTASH_HOST resolves to it; it records what it is sent
    and answers as a server whose script cache is empty (NOSCRIPT, then the loaded script's SHA)."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    received: list[bytes] = []
    real = socket.getaddrinfo

    def resolve(host: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1" if host == UPSTASH_HOST else host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)

    def answer(connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as stream:
            while (line := stream.readline()).startswith(b"*"):
                parts = []
                for _ in range(int(line[1:])):
                    size = int(stream.readline()[1:])
                    parts.append(stream.read(size + 2)[:-2])
                command = parts[0].upper()
                if command in (b"EVALSHA", b"SCRIPT"):
                    received.append(b" ".join(parts))
                if command == b"EVALSHA" and not any(r.startswith(b"SCRIPT") for r in received):
                    connection.sendall(b"-NOSCRIPT No matching script.\r\n")
                elif command == b"SCRIPT":
                    sha = brake_script("upstash").sha.encode()
                    connection.sendall(b"$40\r\n" + sha + b"\r\n")
                elif command == b"EVALSHA":
                    connection.sendall(b"-ERR this stand-in runs no script\r\n")
                    return
                elif command == b"HELLO":
                    connection.sendall(b"%1\r\n$5\r\nproto\r\n:3\r\n")
                elif command == b"GET":  # the kill switch's read (a connection of its own): not set
                    connection.sendall(b"_\r\n")
                else:
                    connection.sendall(b"+OK\r\n")

    stop = threading.Event()

    def serve() -> None:  # every connection the brake opens (its check's, its kill-switch reader's)
        with listener:
            listener.settimeout(0.1)
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    connection, _ = listener.accept()
                    connection.settimeout(None)
                    threading.Thread(target=answer, args=(connection,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port, received
    stop.set()
    thread.join(timeout=10)


def test_the_brake_sends_upstash_the_key_locking_variant(upstash_endpoint: tuple[int, list[bytes]]) -> None:
    port, received = upstash_endpoint
    with DistributedBrake.from_url(f"redis://{UPSTASH_HOST}:{port}", on_backend_error="local",
                                   timeout_seconds=5) as brake:
        verdict = brake.check("search", {"q": 1}, session_id="s")
    assert verdict.decided_by != "redis"  # the stand-in answered no check: the policy decided
    scripts = [r for r in received if r.split(b" ", 1)[0].upper() in (b"EVALSHA", b"SCRIPT")]
    upstash = brake_script("upstash")
    assert scripts[0].startswith(b"EVALSHA " + upstash.sha.encode() + b" 1 ")
    assert scripts[1] == b"SCRIPT LOAD " + upstash.text.encode()
    assert scripts[1].startswith(b"SCRIPT LOAD " + VARIANTS["upstash"].encode() + b"--[[ distbrake")
    assert scripts[2].startswith(b"EVALSHA " + upstash.sha.encode() + b" 1 ")


# -- no script without a key ------------------------------------------------------------------------------------


def test_doctor_and_bench_send_no_script_without_a_key(redis_url: str) -> None:
    """ElastiCache Serverless refuses a script with no key (it routes by key): MONITOR sees every script command
    of `doctor` and `bench` name one key."""
    seen: list[list[str]] = []
    ready = threading.Event()
    done = threading.Event()

    def watch() -> None:
        with redis.Redis.from_url(redis_url, decode_responses=True) as client, client.monitor() as monitor:
            ready.set()
            while not done.is_set():
                command = monitor.next_command()["command"]
                if command == "PING done":
                    return
                seen.append(command.split(" "))

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert ready.wait(10)
    doctor = run("--url", redis_url, "doctor", "--json")
    bench = run("--url", redis_url, "bench", "--checks", "64", "--sessions", "100", "--json")
    done.set()
    with redis.Redis.from_url(redis_url) as client:
        client.execute_command("PING", "done")
    thread.join(timeout=10)
    assert as_json(doctor)["ok"] is True, doctor.stdout
    assert bench.returncode == 0, bench.stderr
    scripts = [c for c in seen if c[0].strip('"').upper() in ("EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO")]
    assert len(scripts) > 100
    for command in scripts:
        assert int(command[2].strip('"')) >= 1, command  # numkeys
