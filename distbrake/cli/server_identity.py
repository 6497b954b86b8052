"""Which server `doctor` talks to, and in which mode, from what the server itself reports in INFO.

Redis-compatible servers copy Redis's INFO fields for compatibility, so
`redis_version` alone names no product: Valkey reports `redis_version:7.2.4`
(the Redis OSS version it is compatible with) next to its own
`server_name:valkey` and `valkey_version`, and from Valkey 8 its mode field is
`server_mode` (`redis_mode` only with `extended-redis-compatibility yes`).
Others (Dragonfly, KeyDB, managed services) add their own `<name>_version`
or nothing at all. The mode comes from `INFO cluster` (`cluster_enabled:1`)
and the mode field; a Sentinel process reports mode `sentinel`.

Some are named by their own field: Dragonfly (`dragonfly_version`), Garnet
(`garnet_version`), KeyDB (`keydb_version`, or an `executable` keydb-server),
Upstash (`upstash_version` or `server_name:upstash`); Amazon ElastiCache says
`os:Amazon ElastiCache`. Managed services whose INFO may say little are also
known by their endpoint's documented host name (`SERVICE_HOSTS`): Upstash
(`*.upstash.io`), ElastiCache Serverless (`*.serverless.*.cache.amazonaws.com`),
MemoryDB (`*.memorydb.*.amazonaws.com`). `CAVEATS` holds what `doctor` says of
each (Garnet runs no Lua unless started with `--lua`; the serverless services
are Clusters; Upstash gets its own script variant, see redis/script.py).

`identify_server` is pure: INFO replies in (redis-py's parsed dicts or the
raw text), a `ServerIdentity` out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CAVEATS", "SERVICE_HOSTS", "ServerIdentity", "identify_server", "info_fields", "lua_disabled",
           "service_of_host"]

# `<name>_version` fields of INFO server that name no server product.
_NOT_A_PRODUCT = frozenset({"redis", "gcc"})
_PRODUCT_VERSION = re.compile(r"^([a-z][a-z0-9]*)_version$")
#: Products named by a `<name>_version` field or `server_name` of INFO server.
_PRODUCTS = {"valkey": "Valkey", "dragonfly": "Dragonfly", "garnet": "Garnet", "keydb": "KeyDB", "upstash": "Upstash"}
#: Managed services by their endpoint's host name: (suffix, a part it must also hold, product). Documented forms:
#: `<db>.upstash.io`, `<cache>.serverless.<region>.cache.amazonaws.com`, `<cluster>.memorydb.<region>.amazonaws.com`.
SERVICE_HOSTS: tuple[tuple[str, str, str], ...] = (
    (".upstash.io", "", "Upstash"),
    (".cache.amazonaws.com", ".serverless.", "ElastiCache Serverless"),
    (".amazonaws.com", ".memorydb.", "MemoryDB"),
)
#: Products that are always a Cluster (a single-node URL cannot reach every slot).
CLUSTER_ONLY = frozenset({"ElastiCache Serverless", "MemoryDB"})
#: What `doctor` says of each product beyond Redis and Valkey (its "server notes" line).
CAVEATS = {
    "Upstash": "the brake sends its script with the shebang '#!lua flags=allow-key-locking', so a check locks only "
               "its session's key (Upstash runs any other script under a global lock)",
    "Garnet": "Garnet runs Lua only when started with --lua (EVALSHA is refused without it)",
    "Dragonfly": "known to work: the brake's script touches only the key it declares, as Dragonfly requires",
    "KeyDB": "known to work; with active replication (multi-master) two masters count a session apart until they "
             "sync: point one fleet at one master",
    "ElastiCache": "known to work (Redis or Valkey engine); every node must allow the brake's commands",
    "ElastiCache Serverless": "always a Cluster: use rediss+cluster://; it refuses a script without a key (the "
                              "brake, doctor and bench always send one)",
    "MemoryDB": "always a Cluster: use rediss+cluster://",
}
# Garnet's reply to EVAL, EVALSHA and SCRIPT when started without --lua.
_LUA_DISABLED = "lua scripting support disabled"

InfoReply = Mapping[str, object] | str


@dataclass(frozen=True)
class ServerIdentity:
    """One server as INFO describes it."""

    product: str  # "Redis", "Valkey", a product of _PRODUCTS or SERVICE_HOSTS, or "Redis-compatible"
    version: str  # the product's own version ("?" when INFO does not say)
    mode: str  # "single", "cluster" or "sentinel" (a Sentinel process, not a data node)
    detail: str = ""  # for "Redis-compatible": what INFO says, e.g. "dragonfly_version df-v1.25.2"
    redis_version: str = ""  # the Redis version it reports (for a fork: the one it is compatible with)

    @property
    def name(self) -> str:
        """E.g. "Valkey 8.0.2", "Redis 7.0.15", "Redis-compatible server (dragonfly_version ...)"."""
        if self.product == "Redis-compatible":
            return f"Redis-compatible server ({self.detail})"
        return f"{self.product} {self.version}"


def info_fields(reply: InfoReply | None) -> dict[str, str]:
    """An INFO reply as field -> text: redis-py's parsed dict, or the raw `name:value` lines."""
    if reply is None:
        return {}
    if isinstance(reply, Mapping):
        return {str(k): str(v) for k, v in reply.items()}
    fields: dict[str, str] = {}
    for raw in reply.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or ":" not in line:
            continue
        name, _, value = line.partition(":")
        fields[name] = value
    return fields


def service_of_host(host: str) -> str | None:
    """The managed service an endpoint's host name names (SERVICE_HOSTS), if any."""
    name = host.lower().rstrip(".")
    for suffix, part, product in SERVICE_HOSTS:
        if name.endswith(suffix) and part in name:
            return product
    return None


def lua_disabled(error: BaseException) -> bool:
    """True when the server refused a script because it runs no Lua (Garnet without --lua)."""
    return _LUA_DISABLED in str(error).lower()


def identify_server(server: InfoReply, cluster: InfoReply | None = None, host: str = "") -> ServerIdentity:
    """The product, version and mode a node reports: `server` is `INFO server`, `cluster` `INFO cluster`, `host`
    the URL's host name (for the managed services known by it).

    The product is the one INFO names (`server_name`, or a `<name>_version`
    field of _PRODUCTS, or ElastiCache's `os`), else the service the host
    names, else Redis when the reply names no other server and looks like
    Redis's own (`redis_version` with `redis_mode`, `run_id`, and an
    executable, if named, that is `redis-server`); else "Redis-compatible",
    with what INFO says.

    The mode is cluster when `INFO cluster` says `cluster_enabled:1`, the
    mode field (`server_mode`, else `redis_mode`) says `cluster`, or the
    product is always a Cluster; sentinel (a Sentinel process) when the mode
    field says so; else single.
    """
    fields = info_fields(server)
    cluster_fields = info_fields(cluster)
    service = service_of_host(host)
    mode_field = (fields.get("server_mode") or fields.get("redis_mode") or "").lower()
    if mode_field == "sentinel":
        mode = "sentinel"
    elif (cluster_fields.get("cluster_enabled", "0").strip() == "1" or mode_field == "cluster"
          or service in CLUSTER_ONLY):
        mode = "cluster"
    else:
        mode = "single"
    redis_version = fields.get("redis_version", "")
    others = {
        match.group(1): value for name, value in fields.items()
        if (match := _PRODUCT_VERSION.match(name)) and match.group(1) not in _NOT_A_PRODUCT
    }
    server_name = fields.get("server_name", "").strip().lower()
    executable = fields.get("executable", "").replace("\\", "/").rsplit("/", 1)[-1]
    named = server_name or next((name for name in sorted(others) if name in _PRODUCTS), "")
    if not named and executable.startswith("keydb-"):
        named = "keydb"
    if named in _PRODUCTS:
        version = others.get(named) or redis_version or "?"
        if named == "dragonfly":
            version = version.removeprefix("df-").removeprefix("v")
        return ServerIdentity(_PRODUCTS[named], version, mode, "", redis_version)
    if server_name and (server_name != "redis" or others):
        version = others.get(server_name) or redis_version or "?"
        own = f", {server_name}_version {version}" if server_name in others else ""
        return ServerIdentity("Redis-compatible", version, mode, f"server_name {server_name}{own}"
                              + (f", redis_version {redis_version}" if redis_version else ""),
                              redis_version)
    if others:
        name, version = sorted(others.items())[0]
        return ServerIdentity("Redis-compatible", version, mode, f"{name}_version {version}"
                              + (f", redis_version {redis_version}" if redis_version else ""),
                              redis_version)
    if fields.get("os", "").strip().lower().startswith("amazon elasticache"):
        return ServerIdentity(service or "ElastiCache", redis_version or "?", mode, "", redis_version)
    if service is not None:
        return ServerIdentity(service, redis_version or "?", mode, "", redis_version)
    looks_like_redis = (
        bool(redis_version) and "redis_mode" in fields and "run_id" in fields
        and (not executable or executable.startswith("redis-"))
    )
    if looks_like_redis:
        return ServerIdentity("Redis", redis_version, mode, "", redis_version)
    said = f"redis_version {redis_version}" if redis_version else "no version in INFO"
    if executable:
        said += f", executable {executable}"
    return ServerIdentity("Redis-compatible", redis_version or "?", mode, said, redis_version)
