"""The team's ratio-to-floor benchmark suite: not shipped in the wheel, not collected by pytest.

Run it from a clone (a full run takes several minutes; `--quick` seconds):

    python -m tests.benchmarks --url redis://127.0.0.1:6379/0 [--cluster-url redis+cluster://...] [--pin-cpu]

Every figure is a ratio to its floor, the cheapest thing that could do the
same job on the same machine and server, measured in the same run:

* `local`: a figure and how it is timed; the in-process and start-up figures;
* `server`: sync latency, the rules' cost, async throughput, memory per session;
* `raw` (on `floors`: a raw socket, CPU pinning, a pipelined load): the
  raw-socket floors and the server's CPU per check;
* `aio`: the asyncio figures; `cluster`: Cluster against a single node;
  `telemetry`: OpenTelemetry on against off;
* `suite`: every figure in turn and its target; `__main__`: the command.

Users measure their own deployment, in absolute terms, with `distbrake bench`.

Targets and the last full run. Each target is a ratio to a floor, both
measured in one run, interleaved, median of >= 5 rounds; a miss prints FAIL
and exits 5. Its logic is tested by `tests/test_benchmarks.py`; the suite is
not run by `python -m pytest`. Options: `--quick` for a small run, `--only
FIGURE`, `--target FIGURE=BOUND`, `--json`; `--help` lists every figure.

The last full run (issue 29; `python -m tests.benchmarks --url
redis://127.0.0.1:7411 --cluster-url redis+cluster://127.0.0.1:7501
--pin-cpu`, a 2-vCPU Intel Xeon VM otherwise idle, Redis 7.0.15, Python
3.11.7, redis-py 8.1 with hiredis; the servers unpinned, the two `--pin-cpu`
figures with client and server on one CPU). Each figure (ours / floor), its
target, and that run:

* sync check, small arguments / redis-py `EVALSHA return 1`: <= 1.2x; 0.91x
  (92.7 / 102 µs)
* the same / a raw socket writing pre-encoded `EVALSHA <sha of return 1> 0`,
  hiredis reply (`--pin-cpu`): <= 1.6x; 1.96x (18.1 / 9.24 µs; rounds
  1.94-1.98). Missed: see the next figure
* the same / the same checks' bytes, encoded beforehand, written by that raw
  socket (the script alone, no client work; `sync_check_wire`, issue 29):
  <= 1.3x; 1.50x (18.5 / 12.4 µs; rounds 1.48-1.52), from about 1.61x before
  issue 29's client work (a per-brake encoder, the float hint's byte test,
  one thread-local look-up, a per-connection exchange). Missed: what is left
  is the client's own work, about 6 µs of hashing, encoding, judging and the
  verdict a raw socket does not do (callgrind: ~46k instructions per check
  with the round trip mocked, from 62k). Its note now measures, interleaved
  with the floor in the same run, the least a Python client of this script
  does: the call hashed and packed by the brake's own code, sent by the raw
  socket. Later, on a busier AMD EPYC VM (client and server on one CPU, so the
  script's own time counts too): 1.46x at the start of the last issue 29
  session, then 1.33x, 1.35x (34.5 / 25.6 µs) after the script's server work
  shrank (below), its least client 1.21x, 1.23x in the same runs: of the 0.3x
  the target allows, hashing and packing take 0.2x; the session, the failure
  policy, the send, the reply, the judgement and the verdict take the rest
  (about 4 µs; the send alone 1.2 µs more than the raw socket's, measured
  apart)
* sync check with `warn_at` + shadow mode; with cycles (4 x 3); a progress
  tool's check + observe / rules off: <= 1.1x; 1.2x; 2.2x; 1.00x; 1.04x; 2.04x
* sync check of a brake reading the fleet's kill switch in the background /
  none (`kill_switch_cost`, issue 24): <= 1.1x; 0.99x
* sync check of a once-only tool's new call (sessions of 8) with `halt_at`
  on / rules off (`rules_ladder`, issue 24; a later run of the rules figures
  on another machine of this kind): <= 1.1x; 1.06x, and 1.10x, 1.11x with
  client and server on one CPU, where the code before ARGV[LADDER] became
  bytes and a once-only call's time ARGV[NOW] measured 1.20x, 1.22x in the
  same runs; its note, same rounds: a once-only tool's session at its 64
  calls 1.11x (pinned 1.25x-1.29x, before 1.35x-1.37x), another tool's
  check with the ladder on 1.02x (pinned 1.03x, before 1.08x-1.09x)
* async, 64 tasks / redis.asyncio `EVALSHA return 1` from 64 tasks,
  unpipelined; in pipelines of 64, one in flight: >= 2x; 1x; 4.89x; 1.23x
* async, 1 task / 1 task's unpipelined `EVALSHA return 1`; 4096 tasks / 64
  tasks: >= 1x; 0.9x; 1.05x; 0.85x (Python's cyclic GC at 4096 tasks: the
  README's Deployment section has the tuning that removes it)
* Cluster (3 masters) / single node: async, 64 tasks; sync, 8 threads (issue
  29): >= 0.9x; 0.87x, 0.86x, 0.87x in three runs of the figure alone,
  alternating with the code before this change at 0.64x, 0.65x, 0.62x (each
  master's checks answered as soon as that master replies, the masters'
  replies read as they come, where a batch used to answer every check when
  its slowest master had replied, read in turn); sync 0.92x (0.80x, 1.06x).
  The asyncio figure is now bounded by this machine: its two CPUs run the
  client and every server, and a Cluster check costs more CPU on both sides
  (the figure's note, same rounds: 11.7 µs client + 6.2 µs over the three
  masters against 10.2 + 5.0 µs on the single node), so a wholly CPU-bound
  Cluster reaches about 0.85x here, and it does. Earlier issue 29 changes
  (no halving of a Cluster batch between two lanes, a key's slot
  remembered) took the client's CPU per Cluster check from 16.8-17.7 µs to
  14.3-15.2 µs and the masters' from 8.6-9.1 µs to 7.6-8.5 µs (a loaded
  machine, interleaved with the code before). On a busier AMD EPYC VM, three
  runs: async 0.82x, 0.70x, 0.85x, each at the CPU-bound ceiling its note
  gives (client + servers per check, single node over Cluster: 0.83x, 0.75x,
  0.85x); sync 0.71x, 0.67x, 0.62x, and 0.44x-0.91x in runs of the figure
  alone alternating with the code before the last issue 29 session
  (0.55x-0.91x): on that VM the sync figure moves more between runs than any
  change moves it
* Redis memory per session (`used_memory` growth, 20,000 UUID sessions,
  clients closed): node; Cluster: <= 240; 265 B; 233; 242 B
* `LoopBrake.check` / sha256 of `json.dumps(args, sort_keys=True)`;
  `call_hash` of 1 MB / `json.dumps` + sha256: <= 1.5x; 0.5x; 1.32x; 0.32x
* CPU time: `import distbrake` / `import redis, pydantic_settings`;
  `--version`, `--help` / `import click`: <= 1.1x; 2x; 0.11x; 1.40x
* server cost per check, realistic path (below) / `EVALSHA return 1`: >= 0.3x;
  0.26x, where the bare record script reaches 0.32x: the floor is mostly the
  record's own commands
* the same, by the scripts' own time (INFO commandstats, as issue 29
  measures it), / the same checks sent to a bare record script (HGET, an
  HSET of h, s and j, PEXPIRE: no logic; `server_record`, issue 29): >= 0.8x.
  Measured all in (INFO used_cpu_*) it was 0.81x (ours 5.75 µs, bare 4.67 µs,
  `return 1` 1.50 µs), from 0.72-0.76x before issue 29 (a streak that goes on
  writes one field, h, which now keeps what it was judged by; the count read
  byte by byte; no denial bit); the all-in ratio is now in the figure's note.
  By the scripts' own time, on a busier AMD EPYC VM, three runs: 0.77x, 0.72x,
  0.77x (ours 4.90-5.55 µs, bare 3.79-4.30 µs, `return 1` 0.69-1.06 µs; all in
  0.75x-0.81x), where the script before the last issue 29 session measured
  0.69x in alternating rounds of one run (callgrind, the script's own
  instructions per check: 43.4k, from 49.1k; the bare script 34.1k: 0.785x).
  That session's changes: the contract block's ~60 locals folded into the code
  when the script is loaded (Redis runs the whole body for every check), the
  count read by one string.byte and written by string.char, `string` and
  `ARGV` read as locals. Missed: what is left is the logic itself, about 170
  Lua instructions and nine calls of string functions against the bare
  script's 30 instructions, each instruction ~50 machine instructions and
  each call ~400 on Redis 7.0's Lua 5.1
* OpenTelemetry on (SDK, in-memory reader) / off: sync check; async, 64 tasks:
  <= 1.1x; 1.02x; 1.37x (an SDK histogram sample costs 2-3.6 µs against a
  check of ~10 µs at 64 tasks)

Reproduce: `redis-server --port 7411 --save "" --daemonize yes`, a 3-master
cluster, then the command above (ratios move 0.1x-0.3x between runs on a
shared 2-vCPU VM; the Cluster ones most). `--pin-cpu` puts the bench and a
local server on one CPU for the two raw-socket figures, a busy machine
reproduced steadily (idle, CPU wake-ups dominate). Server cost: our own load
of pre-encoded checks continuing the streaks of 10,000 UUID sessions, each
with a fresh call id, 16 per write on 4 connections, the server's CPU read
from INFO before and after each load, the loads in turn.

Coding-agent entry points (`tests/benchmarks/`, outside the wheel): `python -m
tests.benchmarks.hook_startup` times `distbrake hook claude-code` on a small
event against `python -c "import click"` in the same run (fresh processes,
interleaved, medians; target <= 1.5x wall): 1.25x-1.49x wall across runs on
the shared 2-vCPU VM (1.44x CPU time), most of the difference being `import
logging` and orjson's own imports, which every distbrake process pays; with
any `DISTBRAKE_*` setting the hook takes the full path (pydantic settings) at
~5x. `python -m tests.benchmarks.serve_load` drives `POST /v1/check` with 16
keep-alive clients on loopback against the same uvicorn + Starlette stack
answering a constant JSON body (target >= 0.5x): 0.50x-0.73x on the streak
file (p99 13-17 ms against 10-15 ms for the constant body, the client sharing
the 2 vCPUs), 0.50x-0.62x on a local Redis (`--url`).
"""
