"""The backup verification job (PySpark): rebuild the state a chain of backup files
describes, in parallel by frame, and prove it equal to the state the node recorded.

    files ──driver──► headers, footers, chain rules, frame index ──► tasks (ranges of frames)
    tasks ──stage 1──► read_frame (CRC, counts, versions), hash ──► packed records
          ──shuffle by key──► per key: the record with the highest version across the chain
          ──stage 2──► per partition: digest deltas per file, per-queue counts ──► driver

This module is the driver: it opens the files, checks the chain, plans the tasks, runs
the two stages (`doq.backup.rebuild`, the executor side) and adds up what they found.
The digest (`doq.storage.digest`) is a sum, so the rebuilt state's digest is a plain
reduce. For every file that records one, the state rebuilt from the chain up to that file
is checked against it (the last file proves the whole chain). Every failure is named with
its file, frame (index in the file's frame index) and byte offset where it has one.

`verify(paths, spark=...)` is the function tests call; `doq verify` (doq/backup/
verify_cli.py) and `spark-submit backup/verify_job.py` run it with the same code.
Executors need `doq` (shipped as a zip, `doq.backup.spark.build_zip`) and `zstandard` +
`protobuf`; the driver and every executor must see the files at the same path (local
disk in local mode, a shared file system on a cluster).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from doq.backup.format import (
    BackupFormatError,
    BackupHeader,
    BackupReader,
    BackupSummary,
    FrameEntry,
    check_frame_order,
    read_frame,
    read_header,
)
from doq.backup.ops import chain_problems
from doq.backup.rebuild import Failure, Task, decode_task, summarize
from doq.backup.spark import build_zip, spark_session
from doq.queues import keys as K
from doq.queues import records as R
from doq.storage import digest as D

__all__ = ["Failure", "FileReport", "QueueCounts", "VerifyReport", "build_zip", "spark_session", "verify"]

DEFAULT_TASK_BYTES = 64 * 1024 * 1024  # compressed bytes of frames per task (at most)


# -- the report ----------------------------------------------------------------------------
@dataclass
class FileReport:
    name: str
    path: str
    header: BackupHeader | None = None
    summary: BackupSummary | None = None
    frames_ok: int = 0
    frames_bad: int = 0
    records: int = 0
    tombstones: int = 0
    uncompressed_bytes: int = 0
    tasks: int = 0
    partitions: set[int] = field(default_factory=set)  # Spark partitions that decoded its frames
    rebuilt_digest: int | None = None  # digest of the state rebuilt from the chain up to this file
    digest_ok: bool | None = None  # None: not checked
    against: bool = False  # the fresh incremental taken from the live node

    def to_dict(self) -> dict[str, Any]:
        h, s = self.header, self.summary
        out: dict[str, Any] = {"file": self.name}
        if h is not None:
            out.update(from_version=h.from_version, to_version=h.to_version, cluster_id=h.cluster_id,
                       node_id=h.node_id, created_at_ms=h.created_at_ms, format_version=h.format_version)
        if s is not None:
            out.update(bytes=s.file_bytes, frames=len(s.frames), last_version=s.last_version,
                       recorded_digest=None if s.state_digest is None else D.hex_digest(s.state_digest))
        out.update(frames_ok=self.frames_ok, frames_bad=self.frames_bad, records=self.records,
                   tombstones=self.tombstones, tasks=self.tasks, spark_partitions=len(self.partitions),
                   rebuilt_digest=None if self.rebuilt_digest is None else D.hex_digest(self.rebuilt_digest),
                   digest_ok=self.digest_ok)
        if self.against:
            out["against"] = True
        return out


@dataclass
class QueueCounts:
    type: str = ""
    ready: int = 0
    delayed: int = 0
    in_flight: int = 0
    dead: int = 0
    dedup: int = 0  # dedup ids remembered (a run record counts its ids)
    groups: int = 0  # group records of a fair queue (weights, rates, token buckets)
    has_record: bool = False

    @property
    def messages(self) -> int:
        return self.ready + self.delayed + self.in_flight


@dataclass
class VerifyReport:
    """What `verify` found. `ok` only when every check passed and the digest was proven."""

    files: list[FileReport]
    failures: list[Failure] = field(default_factory=list)
    queues: dict[str, QueueCounts] = field(default_factory=dict)
    digest: int | None = None  # of the state rebuilt from the whole chain
    to_version: int = 0
    now_ms: int = 0
    live_keys: int = 0
    tasks: int = 0
    shuffle_partitions: int = 0
    seconds: float = 0.0
    stopped: str = ""  # why nothing past the files' own checks was verified ("" if it ran)
    against: dict[str, Any] | None = None
    master: str = ""
    failures_dropped: int = 0

    @property
    def ok(self) -> bool:
        return not self.failures and not self.failures_dropped

    @property
    def records(self) -> int:
        return sum(f.records for f in self.files)

    @property
    def file_bytes(self) -> int:
        return sum(f.summary.file_bytes for f in self.files if f.summary is not None)

    def to_dict(self) -> dict[str, Any]:
        totals = {k: sum(getattr(q, k) for q in self.queues.values())
                  for k in ("ready", "delayed", "in_flight", "dead", "dedup")}
        totals.update(queues=sum(1 for q in self.queues.values() if q.has_record),
                      messages=sum(q.messages for q in self.queues.values()))
        secs = max(self.seconds, 1e-9)
        return {
            "verified": self.ok,
            "cluster_id": next((f.header.cluster_id for f in self.files  # the chain's ("": none recorded)
                                if f.header is not None and f.header.cluster_id and not f.against), ""),
            "files": [f.to_dict() for f in self.files],
            "frames": sum(f.frames_ok + f.frames_bad for f in self.files),
            "records": self.records,
            "tombstones": sum(f.tombstones for f in self.files),
            "bytes": self.file_bytes,
            "stopped": self.stopped or None,
            "state": None if self.stopped else {
                "to_version": self.to_version,
                "digest": None if self.digest is None else D.hex_digest(self.digest),
                "now_ms": self.now_ms,
                "live_records": self.live_keys,
                "queues": {n: {"type": q.type, "ready": q.ready, "delayed": q.delayed,
                               "in_flight": q.in_flight, "dead": q.dead, "dedup": q.dedup,
                               "groups": q.groups,
                               "messages": q.messages}
                           for n, q in sorted(self.queues.items())},
                "totals": totals,
            },
            "against": self.against,
            "failures": [f.to_dict() for f in self.failures],
            "failures_not_listed": self.failures_dropped,
            "spark": {"master": self.master, "tasks": self.tasks, "shuffle_partitions": self.shuffle_partitions},
            "seconds": round(self.seconds, 3),
            "records_per_s": round(self.records / secs),
            "mb_per_s": round(self.file_bytes / 1e6 / secs, 1),
        }

    def summary_line(self) -> str:
        d = self.to_dict()
        head = "verified" if self.ok else f"NOT verified ({len(self.failures) + self.failures_dropped} failures)"
        if self.stopped:
            return f"doq verify: {head}: {self.stopped}"
        t = d["state"]["totals"]
        return (f"doq verify: {head}: {len(self.files)} files, {d['frames']} frames, {d['records']} records "
                f"({d['tombstones']} tombstones) in {self.seconds:.1f} s ({d['records_per_s']} records/s, "
                f"{d['mb_per_s']} MB/s); state at version {self.to_version}: {t['queues']} queues, "
                f"{t['messages']} messages (ready {t['ready']}, delayed {t['delayed']}, in flight "
                f"{t['in_flight']}, dead {t['dead']}), digest {d['state']['digest']}")


# -- driver: open the files, check the chain, plan the tasks ------------------------------
def open_files(paths: Sequence[str], names: Sequence[str]) -> tuple[list[FileReport], list[Failure]]:
    """Read every file's header and footer (no frame yet); failures name the file."""
    files: list[FileReport] = []
    failures: list[Failure] = []
    for path, name in zip(paths, names, strict=True):
        fr = FileReport(name, path)
        files.append(fr)
        try:
            with open(path, "rb") as f:
                try:
                    fr.header = read_header(f)
                    fr.summary = BackupReader(f).summary
                    check_frame_order(fr.header, fr.summary.frames)
                except BackupFormatError as e:
                    failures.append(Failure(e.reason, e.message, name, _frame_at(fr.summary, e.offset), e.offset))
        except OSError as e:
            failures.append(Failure("BACKUP_FILE", f"cannot open: {e.strerror or e}", name))
    return files, failures


def _frame_at(summary: BackupSummary | None, offset: int | None) -> int | None:
    if summary is None or offset is None:
        return None
    for i, fr in enumerate(summary.frames):
        if fr.offset <= offset < fr.offset + fr.length:
            return i
    return None


def check_files_chain(files: Sequence[FileReport]) -> list[Failure]:
    """The chain rules (`doq.backup.ops.chain_problems`) over every file whose header reads."""
    if not files:
        return [Failure("BACKUP_CHAIN", "no backup file to verify")]
    usable = [f for f in files if f.header is not None]
    if not usable:
        return []
    problems = chain_problems([f.header for f in usable if f.header], names=[f.name for f in usable])
    return [Failure(p.reason, p.message, usable[i].name) for i, p in problems]


def plan_tasks(files: Sequence[FileReport], *, parallelism: int, task_bytes: int = DEFAULT_TASK_BYTES,
               frames_per_task: int | None = None) -> list[Task]:
    """Split every readable file into ranges of consecutive frames, one Spark task each:
    at most `task_bytes` of compressed frames (or `frames_per_task` frames), and small
    enough that there are about 4 tasks per core when the chain is big enough (so the
    cores stay busy until the end)."""
    total = sum(fr.length for f in files if f.summary for fr in f.summary.frames)
    per_task = max(1, min(task_bytes, -(-total // max(1, 4 * parallelism))))
    tasks: list[Task] = []
    for fi, f in enumerate(files):
        if f.summary is None:
            continue
        frames = f.summary.frames
        start = 0
        while start < len(frames):
            end, size = start, 0
            while end < len(frames) and (end == start or (
                    size + frames[end].length <= per_task if frames_per_task is None
                    else end - start < frames_per_task)):
                size += frames[end].length
                end += 1
            tasks.append((len(tasks), fi, f.path, start, tuple(_entry_tuple(e) for e in frames[start:end])))
            f.tasks += 1
            start = end
    return tasks


def _entry_tuple(e: FrameEntry) -> tuple[int, ...]:
    return (e.offset, e.length, e.uncompressed_length, e.record_count, e.first_version, e.last_version, e.crc32)


def find_now_ms(files: Sequence[FileReport]) -> int:
    """Replicated time of the rebuilt state: `now_ms` of the newest meta record (key
    b"G"), searched from the end of the chain (usually the last frame of the last file).
    Readiness of a message (ready vs delayed) is judged against it, as the node does.
    0 if no file holds a meta record."""
    for f in reversed(files):
        if f.summary is None:
            continue
        with open(f.path, "rb") as fh:
            for entry in reversed(f.summary.frames):
                try:
                    recs = read_frame(fh, entry)
                except BackupFormatError:
                    continue  # reported by the job
                for key, value, _ in reversed(recs):
                    if key == K.META_KEY and value is not None:
                        return int(R.META_REC.unpack_from(value)[1])
    return 0


# -- the job -----------------------------------------------------------------------------
def verify(
    paths: Sequence[str | os.PathLike[str]],
    *,
    spark: Any = None,
    master: str | None = None,
    against: str | None = None,
    names: Sequence[str] | None = None,
    frames_per_task: int | None = None,
    task_bytes: int = DEFAULT_TASK_BYTES,
    progress: IO[str] | None = None,
    progress_interval_s: float = 2.0,
    timeout_s: float = 3600.0,
) -> VerifyReport:
    """Verify a chain of backup files (full first, then incrementals, in order) with Spark.

    `spark`: a SparkSession to use (tests share one); else one is created for `master`
    (default: the configured one, else local[*]) and stopped at the end. `against`: the
    URL of a live node: a fresh incremental since the chain's last version is taken from
    it and added to the chain, so the chain is proven equal to the node's state now (a node
    of another cluster than the chain's is refused first: AGAINST_CLUSTER_MISMATCH).
    `progress`: a stream for progress lines (files, frames, records/s). Never raises for
    what it finds: every problem is a `Failure` of the report (`report.ok` is False).
    """
    t0 = time.monotonic()
    strs = [os.fspath(p) for p in paths]
    say = _Progress(progress)
    files, failures = open_files(strs, list(names) if names else strs)
    say(f"{len(files)} file(s) opened, {sum(len(f.summary.frames) for f in files if f.summary)} frames")
    if files and files[0].summary is None:
        # the full backup is unreadable: every later check (the chain, the state, the
        # digest) would only add failures that follow from this one
        report = VerifyReport(files, failures, master="")
        report.stopped = (f"the full backup {files[0].name} cannot be read ({failures[0].message}); "
                          "nothing after it was checked")
        report.seconds = time.monotonic() - t0
        say(report.summary_line())
        return report
    with contextlib.ExitStack() as stack:
        against_doc = None
        if against is not None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="doq-verify-"))
            against_doc, failure = _fetch_against(against, files, Path(tmp), timeout_s, say)
            if failure is not None:
                failures.append(failure)
            if against_doc is not None and "path" in against_doc:
                more, fails = open_files([against_doc["path"]], [against_doc["file"]])
                more[0].against = True
                files += more
                failures += fails
        failures += check_files_chain(files)
        session, owned = (spark, False) if spark is not None else (spark_session(master), True)
        try:
            report = _run(session, files, failures, frames_per_task, task_bytes, say, progress_interval_s)
        finally:
            if owned:
                session.stop()
        if against_doc is not None:
            against_doc.pop("path", None)
            report.against = against_doc
    report.seconds = time.monotonic() - t0
    say(report.summary_line())
    return report


def _run(spark: Any, files: list[FileReport], failures: list[Failure], frames_per_task: int | None,
         task_bytes: int, say: _Progress, interval_s: float) -> VerifyReport:
    sc = spark.sparkContext
    report = VerifyReport(files, failures, master=sc.master)
    tasks = plan_tasks(files, parallelism=sc.defaultParallelism, task_bytes=task_bytes,
                       frames_per_task=frames_per_task)
    now_ms = find_now_ms(files)
    report.now_ms = now_ms
    report.tasks = len(tasks)
    total_records = sum(f.summary.record_count for f in files if f.summary)
    report.shuffle_partitions = max(2 * sc.defaultParallelism, -(-total_records // 1_000_000))
    total_frames = sum(len(t[4]) for t in tasks)
    say(f"{len(tasks)} tasks over {total_frames} frames, {total_records} records; "
        f"{report.shuffle_partitions} shuffle partitions; master {sc.master}")
    parts: list[dict[str, Any]] = []
    if tasks:
        frames_acc, records_acc = sc.accumulator(0), sc.accumulator(0)
        counters = (frames_acc, records_acc)
        n_files = len(files)
        ticker = _Ticker(say, interval_s, frames_acc, records_acc, total_frames, total_records)
        with ticker:
            shuffle = report.shuffle_partitions
            parts = (sc.parallelize(tasks, len(tasks))
                     .flatMap(lambda t: decode_task(t, shuffle, counters))
                     .partitionBy(shuffle, _identity)
                     .mapPartitions(lambda it: summarize(it, now_ms, n_files))
                     .collect())
    _combine(report, parts, now_ms)
    return report


def _identity(partition: int) -> int:
    return partition


def _combine(report: VerifyReport, parts: list[dict[str, Any]], now_ms: int) -> None:
    """Driver: add up the partitions' results, check totals and digests."""
    files = report.files
    deltas = [0] * len(files)
    final = 0
    meta_now = None
    msgs: dict[bytes, list[int]] = {}
    queues: dict[bytes, tuple[str, int]] = {}
    groups: dict[bytes, int] = {}
    for p in parts:
        deltas = [(a + b) & D.MASK for a, b in zip(deltas, p["deltas"], strict=True)]
        final = (final + p["final"]) & D.MASK
        report.live_keys += p["live"]
        for name, c in p["msgs"].items():
            acc = msgs.setdefault(name, [0, 0, 0, 0])
            for i in range(4):
                acc[i] += c[i]
        queues.update(p["queues"])
        for name, n in p.get("groups", {}).items():
            groups[name] = groups.get(name, 0) + n
        if p["meta_now"] is not None:
            meta_now = p["meta_now"]
        report.failures_dropped += p["dropped"]
        for fi, part_id, stats, fails, bad_records, more in p["stats"]:
            f = files[fi]
            f.partitions.add(part_id)
            for fail in [*fails, *bad_records]:
                report.failures.append(Failure(fail.reason, fail.message, f.name, fail.frame, fail.offset, fail.key))
            f.frames_bad += len(fails)
            report.failures_dropped += more
            for _, n, tombs, raw, _ in stats:
                f.frames_ok += 1
                f.records += n
                f.tombstones += tombs
                f.uncompressed_bytes += raw
        for fail in p["failures"]:
            report.failures.append(fail)
    report.failures.sort(key=lambda x: (_file_pos(files, x.file), x.frame or 0, x.offset or 0))
    # footer totals against the frames (only for files whose frames all decoded)
    for f in files:
        s = f.summary
        if s is None or f.frames_bad or f.frames_ok != len(s.frames):
            continue
        got = (f.records, f.tombstones, f.uncompressed_bytes)
        want = (s.record_count, s.tombstone_count, s.uncompressed_bytes)
        if got != want:
            report.failures.append(Failure("BACKUP_TOTALS", f"footer totals (records, tombstones, bytes) {want} "
                                           f"disagree with the frames {got}", f.name, offset=s.footer_offset))
    # names of queues and their counts
    for name, (qtype, dead) in queues.items():
        q = report.queues.setdefault(name.decode(errors="replace"), QueueCounts())
        q.type, q.dead, q.has_record = qtype, dead, True
    for name, (ready, delayed, in_flight, dedup) in msgs.items():
        q = report.queues.setdefault(name.decode(errors="replace"), QueueCounts())
        q.ready, q.delayed, q.in_flight, q.dedup = ready, delayed, in_flight, dedup
        if not q.has_record:
            report.failures.append(Failure("STATE_INCONSISTENT", f"{q.messages} messages and {dedup} dedup "
                                           f"entries of queue {name!r} that has no queue record"))
    for name, n in groups.items():
        q = report.queues.setdefault(name.decode(errors="replace"), QueueCounts())
        q.groups = n
        if q.type != "fair":
            report.failures.append(Failure("STATE_INCONSISTENT", f"{n} group records of queue {name!r} that "
                                           "is not a fair queue"))
    if meta_now is not None and meta_now != now_ms:
        report.failures.append(Failure("STATE_INCONSISTENT", f"the final meta record says now_ms={meta_now}, "
                                       f"the newest one found in the files {now_ms}"))
    # digests: the state rebuilt up to file i against what file i recorded
    running = 0
    damaged = False
    for f, d in zip(files, deltas, strict=True):
        running = (running + d) & D.MASK
        damaged = damaged or f.summary is None or bool(f.frames_bad)
        if damaged:
            continue  # the rebuild is incomplete from here on (already reported)
        f.rebuilt_digest = running
        recorded = f.summary.state_digest if f.summary else None
        if recorded is not None:
            f.digest_ok = recorded == running
            if not f.digest_ok:
                to = f.header.to_version if f.header else "?"
                report.failures.append(Failure(
                    "DIGEST_MISMATCH", f"the state rebuilt from the chain up to this file (version {to}) has "
                    f"digest {D.hex_digest(running)}, the node recorded {D.hex_digest(recorded)}", f.name))
    if files and not damaged:
        if running != final:  # the deltas and the final records are two sums of the same state
            report.failures.append(Failure("STATE_INCONSISTENT", "internal: per-file digests do not add up "
                                           "to the digest of the final records"))
        report.digest = final
        last = files[-1]
        report.to_version = last.header.to_version if last.header else 0
        if last.digest_ok is None:
            report.failures.append(Failure(
                "DIGEST_NOT_RECORDED", "the last file records no state digest (written by an older doq): "
                "its records were checked but the rebuilt state is not proven equal to the node's; "
                "verify with --against URL", last.name))


def _file_pos(files: Sequence[FileReport], name: str | None) -> int:
    for i, f in enumerate(files):
        if f.name == name:
            return i
    return len(files)


def _fetch_against(url: str, files: Sequence[FileReport], tmp: Path, timeout_s: float,
                   say: _Progress) -> tuple[dict[str, Any] | None, Failure | None]:
    """A fresh incremental of the node at `url` since the chain's last version, in `tmp`."""
    from doq.backup.cli import RequestFailed, fetch_backup
    from doq.client_cli import server_url
    from doq.errors import DoqError

    last = files[-1].summary if files else None
    if last is None:
        return None, Failure("AGAINST", f"--against {url}: the chain's last file does not open, so the "
                                        "version to back up from is unknown")
    since = last.last_version + 1
    chain_to = max(f.header.to_version for f in files if f.header is not None)
    try:
        base = server_url(url)
        applied, node_cluster = _node_position(base, timeout_s)
        refused = _other_cluster(base, node_cluster, files)
        if refused is not None:  # no incremental: its records would only add noise
            return {"url": base, "since": since, "node_applied_index": applied,
                    "cluster_id": node_cluster}, refused
        path = tmp / f"against-since-{since}.bak"
        say(f"taking an incremental backup of {base} (at version {applied}) since version {since}")
        s = fetch_backup(base, since, path, timeout_s)
    except DoqError as e:
        return None, Failure("AGAINST", e.message)
    except (RequestFailed, OSError) as e:
        return None, Failure("AGAINST", str(e))
    name = f"{base} (incremental since {since})"
    doc: dict[str, Any] = {
        "url": base, "since": since, "to_version": s.header.to_version, "records": s.record_count,
        "node_id": s.header.node_id, "cluster_id": s.header.cluster_id, "file": name, "path": str(path),
        "node_applied_index": applied,
        "node_digest": None if s.state_digest is None else D.hex_digest(s.state_digest)}
    if applied < chain_to:
        return doc, Failure("AGAINST", f"the node at {base} is at version {applied}, behind the chain "
                                       f"(version {chain_to}): it cannot hold the state these files describe",
                            name)
    return doc, None


def _other_cluster(base: str, node_cluster: str, files: Sequence[FileReport]) -> Failure | None:
    """A failure (AGAINST_CLUSTER_MISMATCH) if the node at `base` belongs to another
    cluster than the chain (when both record one), else None."""
    owner = next((f for f in files if f.header is not None and f.header.cluster_id), None)
    if owner is None or owner.header is None or not node_cluster or node_cluster == owner.header.cluster_id:
        return None
    return Failure("AGAINST_CLUSTER_MISMATCH", f"the node at {base} belongs to cluster {node_cluster!r}, but "
                   f"{owner.name} is a backup of cluster {owner.header.cluster_id!r}: these files are not "
                   "this cluster's backups", owner.name)


def _node_position(base: str, timeout_s: float) -> tuple[int, str]:
    """(applied index, cluster id or "") of the node (`GET /db/digest`)."""
    import json
    import urllib.request

    from doq.backup.cli import RequestFailed
    from doq.client_cli import describe_error

    url = base + "/db/digest"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            doc = json.loads(r.read())
            return int(doc["applied_index"]), str(doc.get("cluster_id") or "")  # absent from older nodes
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise RequestFailed(describe_error(url, e)) from e


# -- progress --------------------------------------------------------------------------------
class _Progress:
    """Lines on a stream (stderr for `doq verify`), or nothing."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.stream = stream
        self.t0 = time.monotonic()

    def __call__(self, text: str) -> None:
        if self.stream is not None:
            print(f"[{time.monotonic() - self.t0:6.1f}s] {text}", file=self.stream, flush=True)


class _Ticker:
    """While the job runs, every `interval_s`: frames done, records read, records/s."""

    def __init__(self, say: Callable[[str], None], interval_s: float, frames: Any, records: Any,
                 total_frames: int, total_records: int) -> None:
        self.say, self.interval_s = say, interval_s
        self.frames, self.records = frames, records
        self.total_frames, self.total_records = total_frames, total_records
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="doq-verify-progress", daemon=True)
        self.t0 = time.monotonic()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            n = self.records.value
            rate = n / max(time.monotonic() - self.t0, 1e-9)
            left = f", about {(self.total_records - n) / rate:,.0f} s left" if rate > 0 and n < self.total_records else ""
            self.say(f"frames {self.frames.value}/{self.total_frames}, records {n}/{self.total_records} "
                     f"({rate:,.0f} records/s{left})")

    def __enter__(self) -> _Ticker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
