"""A real Redis Cluster for the suite: made with redis-cli, waited on until healthy, failed over on demand."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.servers.process import (
    REDIS_CLI,
    RedisServer,
    RedisStartupError,
    ServerGroup,
    child_env,
    output,
    run_quietly,
    start_together,
    wait_until,
)
from tests.servers.resp import parse_info

if TYPE_CHECKING:  # pragma: no cover - typing only
    import redis.cluster

__all__ = ["ClusterNodeInfo", "RedisCluster"]


@dataclass(frozen=True)
class ClusterNodeInfo:
    """One line of ``CLUSTER NODES`` as seen by some node."""

    node_id: str
    host: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    link_state: str
    slots: tuple[str, ...] = field(default=())

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def is_failing(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})

    @classmethod
    def parse_all(cls, text: str) -> list[ClusterNodeInfo]:
        nodes = []
        for line in text.splitlines():
            fields = line.split()
            if len(fields) < 8:
                continue
            address = fields[1].split(",")[0]  # ip:port@cport[,hostname]
            host, _, rest = address.rpartition(":")
            nodes.append(
                cls(
                    node_id=fields[0],
                    host=host,
                    port=int(rest.split("@")[0]),
                    flags=frozenset(fields[2].split(",")),
                    master_id=None if fields[3] == "-" else fields[3],
                    link_state=fields[7],
                    slots=tuple(s for s in fields[8:] if not s.startswith("[")),
                )
            )
        return nodes


class RedisCluster(ServerGroup):
    """``masters`` masters (+``replicas_per_master`` replicas each) made with
    ``redis-cli --cluster create``, waited on until every node reports
    ``cluster_state:ok``, all nodes agree on the topology and every replica's
    link is up.  Use as a context manager or call :meth:`start` / :meth:`close`."""

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas_per_master: int = 0,
        password: str | None = None,
        appendonly: bool = False,
        node_timeout_ms: int = 2000,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
    ) -> None:
        if masters < 3:
            raise ValueError("redis-cli --cluster create needs at least 3 masters")
        self.password = password
        self.replicas_per_master = replicas_per_master
        self.node_timeout_ms = node_timeout_ms
        self.startup_timeout = startup_timeout
        cluster_args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(node_timeout_ms),
            # Always let a replica take over, however stale: keeps failover tests deterministic.
            "--cluster-replica-validity-factor",
            "0",
        ]
        total = masters * (1 + replicas_per_master)
        self.nodes: list[RedisServer] = [
            RedisServer(
                password=password,
                appendonly=appendonly,
                extra_args=[*cluster_args, *extra_args],
                startup_timeout=startup_timeout,
                name=f"cluster-node{i}",
            )
            for i in range(total)
        ]
        self.initial_masters: list[RedisServer] = []
        self._node_ids: dict[int, str] = {}
        self._started = False

    # -- addresses -------------------------------------------------------

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        """(host, port) of the masters as created (static, even after a failover)."""
        return [n.address for n in (self.initial_masters or self.nodes)]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3``."""
        return "redis+cluster://" + ",".join(f"{h}:{p}" for h, p in self.startup_nodes)

    def _by_port(self, port: int) -> RedisServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise KeyError(f"no cluster node on port {port}")

    # -- lifecycle -------------------------------------------------------

    def _servers(self) -> list[RedisServer]:
        return self.nodes

    def _bring_up(self) -> None:
        start_together(self.nodes)
        self._create()
        self.wait_healthy(self.startup_timeout)
        self._node_ids = {n.port: str(n.command("CLUSTER", "MYID")) for n in self.nodes}
        self.initial_masters = self.masters

    def _create(self) -> None:
        cmd = [REDIS_CLI, "--cluster", "create", *(f"{n.host}:{n.port}" for n in self.nodes)]
        cmd += ["--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"]
        if self.password is not None:
            cmd += ["--no-auth-warning", "-a", self.password]
        try:
            result = run_quietly(cmd, timeout=self.startup_timeout, env=child_env())
        except subprocess.TimeoutExpired as exc:
            raise RedisStartupError(
                f"redis-cli --cluster create timed out: {exc}\n{self._logs()}"
            ) from exc
        out = output(result)
        if result.returncode != 0 or "[OK] All 16384 slots covered" not in out:
            raise RedisStartupError(
                f"redis-cli --cluster create failed ({result.returncode}):\n{out}\n{self._logs()}"
            )

    # -- topology --------------------------------------------------------

    def running_nodes(self) -> list[RedisServer]:
        """Nodes whose process is alive and not paused."""
        return [n for n in self.nodes if n.is_running and not n.is_paused]

    def view(self, node: RedisServer | None = None) -> list[ClusterNodeInfo]:
        """``CLUSTER NODES`` as seen by ``node`` (default: the first running node)."""
        node = node or self.running_nodes()[0]
        return ClusterNodeInfo.parse_all(node.command("CLUSTER", "NODES"))

    def node_id(self, node: RedisServer) -> str:
        if node.port not in self._node_ids:
            self._node_ids[node.port] = str(node.command("CLUSTER", "MYID"))
        return self._node_ids[node.port]

    @property
    def masters(self) -> list[RedisServer]:
        """Current masters owning slots, as a running node sees them now (live query)."""
        return [
            self._by_port(i.port)
            for i in sorted(self.view(), key=lambda i: i.port)
            if i.is_master and i.slots and "fail" not in i.flags
        ]

    @property
    def replicas(self) -> list[RedisServer]:
        """Current replicas (live query)."""
        return [
            self._by_port(i.port)
            for i in sorted(self.view(), key=lambda i: i.port)
            if "slave" in i.flags and "fail" not in i.flags
        ]

    def replicas_of(self, master: RedisServer) -> list[RedisServer]:
        mid = self.node_id(master)
        return [
            self._by_port(i.port) for i in self.view() if "slave" in i.flags and i.master_id == mid
        ]

    def node_for_key(self, key: str | bytes) -> RedisServer:
        """The master currently serving ``key``'s slot."""
        slot = int(self.running_nodes()[0].command("CLUSTER", "KEYSLOT", key))
        for info in self.view():
            if not info.is_master or "fail" in info.flags:
                continue
            for spec in info.slots:
                lo, _, hi = spec.partition("-")
                if int(lo) <= slot <= int(hi or lo):
                    return self._by_port(info.port)
        raise LookupError(f"no master serves slot {slot}")

    def _health_problem(self) -> str | None:
        """None if healthy, else a description of what is not settled yet."""
        running = self.running_nodes()
        if not running:
            return "no running nodes"
        running_ports = {n.port for n in running}
        signature: dict[int, tuple[str, int | None, tuple[str, ...]]] | None = None
        for node in running:
            info = parse_info(node.command("CLUSTER", "INFO"))
            if info.get("cluster_state") != "ok" or info.get("cluster_slots_assigned") != "16384":
                state, slots = info.get("cluster_state"), info.get("cluster_slots_assigned")
                return f"{node.port}: cluster_state={state} slots_assigned={slots}"
            view = ClusterNodeInfo.parse_all(node.command("CLUSTER", "NODES"))
            ports_by_id = {i.node_id: i.port for i in view}
            seen = {i.port: i for i in view if i.port in running_ports}
            if set(seen) != running_ports:
                return f"{node.port} does not know {sorted(running_ports - set(seen))} yet"
            for i in seen.values():
                if i.is_failing or ("myself" not in i.flags and i.link_state != "connected"):
                    return f"{node.port} sees {i.port} as {sorted(i.flags)} {i.link_state}"
            sig = {
                i.port: (
                    "master" if i.is_master else "replica",
                    ports_by_id.get(i.master_id or ""),
                    i.slots,
                )
                for i in seen.values()
            }
            if signature is None:
                signature = sig
            elif sig != signature:
                return f"nodes disagree on the topology (seen from {node.port})"
            if "slave" in seen[node.port].flags:
                link = node.info("replication").get("master_link_status")
                if link != "up":
                    return f"replica {node.port}: master_link_status={link}"
        return None

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Wait until every running node says cluster_state:ok, all agree on roles and
        slots, and every running replica's link is up."""
        self._wait_settled(self._health_problem, "cluster not healthy", timeout)

    def kill_master_and_wait_failover(
        self, master: RedisServer, timeout: float = 30.0
    ) -> RedisServer:
        """SIGKILL ``master``, wait (bounded) until one of its replicas is promoted and
        every surviving node is healthy again; returns the promoted node."""
        candidates = {r.port for r in self.replicas_of(master)}
        if not candidates:
            raise ValueError(f"{master!r} has no replica to fail over to")
        master.kill()

        def promoted() -> RedisServer | None:
            survivors = self.running_nodes()
            chosen: set[int] = set()
            for node in survivors:
                info = parse_info(node.command("CLUSTER", "INFO"))
                if info.get("cluster_state") != "ok":
                    return None
                winners = {
                    i.port
                    for i in ClusterNodeInfo.parse_all(node.command("CLUSTER", "NODES"))
                    if i.port in candidates and i.is_master and i.slots
                }
                if len(winners) != 1:
                    return None
                chosen |= winners
            return self._by_port(chosen.pop()) if len(chosen) == 1 else None

        node: RedisServer = wait_until(
            promoted,
            timeout=timeout,
            message=lambda: f"no replica of {master.port} was promoted\n{self._logs(8)}",
        )
        self.wait_healthy(timeout)
        return node

    def client(self, **kwargs: Any) -> redis.cluster.RedisCluster:
        """redis-py cluster client over :attr:`startup_nodes`."""
        from redis.cluster import ClusterNode
        from redis.cluster import RedisCluster as PyRedisCluster

        options: dict[str, Any] = {
            "startup_nodes": [
                ClusterNode(h, p)  # type: ignore[no-untyped-call]
                for h, p in self.startup_nodes
            ],
            "password": self.password,
        }
        options.update(kwargs)
        return PyRedisCluster(**options)
