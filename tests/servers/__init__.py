"""Real Redis for the test-suite (single nodes, TLS, cluster, sentinel): the names the tests import."""

from tests.servers.cluster import ClusterNodeInfo, RedisCluster
from tests.servers.process import (
    HOST,
    RedisServer,
    RedisStartupError,
    free_port,
    free_ports,
    stop_all,
    wait_replicated,
    wait_until,
)
from tests.servers.resp import RespError, redis_command
from tests.servers.sentinel import SentinelServer, SentinelSetup
from tests.servers.tls import TLSFiles, TLSRedisServer, tls_files

__all__ = [
    "HOST",
    "ClusterNodeInfo",
    "RedisCluster",
    "RedisServer",
    "RedisStartupError",
    "RespError",
    "SentinelServer",
    "SentinelSetup",
    "TLSFiles",
    "TLSRedisServer",
    "free_port",
    "free_ports",
    "redis_command",
    "stop_all",
    "tls_files",
    "wait_replicated",
    "wait_until",
]
