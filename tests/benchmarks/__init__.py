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
"""
