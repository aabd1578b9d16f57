"""Deterministic simulation of the Raft core: ``python -m tools.sim --seeds A:B``.

See docs/raft.md. ``tools.sim.harness.Cluster`` is the synchronous cluster used by the
scenario tests; ``tools.sim.runner`` is the seeded fault-injecting simulation.
"""
