"""A restart's rebuild reads every record, and the data file's pages it mapped are not
left charged to the process (`doq.storage.mapped`, `StateStore.rebuild`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from doq.queues import commands as c
from doq.queues import keys as K
from doq.queues.codec import encode_batch
from doq.queues.model import QueueSettings
from doq.storage.env import open_env
from doq.storage.mapped import mapped_ranges, release_mapped_pages
from doq.storage.state import StateStore

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps: Linux")
NOW_MS = 1_700_000_000_000
MESSAGES = 40_000


def _mapped_rss_bytes(path: Path) -> int:
    """The RSS of this process's maps of the file `path` (/proc/self/smaps)."""
    ranges = {f"{a:x}-{b:x}" for a, b in mapped_ranges(path)}
    assert ranges, "the data file is not mapped"
    total = 0
    inside = False
    with open("/proc/self/smaps", encoding="utf-8") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                inside = head in ranges
            elif inside and head == "Rss:":
                total += int(line.split()[1]) * 1024
    return total


def _fill(path: Path) -> None:
    st = StateStore(open_env(path, map_size=1 << 28))
    ents = [(1, encode_batch(c.CommandBatch(NOW_MS, [c.CreateQueue("q", "delayed", QueueSettings())])))]
    for i in range(MESSAGES // 1000):
        prios = [(j * 7919) % 100_000 for j in range(i * 1000, (i + 1) * 1000)]
        ents.append((i + 2, encode_batch(c.CommandBatch(NOW_MS, [c.EnqueueColumns("q", [b"x" * 100] * 1000, priorities=prios)]))))
    with st.write() as txn:
        st.apply_entries(txn, ents)
    st.env.close()


def test_a_rebuild_leaves_the_data_files_pages_out_of_the_process_rss(tmp_path: Path) -> None:
    _fill(tmp_path / "s")
    data = tmp_path / "s" / "data.mdb"
    size = data.stat().st_size
    assert size > 4 << 20
    st = StateStore(open_env(tmp_path / "s", map_size=1 << 28))  # the rebuild reads every record
    assert st.machine.queues["q"].index.n_ready == MESSAGES
    after_rebuild = _mapped_rss_bytes(data)
    with st.env.begin() as txn:  # what the rebuild touched, read again: mapped now
        n = sum(1 for _ in txn.cursor(db=st._kind_db[K.MESSAGE]).iternext())  # noqa: SLF001
    assert n == MESSAGES
    read_again = _mapped_rss_bytes(data)
    assert read_again > size // 2, (read_again, size)
    assert after_rebuild < size // 10, (after_rebuild, size)
    assert release_mapped_pages(data) > 0
    assert _mapped_rss_bytes(data) < size // 10
    with st.env.begin() as txn:  # the pages come back from the page cache as they were
        assert sum(1 for _ in txn.cursor(db=st._kind_db[K.MESSAGE]).iternext()) == MESSAGES  # noqa: SLF001
    assert st.get_message("q", MESSAGES).id == MESSAGES
    st.env.close()


def test_release_of_a_file_not_mapped_does_nothing(tmp_path: Path) -> None:
    f = tmp_path / "plain"
    f.write_bytes(b"x" * 4096)
    assert mapped_ranges(f) == []
    assert release_mapped_pages(f) == 0
    assert release_mapped_pages(tmp_path / "missing") == 0
    assert os.path.exists(f)


def test_a_rebuild_asks_for_the_data_files_used_part_in_file_order_from_a_thread(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the load reads every record, the used part of the data file (up to LMDB's
    last page) is advised WILLNEED chunk by chunk in file order, off the loading thread;
    the rebuild's state is the same."""
    import threading

    from doq.storage import mapped

    _fill(tmp_path / "s")
    data = tmp_path / "s" / "data.mdb"
    calls: list[tuple[str, int, int, int, str]] = []
    real = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length, advice, threading.current_thread().name))
        real(fd, offset, length, advice)

    monkeypatch.setattr(mapped, "PREFETCH_CHUNK_BYTES", 1 << 20)
    monkeypatch.setattr(os, "posix_fadvise", spy)
    st = StateStore(open_env(tmp_path / "s", map_size=1 << 28))
    used = (st.env.info()["last_pgno"] + 1) * st.env.stat()["psize"]
    assert used > 4 << 20
    assert calls  # (the load may end before the last chunks are asked for: the prefetch stops then)
    assert {(p, a) for p, _, _, a, _ in calls} == {(str(data.resolve()), os.POSIX_FADV_WILLNEED)}
    assert [(o, n) for _, o, n, _, _ in calls] == [(o, min(1 << 20, used - o)) for o in range(0, used, 1 << 20)][:len(calls)]
    assert threading.main_thread().name not in {t for *_, t in calls}
    assert st.machine.queues["q"].index.n_ready == MESSAGES
    assert [t for t in threading.enumerate() if t.name == "doq-prefetch"] == []  # stopped
    calls.clear()
    pf = mapped.prefetch_file(data, used)  # left to run: the whole used part, in file order
    assert pf is not None
    pf.thread.join()
    assert [(o, n) for _, o, n, _, _ in calls] == [(o, min(1 << 20, used - o)) for o in range(0, used, 1 << 20)]
    monkeypatch.setattr(os, "posix_fadvise", real)
    calls.clear()
    with st.write() as txn:  # a rebuild inside a write reads what it needs only
        st.rebuild(txn)
    assert calls == []
    st.env.close()


def test_prefetch_of_a_missing_or_empty_file_does_nothing(tmp_path: Path) -> None:
    from doq.storage.mapped import prefetch_file

    assert prefetch_file(tmp_path / "plain", 0) is None
    pf = prefetch_file(tmp_path / "missing", 1 << 20)
    assert pf is not None
    pf.stop()
    assert not (tmp_path / "missing").exists()


def test_messages_made_ready_by_a_late_tick_leave_their_pages_out_of_the_process_rss(tmp_path: Path) -> None:
    """The first tick after a long stop makes every message whose time came meanwhile ready,
    reading each record (its priority) at a random place of the file: once that many were
    read, the commit lets go of the pages they mapped (`RELEASE_AFTER_DUE_READS`), as the
    rebuild does. The messages are ready in order; a few due at once keep their pages."""
    from doq.storage import state as S

    path = tmp_path / "s"
    st = StateStore(open_env(path, map_size=1 << 28))
    ents = [(1, encode_batch(c.CommandBatch(NOW_MS, [c.CreateQueue("q", "delayed", QueueSettings())])))]
    for i in range(MESSAGES // 1000):  # timestamp priorities (s), all after NOW_MS, spread
        prios = [NOW_MS // 1000 + 1 + (j * 7919) % 100_000 for j in range(i * 1000, (i + 1) * 1000)]
        ents.append((i + 2, encode_batch(c.CommandBatch(NOW_MS, [c.EnqueueColumns("q", [b"x" * 100] * 1000, priorities=prios)]))))
    with st.write() as txn:
        st.apply_entries(txn, ents)
    st.env.close()
    data = path / "data.mdb"
    size = data.stat().st_size
    assert size > 4 << 20 and MESSAGES > S.RELEASE_AFTER_DUE_READS
    st = StateStore(open_env(path, map_size=1 << 28))
    q = st.machine.queues["q"]
    assert q.index.n_ready == 0 and len(q.delayed) == MESSAGES
    assert _mapped_rss_bytes(data) < size // 10
    index = len(ents) + 1
    few_at = NOW_MS + 1000 * 2_000  # the messages due within 2000 s: a few, kept mapped
    few = sum(1 for a, _ in q.delayed if a <= few_at)
    assert 0 < few < S.RELEASE_AFTER_DUE_READS
    with st.write() as txn:
        st.apply_entries(txn, [(index, encode_batch(c.CommandBatch(few_at, [c.Tick()])))])
    assert q.index.n_ready == few and _mapped_rss_bytes(data) > 0
    want = sorted((a // 1000, i) for a, i in q.delayed)
    with st.write() as txn:  # every message due: read one by one
        st.apply_entries(txn, [(index + 1, encode_batch(c.CommandBatch(NOW_MS + 200_000_000, [c.Tick()])))])
    assert not q.delayed and q.index.n_ready == MESSAGES
    assert _mapped_rss_bytes(data) < size // 10, (_mapped_rss_bytes(data), size)
    got = list(q.index.ready)
    assert got[few:] == want and got == sorted(got)
    st.env.close()
