"""Redis Sentinel for the suite: sentinel processes, and a master + replicas + sentinels that fail over."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tests.servers.process import HOST, REDIS_SERVER, RedisServer, ServerGroup, directive, start_together, wait_until
from tests.servers.resp import pairs_to_dict

if TYPE_CHECKING:  # pragma: no cover - typing only
    import redis.sentinel

__all__ = ["SentinelServer", "SentinelSetup"]


class SentinelServer(RedisServer):
    """A ``redis-server --sentinel`` process monitoring one service."""

    kind = "sentinel"

    def __init__(
        self,
        *,
        service_name: str,
        master_port: int,
        quorum: int = 1,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        auth_pass: str | None = None,
        **kwargs: Any,
    ) -> None:
        self.service_name = service_name
        self.master_port = master_port
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.auth_pass = auth_pass
        super().__init__(**kwargs)

    def config_lines(self) -> list[str]:
        s = self.service_name
        lines = [
            *self._process_lines(),
            f"sentinel monitor {s} {HOST} {self.master_port} {self.quorum}",
            f"sentinel down-after-milliseconds {s} {self.down_after_ms}",
            f"sentinel failover-timeout {s} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {s} 1",
        ]
        if self.auth_pass is not None:
            lines.append(directive(f"sentinel auth-pass {s}", [self.auth_pass]))
        return lines + self._given_lines()

    def _write_config(self) -> None:
        # Sentinel rewrites its config (known replicas, epochs): keep that on restart.
        if not self.config_path.exists():
            super()._write_config()

    def _command_line(self) -> list[str]:
        return [REDIS_SERVER, str(self.config_path), "--sentinel"]

    def _credentials(self) -> dict[str, Any]:
        return {}  # a sentinel is asked without AUTH (auth_pass is for the data nodes)


class SentinelSetup(ServerGroup):
    """One master + ``replicas`` replicas + ``sentinels`` sentinels (quorum 1 by
    default) monitoring ``service_name``.  Ready when the master's replicas are
    online and every sentinel reports the master and knows every replica."""

    def __init__(
        self,
        *,
        service_name: str = "mymaster",
        replicas: int = 1,
        sentinels: int = 1,
        quorum: int = 1,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 3000,
        password: str | None = None,
        appendonly: bool = False,
        startup_timeout: float = 20.0,
    ) -> None:
        self.service_name = service_name
        self.password = password
        self.startup_timeout = startup_timeout
        self.master = RedisServer(password=password, appendonly=appendonly, name="sentinel-master")
        self.replicas: list[RedisServer] = [
            RedisServer(
                password=password,
                appendonly=appendonly,
                extra_args=["--replicaof", HOST, str(self.master.port)],
                name=f"sentinel-replica{i}",
            )
            for i in range(replicas)
        ]
        self.sentinels: list[SentinelServer] = [
            SentinelServer(
                service_name=service_name,
                master_port=self.master.port,
                quorum=quorum,
                down_after_ms=down_after_ms,
                failover_timeout_ms=failover_timeout_ms,
                auth_pass=password,
                name=f"sentinel{i}",
            )
            for i in range(sentinels)
        ]
        self._started = False

    @property
    def replica(self) -> RedisServer:
        return self.replicas[0]

    @property
    def sentinel(self) -> SentinelServer:
        return self.sentinels[0]

    @property
    def data_nodes(self) -> list[RedisServer]:
        return [self.master, *self.replicas]

    @property
    def sentinel_address(self) -> tuple[str, int]:
        return self.sentinel.address

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        return [s.address for s in self.sentinels]

    @property
    def sentinel_url(self) -> str:
        """``redis+sentinel://127.0.0.1:SPORT[,...]/mymaster``."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinel_addresses)
        return f"redis+sentinel://{hosts}/{self.service_name}"

    def _servers(self) -> list[RedisServer]:
        return [*self.data_nodes, *self.sentinels]

    def _close_order(self) -> list[RedisServer]:
        return [*self.sentinels, *self.data_nodes]

    def _bring_up(self) -> None:
        start_together(self.data_nodes)
        # Replicas must be online first: a sentinel learns about replicas from the
        # master's INFO, which it only re-reads every 10 s in the steady state.
        wait_until(
            self._replicas_online,
            timeout=self.startup_timeout,
            message=lambda: f"replicas did not sync\n{self._logs()}",
        )
        start_together(self.sentinels)
        self.wait_sentinels_agree(self.master, self.startup_timeout)

    def _replicas_online(self, master: RedisServer | None = None) -> bool:
        master = master or self.master
        info = master.info("replication")
        expected = {r.port for r in self.replicas if r is not master and r.is_running}
        online = {
            int(_pairs_from_slave_line(v).get("port", "0"))
            for k, v in info.items()
            if k.startswith("slave")
            and k[5:].isdigit()
            and _pairs_from_slave_line(v).get("state") == "online"
        }
        return expected <= online

    def _disagreement(self, master: RedisServer) -> str | None:
        """None once every running sentinel agrees on ``master``, else what is not settled yet."""
        for sentinel in self.sentinels:
            if not sentinel.is_running:
                continue
            addr = sentinel.command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name)
            if addr != [HOST, str(master.port)]:
                return f"sentinel {sentinel.port} reports master {addr}"
            flags = str(pairs_to_dict(sentinel.command("SENTINEL", "MASTER", self.service_name))["flags"])
            if flags != "master":
                return f"sentinel {sentinel.port} master flags {flags}"
            known = {
                int(d["port"]): d
                for d in map(pairs_to_dict, sentinel.command("SENTINEL", "REPLICAS", self.service_name))
            }
            for node in self.data_nodes:
                if node is master or not node.is_running:
                    continue
                d = known.get(node.port)
                if d is None or d.get("flags") != "slave" or d.get("master-link-status") != "ok":
                    return f"sentinel {sentinel.port} replica {node.port}: {d and d.get('flags')}"
            others = sentinel.command("SENTINEL", "SENTINELS", self.service_name)
            if len(others) < sum(1 for s in self.sentinels if s.is_running) - 1:
                return f"sentinel {sentinel.port} knows {len(others)} other sentinels"
        return None

    def wait_sentinels_agree(self, master: RedisServer, timeout: float = 20.0) -> None:
        """Wait until every sentinel names ``master`` for the service, sees it up, knows
        every other running data node as a connected replica and (with several
        sentinels) knows the other sentinels."""
        self._wait_settled(lambda: self._disagreement(master), "sentinels not settled", timeout)

    def current_master_address(self) -> tuple[str, int]:
        """What the first running sentinel says the master is."""
        sentinel = next(s for s in self.sentinels if s.is_running)
        host, port = sentinel.command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service_name)
        return str(host), int(port)

    def current_master(self) -> RedisServer:
        _, port = self.current_master_address()
        return next(n for n in self.data_nodes if n.port == port)

    def kill_master_and_wait_failover(self, timeout: float = 30.0) -> RedisServer:
        """SIGKILL the current master; wait until the sentinels promote a replica which
        then reports role:master; returns the new master."""
        old = self.current_master()
        old.kill()

        def promoted() -> RedisServer | None:
            _, port = self.current_master_address()
            if port == old.port:
                return None
            new = next(n for n in self.data_nodes if n.port == port)
            return new if new.info("replication").get("role") == "master" else None

        new_master: RedisServer = wait_until(
            promoted,
            timeout=timeout,
            message=lambda: f"no failover away from {old.port}\n{self._logs(8)}",
        )
        # Until then redis-py's Sentinel.discover_master may still refuse the new master.
        self.wait_sentinels_agree(new_master, timeout)
        return new_master

    def sentinel_client(self, **kwargs: Any) -> redis.sentinel.Sentinel:
        """redis-py ``Sentinel`` over all sentinels (data-node password preset)."""
        from redis.sentinel import Sentinel

        options: dict[str, Any] = {"password": self.password}
        options.update(kwargs)
        return Sentinel(self.sentinel_addresses, **options)  # type: ignore[no-untyped-call]


def _pairs_from_slave_line(value: str) -> dict[str, str]:
    """``ip=127.0.0.1,port=1234,state=online,...`` -> dict."""
    return dict(part.split("=", 1) for part in value.split(",") if "=" in part)
