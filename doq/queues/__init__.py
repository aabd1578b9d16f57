"""The pure replicated queue state machine: commands, indexes, leases, dead-lettering (no I/O, no clock)."""
