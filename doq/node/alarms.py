"""Storage alarms: a node that runs short of space refuses writes that grow its state.

Like RabbitMQ's disk alarm and etcd's NOSPACE: past a limit the node refuses the commands
that grow the state (`grows_state`) with `StorageFull` (RESOURCE_EXHAUSTED / HTTP 507,
retryable), keeps taking the ones that shrink it (dequeues, acks, nacks, deletes,
purges: `SHRINKING_COMMANDS`), and lifts the alarm by itself once space is back.

Three alarms, each with a stable reason:
- `DATA_SIZE_LIMIT`: the pages the store's trees use (state and Raft log, measured in
  each write transaction) reached `--max-data-size`. The LMDB map is that plus a reserve
  (`reserve_bytes`: a quarter of the limit, 1 MiB..1 GiB) that only writes taken while
  the alarm is on may use: LMDB copies pages even to delete, so a full map could not
  even shrink.
- `DISK_FREE_LIMIT`: the file system of the data dir has less than `--disk-free-limit`
  free (checked after every write, and on a timer at most every `disk_check_s`).
- `NOSPACE`: a write failed for want of space (ENOSPC, EDQUOT, or the map full even with
  its reserve). Nothing of it was applied (the Raft log entries and the state change are
  one LMDB transaction); the node retries it until it succeeds, which lifts this alarm.

`StorageGauge` is the node's own measure; the methods that measure run on the thread of
the node's LMDB writes (its apply thread), `alarms` (an immutable tuple replaced whole) is
read from any thread. Every write measures inside its transaction; one that changed only
the `raft_*` tables re-reads those alone and keeps the other tables' pages from the last
measure, which is whole because every write that applies entries or installs a snapshot
re-reads all of them, and a failed write makes the next measure whole.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import lmdb

from doq.errors import StorageFull
from doq.node.cluster import StorageUsage
from doq.queues.commands import (
    Ack,
    CancelRedrive,
    Command,
    DeleteMessage,
    DeleteQueue,
    Dequeue,
    Nack,
    PurgeQueue,
    RestoreAbort,
    Tick,
    Touch,
    UpdatePriority,
)
from doq.storage.env import DB_NAMES, open_db
from doq.units import format_size

DATA_SIZE_LIMIT = "DATA_SIZE_LIMIT"
DISK_FREE_LIMIT = "DISK_FREE_LIMIT"
NOSPACE = "NOSPACE"
MIN_RESERVE_BYTES = 1 << 20
MAX_RESERVE_BYTES = 1 << 30
_NOSPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
RETRY_FREE_BYTES = 1 << 20  # free disk after which a write that failed for want of space is tried again

SHRINKING_COMMANDS: tuple[type, ...] = (
    DeleteQueue, PurgeQueue, Dequeue, Ack, Nack, Touch, UpdatePriority, DeleteMessage, Tick,
    RestoreAbort, CancelRedrive,
)
"""Commands taken while an alarm is on. They free records or rewrite one in place (a
lease, a priority, a redrive's state: a cancel); each costs a small Raft log entry until the log is compacted, which
the node does at once while an alarm is on. Every other command (create, update, enqueue,
restore chunks, keys...) grows the state and is refused."""


def grows_state(command: Command) -> bool:
    """Is `command` refused while a storage alarm is on?"""
    return not isinstance(command, SHRINKING_COMMANDS)


def reserve_bytes(max_data_bytes: int) -> int:
    """The map's room past `max_data_bytes`, for writes taken under an alarm."""
    return max(MIN_RESERVE_BYTES, min(MAX_RESERVE_BYTES, max_data_bytes // 4))


def map_size(max_data_bytes: int) -> int:
    """The LMDB map size for a store of at most `max_data_bytes`."""
    return max_data_bytes + reserve_bytes(max_data_bytes)


def is_out_of_space(err: BaseException) -> bool:
    """Did a write fail for want of space (map full, disk full, quota)?"""
    if isinstance(err, lmdb.MapFullError):
        return True
    if isinstance(err, OSError) and err.errno in _NOSPACE_ERRNOS:
        return True
    # py-lmdb raises its generic Error for an errno from mdb_txn_commit: "...: No space left"
    text = str(err)
    return isinstance(err, lmdb.Error) and any(os.strerror(n) in text for n in _NOSPACE_ERRNOS)


@dataclass(frozen=True, slots=True)
class Alarm:
    """An alarm on one node: `reason` (stable), `message` (for operators)."""

    node_id: str
    reason: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"node_id": self.node_id, "reason": self.reason, "message": self.message}


def refusal(alarms: Sequence[Alarm]) -> StorageFull:
    """The error a write that grows the state gets while `alarms` are on."""
    first = alarms[0]
    more = f" (and {len(alarms) - 1} more)" if len(alarms) > 1 else ""
    return StorageFull(
        f"node {first.node_id} is short of space: {first.message}{more}; writes that grow the "
        "state are refused until space is freed (dequeues, acks and deletes still work)",
        reason=first.reason)


class StorageGauge:
    """Measures one node's store and keeps its alarms (see the module docstring)."""

    def __init__(
        self,
        env: lmdb.Environment,
        path: str | os.PathLike[str],
        *,
        node_id: str,
        max_data_bytes: int,
        disk_free_limit_bytes: int,
        disk_check_s: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
        statvfs: Callable[[str], os.statvfs_result] = os.statvfs,
    ) -> None:
        self.node_id = node_id
        self.path = os.fspath(path)
        self.max_data_bytes = max_data_bytes
        self.reserve_bytes = reserve_bytes(max_data_bytes)
        self.clear_margin_bytes = max(64 << 10, max_data_bytes // 64)
        self.disk_free_limit_bytes = disk_free_limit_bytes
        self.disk_check_s = disk_check_s
        self._clock = clock
        self._statvfs = statvfs
        self._dbs = [open_db(env, name) for name in DB_NAMES]
        self._log_index = DB_NAMES.index(b"raft_log")
        self._raft_dbs = frozenset(i for i, name in enumerate(DB_NAMES) if name.startswith(b"raft_"))
        self._pages = [0] * len(DB_NAMES)  # each table's pages at the last `measure`
        self._measured = False
        self._page_bytes = int(env.stat()["psize"])
        self.used_bytes = 0
        self.log_bytes = 0
        self.disk_free_bytes: int | None = None
        self._next_disk_check = 0.0
        self._data_full = False
        self._disk_low = False
        self._nospace: str | None = None
        self._free_at_failure: int | None = None
        self.alarms: tuple[Alarm, ...] = ()

    # -- the LMDB writes' thread -----------------------------------------------------------
    def measure(self, txn: lmdb.Transaction, *, log_bytes: int | None = None,
                state_changed: bool = True) -> None:
        """In a write transaction, before its commit: the pages the trees use, plus
        `log_bytes` when the Raft log lives outside LMDB (its segment files' records:
        `doq.node.wal_log`), which then count as the log's size. `state_changed=False`:
        since the last measure, no transaction changed a table but the Raft ones
        (`raft_*`: an append, a hard state), so only those are read again (a `stat` per
        table costs ~5 µs, ~55 µs for all of them, at every write of every node)."""
        psize = self._page_bytes
        pages = self._pages
        refresh_all = state_changed or not self._measured
        for i, db in enumerate(self._dbs):
            if refresh_all or i in self._raft_dbs:
                st = txn.stat(db)
                pages[i] = st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]
        self._measured = True
        used = sum(pages) * psize
        self.log_bytes = pages[self._log_index] * psize
        if log_bytes is not None:
            self.log_bytes += log_bytes
            used += log_bytes
        self.used_bytes = used

    def measure_log(self, log_bytes: int) -> bool:
        """After a write that only appended to the segment log (no LMDB transaction: no
        table changed since the last `measure`): the log's new size, `log_bytes` as in
        `measure`, the tables' pages as last read. False (nothing done) when no whole
        measure stands (none yet, or a failed write dropped it): the caller measures in a
        transaction instead."""
        if not self._measured:
            return False
        pages = self._pages
        table_log = pages[self._log_index] * self._page_bytes
        self.log_bytes = table_log + log_bytes
        self.used_bytes = sum(pages) * self._page_bytes + log_bytes
        return True

    def committed(self) -> None:
        """A write committed: no longer short of space for it; re-judge the limits. The
        data size alarm goes on at the limit and off only once the store is a margin
        (`clear_margin_bytes`) below it, so it does not flap with every write."""
        self._nospace = self._free_at_failure = None
        if self.used_bytes >= self.max_data_bytes:
            self._data_full = True
        elif self.used_bytes < self.max_data_bytes - self.clear_margin_bytes:
            self._data_full = False
        self.check_disk()  # a statvfs (about a microsecond) after every write: a fast writer
        # could otherwise fill what is left of the disk between two timed checks
        self._publish()

    def refused_near_limit(self) -> None:
        """A write was refused because it would take the store past its data size limit, or
        the disk under its free limit (whichever is nearer): that alarm goes on (the data
        size alarm until the store is a margin below the limit; the disk alarm until the
        next check finds enough free)."""
        data_room = self.max_data_bytes - self.used_bytes
        if (self.disk_free_bytes is not None and self.disk_free_limit_bytes > 0
                and self.disk_free_bytes - self.disk_free_limit_bytes < data_room):
            self._disk_low = True
        else:
            self._data_full = True
        self._publish()

    def write_failed(self, err: BaseException) -> bool:
        """A write failed: True (and the NOSPACE alarm on) if for want of space. LMDB
        reports a short write (the disk filled mid-way) as EIO: that counts as want of space
        when the disk has less than 4 x `RETRY_FREE_BYTES` free now (else it is an I/O
        error, and the node fails as before)."""
        self._measured = False  # the failed txn's measure is gone with it: read every table again
        self.check_disk(force=True)
        if not is_out_of_space(err):
            eio = isinstance(err, lmdb.Error) and os.strerror(errno.EIO) in str(err)
            if not (eio and self.disk_free_bytes is not None and self.disk_free_bytes < 4 * RETRY_FREE_BYTES):
                return False
        self._nospace = f"a write failed: {err}"
        self._free_at_failure = self.disk_free_bytes
        self._publish()
        return True

    def worth_retrying(self) -> bool:
        """After a write failed for want of space: may the same write go through now? A
        failed write costs a rebuild of the store's memory, so it is tried again only once
        the disk has `RETRY_FREE_BYTES` free (or a quarter of that more than at the
        failure), or, when the map was full rather than the disk (pages held by old
        readers come free by themselves), every time."""
        if self._free_at_failure is None:
            return True
        self.check_disk(force=True)
        free = self.disk_free_bytes or 0
        return free >= RETRY_FREE_BYTES or free - self._free_at_failure >= RETRY_FREE_BYTES // 4

    # -- any thread ------------------------------------------------------------------------
    def usage(self) -> StorageUsage:
        """The last measures (of the last write, and the last disk check)."""
        return StorageUsage(self.used_bytes, self.max_data_bytes, self.disk_free_bytes,
                            self.disk_free_limit_bytes)

    def check_disk(self, *, force: bool = True) -> bool:
        """Re-read the free space of the data dir's file system (unless checked less than
        `disk_check_s` ago and not `force`); True if the alarms changed."""
        now = self._clock()
        if not force and now < self._next_disk_check:
            return False
        self._next_disk_check = now + self.disk_check_s
        before = self.alarms
        try:
            st = self._statvfs(self.path)
        except OSError:
            return False
        self.disk_free_bytes = st.f_bavail * st.f_frsize
        self._disk_low = self.disk_free_bytes < self.disk_free_limit_bytes
        self._publish()
        return self.alarms != before

    @property
    def headroom_bytes(self) -> int:
        """What the store may still grow by before an alarm: to its data size limit, or to
        the disk's free limit, whichever is nearer."""
        room = self.max_data_bytes - self.used_bytes
        if self.disk_free_bytes is not None and self.disk_free_limit_bytes > 0:  # 0: no disk limit
            room = min(room, self.disk_free_bytes - self.disk_free_limit_bytes)
        return max(0, room)

    def _publish(self) -> None:
        out: list[Alarm] = []
        if self._data_full:
            out.append(Alarm(self.node_id, DATA_SIZE_LIMIT,
                             f"the store holds {format_size(self.used_bytes)}, its limit is "
                             f"{format_size(self.max_data_bytes)} (--max-data-size)"))
        if self._disk_low:
            out.append(Alarm(self.node_id, DISK_FREE_LIMIT,
                             f"{format_size(self.disk_free_bytes or 0)} free on the data dir's disk, "
                             f"under {format_size(self.disk_free_limit_bytes)} (--disk-free-limit)"))
        if self._nospace is not None:
            out.append(Alarm(self.node_id, NOSPACE, self._nospace))
        alarms = tuple(out)
        if alarms != self.alarms:
            self.alarms = alarms
