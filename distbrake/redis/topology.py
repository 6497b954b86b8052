"""A Redis Cluster changing under a command: redis-py's internal errors are the backend failing.

While slots move (a reshard, an ASK redirect to a node added since the
client last read the slot map) or masters fail over, redis-py's cluster
client can fail with its own internal errors instead of a Redis error:
`AttributeError: 'NoneType' object has no attribute 'redis_connection'` (an
ASK to a node it does not know), `... 'connection_kwargs'`, `... 'writelines'`
(a connection closed under a command by a concurrent topology refresh). Such
an error is the backend failing, not a bug of the brake: the cluster paths of
the brakes send the command once more after the slot map is read again
(`refresh_topology`), and a second failure becomes `ClusterTopologyError`, a
`RedisClusterException`, so the failure policy decides. Only errors raised
inside redis-py's cluster client count (`is_topology_error`): the same error
raised by our own code still surfaces.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator
from typing import Any

import redis
import redis.exceptions
from redis.crc import key_slot

__all__ = [
    "CAREFUL",
    "CAREFUL_ERRORS",
    "INTERNAL_ERRORS",
    "REDIRECT_ERRORS",
    "RETRY",
    "UNROUTED",
    "ClusterTopologyError",
    "after_fast_path",
    "arefresh_topology",
    "is_topology_error",
    "refresh_topology",
    "retry_after",
    "slot_of",
    "topology_error",
]

logger = logging.getLogger("distbrake")

#: The internal errors redis-py's cluster client raises when the topology changes under a command.
INTERNAL_ERRORS: tuple[type[BaseException], ...] = (AttributeError, LookupError, TypeError)
#: Redirects redis-py gave up on (it follows them itself first): worth one more try after a refresh.
REDIRECT_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.MovedError,
    redis.exceptions.AskError,
    redis.exceptions.TryAgainError,
)

#: Errors of a command sent straight to a master (the brakes' fast cluster paths) that send it again the
#: careful way, through redis-py's cluster client: the cluster is down for now, the master has no script
#: (a promoted replica), or its connection was lost.
CAREFUL_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ClusterDownError,
    redis.exceptions.NoScriptError,
    redis.exceptions.ConnectionError,
)
#: A key the slot map cannot place right now (a slot not covered, a map being rebuilt): the careful way too.
UNROUTED: tuple[type[BaseException], ...] = (redis.exceptions.RedisClusterException, *INTERNAL_ERRORS)
RETRY, CAREFUL = "retry", "careful"
SLOTS_KNOWN = 8192  # keys whose hash slot is remembered (never stale), as many as wire.CACHED_CALLS

_REDIS_DIR = os.path.dirname(os.path.abspath(redis.__file__)) + os.sep
_CLUSTER_FILES = frozenset({
    os.path.join(_REDIS_DIR, "cluster.py"),
    os.path.join(_REDIS_DIR, "asyncio", "cluster.py"),
})
_OUR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# What a failed refresh may raise: it is only a hint for the retry, which reports the failure itself.
_REFRESH_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError, TimeoutError)


class ClusterTopologyError(redis.exceptions.RedisClusterException):
    """redis-py's cluster client failed inside itself, twice, while the cluster's topology changed."""


def _files(error: BaseException) -> Iterator[str]:
    tb = error.__traceback__
    while tb is not None:
        yield tb.tb_frame.f_code.co_filename
        tb = tb.tb_next


def is_topology_error(error: object) -> bool:
    """True for an internal error (AttributeError, KeyError, IndexError, TypeError) raised inside
    redis-py's cluster client: its traceback goes through redis-py's cluster module, and no frame
    of distbrake lies between redis-py and the place it was raised."""
    if not isinstance(error, INTERNAL_ERRORS):
        return False
    files = list(_files(error))
    start = next((i for i, name in enumerate(files) if name.startswith(_REDIS_DIR)), None)
    if start is None:
        return False
    inside = files[start:]
    return any(name in _CLUSTER_FILES for name in inside) and not any(
        name.startswith(_OUR_DIR) for name in inside
    )


def retry_after(error: object) -> bool:
    """Whether a cluster command that failed with `error` is worth one more try after a refresh."""
    return isinstance(error, REDIRECT_ERRORS) or is_topology_error(error)


def after_fast_path(error: object) -> str | None:
    """The one Cluster redirect rule of the sync and asyncio brakes: what to do with a command sent straight
    to its master (by the slot map) that failed with `error`.

    `RETRY`: a redirect (MOVED, ASK, TRYAGAIN) or a failure inside redis-py's cluster client: once more
    after the slot map is read again (then a second failure is the backend's); `CAREFUL`: sent again
    through redis-py's cluster client, which follows redirects itself (`CAREFUL_ERRORS`); None: the
    backend failing (a timeout, a refusal), for the failure policy.
    """
    if retry_after(error):
        return RETRY
    if isinstance(error, CAREFUL_ERRORS):
        return CAREFUL
    return None


@functools.lru_cache(maxsize=SLOTS_KNOWN)
def slot_of(key: str) -> int:
    """The hash slot of `key` (a session's key comes back check after check: computed once). Which master
    holds the slot is read from the client's slot map each time."""
    return int(key_slot(key.encode("utf-8")))


def topology_error(error: BaseException) -> ClusterTopologyError:
    """`error` (an internal error of redis-py's cluster client) as a backend error; chain it with `from`."""
    return ClusterTopologyError(
        f"the cluster's topology changed under the command: redis-py's cluster client failed "
        f"inside itself ({type(error).__name__}), also when sent again after a refresh"
    )


def refresh_topology(client: Any) -> None:
    """Read the cluster's slot map again (sync client), as redis-py does after a MOVED; failures are ignored."""
    initialize = getattr(getattr(client, "nodes_manager", None), "initialize", None)
    if callable(initialize):
        try:
            initialize()
        except _FAILED_REFRESH as error:
            _refresh_failed(error)


async def arefresh_topology(client: Any) -> None:
    """`refresh_topology` for redis.asyncio's cluster client."""
    initialize = getattr(getattr(client, "nodes_manager", None), "initialize", None)
    if callable(initialize):
        try:
            await initialize()
        except _FAILED_REFRESH as error:
            _refresh_failed(error)


_FAILED_REFRESH: tuple[type[BaseException], ...] = (*_REFRESH_ERRORS, *INTERNAL_ERRORS)


def _refresh_failed(error: BaseException) -> None:
    """A refresh that failed is ignored (logged at DEBUG), unless it is our own bug, not the cluster's."""
    if not isinstance(error, _REFRESH_ERRORS) and not is_topology_error(error):
        raise error
    logger.debug("distbrake: refreshing the cluster's slot map failed (%s)", type(error).__name__)


