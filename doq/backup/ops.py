"""Backup and restore of a node's state (see docs/backup.md).

- `write_backup(state, since, out)`: every record and tombstone with version >= since, read
  in ONE LMDB read transaction (a consistent snapshot), streamed into the backup format.
  Returns the last version contained (`X-Last-Version`): the greatest record version, or
  `max(since - 1, 0)` if there is none; the next incremental uses `since = last + 1`.
- `restore_offline(data_dir, node_id, full, incrementals)`: into a STOPPED node's data dir.
- `restore_online(node, files)` (in `doq.backup.online`): into a running node, whose state
  is empty, through its log.

A restore is all or nothing: the records of every file go into the store in ONE write
transaction (`StateStore.restore`; through the log, the commit entry's apply on every
replica) that commits only if every file read cleanly and the records form a valid
state; a failed restore changes nothing and can simply be retried.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO, Protocol

from doq.backup.format import (
    DEFAULT_FRAME_BYTES,
    BackupHeader,
    BackupReader,
    BackupWriter,
    Record,
)
from doq.errors import FailedPrecondition, InvalidArgument
from doq.storage.chunks import iter_chunks


class BackupState(Protocol):
    """What backup/restore need from `doq.storage.state.StateStore`."""

    def snapshot_changes(self, since: int) -> tuple[int, int | None, Iterator[Record]]:
        """(the state's version: applied index + version offset, state digest at it or None
        if not known, records with version >= since), all from one read txn."""
        ...

    @property
    def cluster_id(self) -> str:
        """The cluster the state belongs to ("" if none is recorded)."""
        ...

    def is_empty(self) -> bool: ...

    def restore(self, records: Iterable[Record], applied_index: int, cluster_id: str = "") -> int:
        """All or nothing: fill the empty store with `records`, set the applied index and
        adopt `cluster_id` (unless "")."""
        ...


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """What a restore did: files applied, records written, and the resulting version."""

    files: int
    records: int
    tombstones: int
    to_version: int  # the state's version right after the restore (>= the chain's to_version)
    last_version: int  # greatest record version restored


@dataclass(frozen=True, slots=True)
class RestoreChain:
    """Backup files opened, checked as a chain and verified (every frame's checksum): what
    `doq.backup.online` restores. Its readers read the files again when it restores."""

    readers: Sequence[BackupReader]
    names: Sequence[str]

    @property
    def to_version(self) -> int:
        """The chain's snapshot point: the last file's to_version."""
        return max(r.header.to_version for r in self.readers)

    @property
    def cluster_id(self) -> str:
        """The cluster the chain's files record ("" if none does): the restored state's."""
        return chain_cluster_id([r.header for r in self.readers])

    def restore_into(self, state: BackupState) -> RestoreResult:
        """Restore directly into `state` (`restore_into`; blocking: the node's writer)."""
        return restore_into(state, self.readers, self.names, verified=True)

    def chunks(self, max_bytes: int) -> Generator[tuple[bytes, int], None, None]:
        """(payload, record count) of each `doq.storage.chunks` chunk of every record, in
        restore order (blocking: each step reads and decodes frames)."""
        return iter_chunks((rec for _, rec in chain_records(self.readers)), max_bytes)


# -- backup -------------------------------------------------------------------------------
def write_backup(
    state: BackupState,
    since: int,
    out: BinaryIO,
    *,
    cluster_id: str | None = None,
    node_id: str = "",
    frame_bytes: int = DEFAULT_FRAME_BYTES,
) -> int:
    """Write a backup of every change with version >= `since` to `out`; return the last version.
    The header records `cluster_id` (default: the state's).

    Consistent: one read transaction covers the snapshot point (the state's version, written to
    the header as `to_version`), the state digest at it (written to the footer; one scan
    of the whole state) and every record read. Raises `InvalidArgument` for a negative
    `since` and (from the store) reason SINCE_TOO_OLD below the tombstone horizon.
    """
    if not 0 <= since < 2**63:
        raise InvalidArgument(f"since must be within 0..2**63-1, got {since}", reason="INVALID_SINCE")
    to_version, state_digest, changes = state.snapshot_changes(since)
    try:
        with BackupWriter(
            out, from_version=since, to_version=max(to_version, since - 1, 0),
            cluster_id=state.cluster_id if cluster_id is None else cluster_id, node_id=node_id,
            frame_bytes=frame_bytes, state_digest=state_digest,
        ) as w:
            w.add_many(changes)
            return w.close().last_version
    finally:
        close = getattr(changes, "close", None)
        if close is not None:
            close()  # ends the store's read txn even if the writer failed


def backup_to_tempfile(
    state: BackupState, since: int, *, cluster_id: str | None = None, node_id: str = "",
    dir: str | None = None,
) -> tuple[BinaryIO, int, int]:
    """For the HTTP gateway: backup into an anonymous temp file, rewound.

    Returns (file, last_version, size). The caller streams the file and closes it; the
    last version is known before the first byte is sent (for the `X-Last-Version` header).
    Blocking: run it in a thread.
    """
    f = tempfile.TemporaryFile(dir=dir)  # noqa: SIM115 - handed to the caller
    try:
        last = write_backup(state, since, f, cluster_id=cluster_id, node_id=node_id)  # type: ignore[arg-type]
        size = f.tell()
        f.seek(0)
    except BaseException:
        f.close()
        raise
    return f, last, size  # type: ignore[return-value]


# -- restore: checks ----------------------------------------------------------------------
def check_chain(headers: Sequence[BackupHeader], *, names: Sequence[str] | None = None) -> None:
    """Refuse a chain that would not restore exactly: raises the first of `chain_problems`."""
    problems = chain_problems(headers, names=names)
    if problems:
        raise problems[0][1]


def chain_problems(
    headers: Sequence[BackupHeader], *, names: Sequence[str] | None = None
) -> list[tuple[int, InvalidArgument]]:
    """Every broken chain rule as (index of the file at fault, error), in file order
    (empty: the chain restores exactly).

    The first file must be a full backup (from_version 0); each next file must start no
    later than the previous one's to_version + 1 (no gap, reason BACKUP_CHAIN_GAP) and must
    not end before it; all files that record a cluster id must record the same one
    (reason BACKUP_CLUSTER_MISMATCH, naming both files and ids; files written before
    cluster ids record none and are not checked by this rule). Each problem names the file
    (`names`, default "file #N").
    """
    if not headers:
        return [(0, InvalidArgument("no backup file to restore", reason="BACKUP_CHAIN"))]
    label = list(names) if names else [f"file #{i + 1}" for i in range(len(headers))]
    if len(set(label)) < len(label):  # e.g. two uploads of the same base name: say which is which
        label = [f"{n} (file #{i + 1})" if label.count(n) > 1 else n for i, n in enumerate(label)]
    out: list[tuple[int, InvalidArgument]] = []
    first = headers[0]
    if first.from_version != 0:
        out.append((0, InvalidArgument(
            f"{label[0]} is an incremental backup (from version {first.from_version}), "
            "not a full one: restore needs a full backup (since 0) first",
            reason="BACKUP_CHAIN",
        )))
    prev = first
    owner = next((i for i, h in enumerate(headers) if h.cluster_id), None)  # the first with an id
    for i, (name, h) in enumerate(zip(label[1:], headers[1:], strict=True), start=1):
        if owner is not None and h.cluster_id and h.cluster_id != headers[owner].cluster_id:
            out.append((i, InvalidArgument(
                f"{name} is a backup of cluster {h.cluster_id!r}, but {label[owner]} of cluster "
                f"{headers[owner].cluster_id!r}: a chain holds the files of one cluster",
                reason="BACKUP_CLUSTER_MISMATCH",
            )))
        if h.from_version > prev.to_version + 1:
            out.append((i, InvalidArgument(
                f"gap in the backup chain: {name} starts at version {h.from_version} but the "
                f"previous file covers only up to {prev.to_version} (need an incremental "
                f"with since <= {prev.to_version + 1})",
                reason="BACKUP_CHAIN_GAP",
            )))
        if h.to_version < prev.to_version:
            out.append((i, InvalidArgument(
                f"{name} (up to version {h.to_version}) is older than the previous file "
                f"(up to {prev.to_version}): give incrementals in order",
                reason="BACKUP_CHAIN",
            )))
        prev = h
    return out


def chain_cluster_id(headers: Sequence[BackupHeader]) -> str:
    """The cluster id a chain records (its first file that records one), "" if none does."""
    return next((h.cluster_id for h in headers if h.cluster_id), "")


def check_target_cluster(state: BackupState, headers: Sequence[BackupHeader],
                         names: Sequence[str]) -> None:
    """Refuse to restore onto a NON-EMPTY state of another cluster than the chain's
    (FailedPrecondition RESTORE_CLUSTER_MISMATCH, naming the file and both ids): its files
    cannot continue that state's history. An empty state adopts the chain's cluster; a
    chain or state that records no cluster id is not checked."""
    theirs, ours = chain_cluster_id(headers), state.cluster_id
    if not theirs or not ours or theirs == ours or state.is_empty():
        return
    i = next(i for i, h in enumerate(headers) if h.cluster_id)
    raise FailedPrecondition(
        f"{names[i]} is a backup of cluster {theirs!r}, but this node belongs to cluster {ours!r} "
        "and is not empty: restore only a chain of its own cluster onto it",
        reason="RESTORE_CLUSTER_MISMATCH",
    )


def chain_record_total(paths: Sequence[str | os.PathLike[str]]) -> int:
    """The records the files' footers count (read from the footers only)."""
    with _open_chain(paths) as readers:
        return sum(r.summary.record_count for r in readers)


@contextlib.contextmanager
def _open_chain(paths: Sequence[str | os.PathLike[str]]) -> Iterator[list[BackupReader]]:
    with contextlib.ExitStack() as stack:
        readers = []
        for p in paths:
            try:
                f = stack.enter_context(open(p, "rb"))
            except OSError as e:
                raise InvalidArgument(f"cannot open backup file {p}: {e.strerror}", reason="BACKUP_FILE") from e
            readers.append(_reader(f, str(p)))
        yield readers


def _reader(f: BinaryIO, name: str) -> BackupReader:
    from doq.backup.format import BackupFormatError

    try:
        return BackupReader(f)
    except BackupFormatError as e:
        raise BackupFormatError(e.reason.removeprefix("BACKUP_"), f"{name}: {e.message}") from e


def _verify_all(readers: Sequence[BackupReader], names: Sequence[str]) -> None:
    from doq.backup.format import BackupFormatError

    for r, name in zip(readers, names, strict=True):
        try:
            r.verify()
        except BackupFormatError as e:
            raise BackupFormatError(e.reason.removeprefix("BACKUP_"), f"{name}: {e.message}") from e


# -- restore: apply -----------------------------------------------------------------------
def _refuse_non_empty(state: BackupState) -> None:
    if not state.is_empty():
        raise FailedPrecondition(
            "the target state is not empty: restore needs a fresh node or cluster (an empty state)",
            reason="RESTORE_TARGET_NOT_EMPTY",
        )


def chain_records(readers: Sequence[BackupReader]) -> Iterator[tuple[int, Record]]:
    """(frame's last version, record) of every record a chain restores, in restore order:
    each file's records except those an earlier file already holds. The earlier files
    cover every change up to the greatest `to_version` among them (the chain starts with a
    full backup and has no gap), and a record or tombstone with a version at or below it is
    in them as it is (a version names one write of one key), so a file that overlaps the
    ones before it (the same incremental twice, or one taken since an older version) adds
    only what is newer: nothing is written or counted twice. Every frame is still read
    (and its checksum checked)."""
    covered = -1  # the greatest to_version of the files before
    for r in readers:
        for entry, recs in r.iter_frames():
            if entry.last_version <= covered:
                continue
            for rec in recs:
                if rec[2] > covered:
                    yield entry.last_version, rec
        covered = max(covered, r.header.to_version)


class _Tally:
    """Counts what a restore writes (`chain_records`: a repeated record once); `advance(n)`
    hears of every `_ADVANCE_EVERY` records (and the rest at the end)."""

    def __init__(self, advance: Callable[[int], None] | None = None) -> None:
        self.records = self.tombstones = self.last_version = 0
        self.advance = advance

    def records_of(self, readers: Sequence[BackupReader]) -> Iterator[Record]:
        for last_version, rec in chain_records(readers):
            self.records += 1
            self.tombstones += rec[1] is None
            self.last_version = max(self.last_version, last_version)
            if self.advance is not None and self.records % _ADVANCE_EVERY == 0:
                self.advance(_ADVANCE_EVERY)
            yield rec
        if self.advance is not None:
            self.advance(self.records % _ADVANCE_EVERY)


_ADVANCE_EVERY = 4096


def restore_into(
    state: BackupState, readers: Sequence[BackupReader], names: Sequence[str], *, verified: bool = False,
    advance: Callable[[int], None] | None = None,
) -> RestoreResult:
    """Check the chain's cluster against `state`'s, the chain, and that `state` is empty,
    verify every file (unless `verified`), then restore all records in order through
    `state.restore` (one transaction; the applied index becomes the last file's to_version,
    the cluster id the chain's). All or nothing: any error leaves `state` as it was.
    Blocking: run it in the node's writer. `advance(n)`: n more records written (progress)."""
    headers = [r.header for r in readers]
    check_target_cluster(state, headers, names)
    check_chain(headers, names=names)
    _refuse_non_empty(state)
    if not verified:
        _verify_all(readers, names)  # a corrupt file is named before anything is written
    to_version = max(h.to_version for h in headers)
    tally = _Tally(advance)
    state.restore(tally.records_of(readers), to_version, chain_cluster_id(headers))
    return RestoreResult(len(readers), tally.records, tally.tombstones, to_version, tally.last_version)


def restore_offline(
    data_dir: str | os.PathLike[str],
    node_id: str,
    full_path: str | os.PathLike[str],
    incremental_paths: Sequence[str | os.PathLike[str]] = (),
    *,
    advance: Callable[[int], None] | None = None,
) -> RestoreResult:
    """Restore full + incrementals (in order) into a STOPPED node's empty data dir.
    `advance(n)`: n more records written (progress; at most `chain_record_total`: a record
    several files hold is written once).

    Creates `<data_dir>/<node_id>/doq.lmdb` if missing. Raises `InvalidArgument` (bad or
    corrupt file, gap in the chain, inconsistent records) or `FailedPrecondition` (state
    not empty) and then writes nothing. The node must not be running: this function does
    not check it (`doq restore --data-dir` holds the node directory's lock while it runs).
    """
    paths = [full_path, *incremental_paths]
    names = [str(p) for p in paths]
    with _open_chain(paths) as readers:
        check_chain([r.header for r in readers], names=names)
        _verify_all(readers, names)  # before the data dir is even created
        from doq.storage.env import node_dir, open_env
        from doq.storage.state import StateStore

        env = open_env(node_dir(data_dir, node_id) / "doq.lmdb")
        try:
            state = StateStore(env)
            if state.is_empty():  # (else refused as not empty, below)
                _refuse_unapplied_log(env.path(), state.applied_index)
            return restore_into(state, readers, names, verified=True, advance=advance)
        finally:
            env.close()


def _refuse_unapplied_log(lmdb_dir: str, applied_index: int) -> None:
    """Refuse (FailedPrecondition RESTORE_TARGET_NOT_EMPTY) a node directory whose Raft log
    (its segment files, `<lmdb dir>/wal`: `doq.node.wal_log.wal_dir`) holds entries past
    its state's applied index: a node killed rather than stopped, whose state in LMDB lags
    its log by up to one held batch (docs/raft.md, "The batched commit"), or one stopped
    with entries it had not applied yet. Its state looks empty but is not: its next start
    applies those entries. Opening the log does what a start does first (a torn tail cut,
    leftover temporary files removed); nothing else is written."""
    from pathlib import Path

    from doq.storage.segment_log import SUFFIX, SegmentLog

    wal = Path(lmdb_dir) / "wal"
    if not wal.is_dir() or not any(p.name.endswith(SUFFIX) for p in wal.iterdir()):
        return
    log = SegmentLog(wal)
    try:
        last = log.last_index()
    finally:
        log.close()
    if last > applied_index:
        raise FailedPrecondition(
            f"the target's Raft log holds entries up to index {last} that its state has not "
            f"applied (applied: {applied_index}; a node killed, or stopped before it applied "
            "them): it is not a fresh node. Restore into a fresh data dir",
            reason="RESTORE_TARGET_NOT_EMPTY")
