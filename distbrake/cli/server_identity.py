"""Which server `doctor` talks to, and in which mode, from what the server itself reports in INFO.

Redis-compatible servers copy Redis's INFO fields for compatibility, so
`redis_version` alone names no product: Valkey reports `redis_version:7.2.4`
(the Redis OSS version it is compatible with) next to its own
`server_name:valkey` and `valkey_version`, and from Valkey 8 its mode field is
`server_mode` (`redis_mode` only with `extended-redis-compatibility yes`).
Others (Dragonfly, KeyDB, managed services) add their own `<name>_version`
or nothing at all. The mode comes from `INFO cluster` (`cluster_enabled:1`)
and the mode field; a Sentinel process reports mode `sentinel`.

`identify_server` is pure: INFO replies in (redis-py's parsed dicts or the
raw text), a `ServerIdentity` out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ServerIdentity", "identify_server", "info_fields"]

# `<name>_version` fields of INFO server that name no server product.
_NOT_A_PRODUCT = frozenset({"redis", "gcc"})
_PRODUCT_VERSION = re.compile(r"^([a-z][a-z0-9]*)_version$")

InfoReply = Mapping[str, object] | str


@dataclass(frozen=True)
class ServerIdentity:
    """One server as INFO describes it."""

    product: str  # "Redis", "Valkey", or "Redis-compatible"
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


def identify_server(server: InfoReply, cluster: InfoReply | None = None) -> ServerIdentity:
    """The product, version and mode a node reports: `server` is `INFO server`, `cluster` `INFO cluster`.

    The product is Valkey when `server_name` says so; Redis when the reply
    names no other server (no `server_name` but redis, no other
    `<name>_version` such as `dragonfly_version`) and looks like Redis's own
    (`redis_version` with `redis_mode`, `run_id`, and an executable, if named,
    that is `redis-server`); else "Redis-compatible", with what INFO says.

    The mode is cluster when `INFO cluster` says `cluster_enabled:1` or the
    mode field (`server_mode`, else `redis_mode`) says `cluster`; sentinel (a
    Sentinel process) when the mode field says so; else single.
    """
    fields = info_fields(server)
    cluster_fields = info_fields(cluster)
    mode_field = (fields.get("server_mode") or fields.get("redis_mode") or "").lower()
    if mode_field == "sentinel":
        mode = "sentinel"
    elif cluster_fields.get("cluster_enabled", "0").strip() == "1" or mode_field == "cluster":
        mode = "cluster"
    else:
        mode = "single"
    redis_version = fields.get("redis_version", "")
    others = {
        match.group(1): value for name, value in fields.items()
        if (match := _PRODUCT_VERSION.match(name)) and match.group(1) not in _NOT_A_PRODUCT
    }
    server_name = fields.get("server_name", "").strip().lower()
    if server_name == "valkey" or (not server_name and set(others) == {"valkey"}):
        return ServerIdentity("Valkey", others.get("valkey") or redis_version or "?", mode, "",
                              redis_version)
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
    executable = fields.get("executable", "").replace("\\", "/").rsplit("/", 1)[-1]
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
