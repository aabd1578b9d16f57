"""Deterministic simulation of the Raft core: ``python -m doq.sim --seeds A:B``.

See docs/raft.md. ``doq.sim.harness.Cluster`` is the synchronous cluster used by the
scenario tests; ``doq.sim.runner`` is the seeded fault-injecting simulation.
"""
