"""The Redis backend: the brakes whose streaks live in Redis (any Redis-protocol server, `memory://` too).

    contract.py    the wire contract by name: record fields and byte ranges, ARGV slots, modes, reply codes
                   (its twin is the block of constants at the top of `lua/brake.lua`)
    wire.py        keys, ARGV, replies and RESP packing of the one script, `lua/brake.lua` (no I/O)
    script.py      the script as an object per brake: text, SHA, server variant, load-and-resend on NOSCRIPT
    connect.py     the connectors per backend kind: a parsed backend URL -> a redis-py (or fakeredis) client
    base.py        `DistributedBase`, the non-I/O half the sync and asyncio brakes share
    sync.py        `DistributedBrake`, the sync brake: it only sends and receives
    aio.py         `AsyncDistributedBrake`, the asyncio brake's I/O shell: it only sends and receives
    batcher.py     the asyncio brake's batcher: concurrent checks coalesced into pipelines, on lanes
    aio_cluster.py the batcher's Redis Cluster path: a batch routed by slot, one pipeline per master
    batch.py       a batch written and its replies read at once (redis-py's connections, hiredis' reader)
    deadline.py    the asyncio brake's deadlines, one timer per timeout
    topology.py    a Cluster changing under a command: the one redirect rule, redis-py's internal errors
    acl.py         the Redis commands and ACL rules the script needs (what `doctor` checks)

What a Redis error means (outage, configuration, one record, the script) is `distbrake/redis_errors.py`'s
to say. Import the brakes from `distbrake`; the modules here are internal.
"""
