"""Chaos testing of real doq processes, in the style of Jepsen: ``python -m tools.chaos``.

- `tools.chaos.checker`: the pure checker (history in, anomalies out);
- `tools.chaos.procs`: `doq serve` processes on 127.0.0.1 (start, kill -9, SIGSTOP/SIGCONT);
- `tools.chaos.workload`: producers and consumers over the Python client that survive
  faults and record a history, and the final drain;
- `tools.chaos.nemesis`: the faults (kill -9 of the leader or a follower, pauses);
- `tools.chaos.runner`: one run end to end, its one-line JSON summary and exit code.
"""
