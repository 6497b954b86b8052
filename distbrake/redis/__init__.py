"""The Redis backend: the brakes whose streaks live in Redis (any Redis-protocol server, `memory://` too).

    wire.py     keys, ARGV, replies and RESP packing of the one script, `lua/brake.lua` (no I/O)
    base.py     `DistributedBase`, the non-I/O half the sync and asyncio brakes share
    sync.py     `DistributedBrake`, the sync brake: it only sends and receives
    aio.py      `AsyncDistributedBrake`, the asyncio brake: it only sends and receives
    connect.py  a parsed backend URL -> a redis-py (or fakeredis) client
    topology.py a Cluster changing under a command: redis-py's internal errors as backend errors, one retry
    acl.py      the Redis commands and ACL rules the script needs (what `doctor` checks)

Import the brakes from `distbrake`; the modules here are internal.
"""
