"""Tools of the doq project that are not part of the installed `doq` package: the chaos
tester (`python -m tools.chaos`, real processes killed and paused under load) and the
Raft simulator (`python -m tools.sim`, the pure core under a faulty network). Run them
from a checkout."""
