"""`doq.storage.env.open_db` while a writer holds the environment's write lock.

py-lmdb waits for that lock without releasing the GIL, so opening a database through a
write transaction while another thread writes deadlocks the whole process (a test that
built a storage gauge on a running node hung this way). The check runs in a child
process, so a deadlock fails the test by its timeout instead of hanging the suite."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = textwrap.dedent("""
    import sys, threading
    from doq.storage.env import DB_NAMES, open_db, open_env
    env = open_env(sys.argv[1])
    for name in DB_NAMES:  # a new data dir: created
        open_db(env, name)
    held, release = threading.Event(), threading.Event()

    def writer():
        with env.begin(write=True):
            held.set()
            release.wait(60)

    t = threading.Thread(target=writer)
    t.start()
    held.wait()
    dbs = [open_db(env, name) for name in DB_NAMES]  # existing ones, while the writer holds the lock
    release.set()
    t.join()
    print(len(dbs))
""")


def test_existing_databases_open_while_another_thread_writes(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "doq.lmdb")], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr
    from doq.storage.env import DB_NAMES

    assert proc.stdout.strip() == str(len(DB_NAMES))
