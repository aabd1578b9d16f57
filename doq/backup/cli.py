"""`doq backup` and `doq restore` (hooked into `doq.cli` by `add_parser`). Standard library only.

    doq backup [--server URL] --since N -o FILE        prints the last version contained
    doq backup [--server URL] --dir DIR                writes the next file of DIR's chain
    doq restore -f FULL [-i INC ...] --data-dir DIR [--node-id ID]     offline
    doq restore -f FULL [-i INC ...] [--server URL]                    online

`--server` defaults to $DOQ_SERVER, else the default node (see `doq.client_cli`).
Results: one human line on stdout, or one JSON object with `--json`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import stat
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from doq import progress
from doq.client_cli import (
    add_json_argument,
    add_server_argument,
    describe_error,
    print_result,
    server_url,
)
from doq.errors import DoqError
from doq.flags import given
from doq.storage.files import open_private_binary

if TYPE_CHECKING:
    from doq.backup.format import BackupSummary

CHUNK = 1024 * 1024


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register the `backup` and `restore` subcommands."""
    b = sub.add_parser("backup", help="write a backup file of a running node (POST /db/backup)",
                       description="Write a backup file of a running node (POST /db/backup); "
                                   "prints the last version it contains.")
    add_server_argument(b)
    b.add_argument("--since", type=int, default=None, help="0 = full (default); last+1 = the next incremental")
    out = b.add_mutually_exclusive_group(required=True)
    out.add_argument("-o", "--output", help="backup file to write")
    out.add_argument("--dir", metavar="DIR",
                     help="write the next file of the chain kept in DIR (full when DIR has none, else "
                          "an incremental since the last file's last version + 1)")
    b.add_argument("--timeout", type=float, default=3600.0, help="HTTP timeout in seconds")
    add_json_argument(b, "the file, its versions and counts")
    b.set_defaults(func=cmd_backup)

    r = sub.add_parser("restore", help="restore full + incremental backups (offline or online)",
                       description="Restore a full backup and its incrementals, in order: offline "
                                   "into a stopped node's --data-dir, or online through --server.")
    r.add_argument("-f", "--full", required=True, help="the full backup file (since 0)")
    r.add_argument("-i", "--incremental", action="append", default=[], metavar="INC",
                   help="an incremental backup, in order (repeatable)")
    r.add_argument("--data-dir", default=None,
                   help="offline: a STOPPED node's data dir (refused while a node holds it)")
    r.add_argument("--node-id", default=os.environ.get("DOQ_NODE_ID") or "node-1",
                   help="offline: the node id (env DOQ_NODE_ID)")
    add_server_argument(r, "node to restore online (when no --data-dir)")
    r.add_argument("--timeout", type=float, default=3600.0, help="HTTP timeout in seconds")
    add_json_argument(r, "what was restored")
    r.set_defaults(func=cmd_restore)


def _fail(command: str, message: str, code: int = 1) -> int:
    print(f"doq {command}: {message}", file=sys.stderr)
    return code


def _check_inputs(paths: list[str]) -> str | None:
    """Why the backup files cannot be read (they need random access), or None."""
    for p in paths:
        try:
            mode = os.stat(p).st_mode
        except OSError as e:
            return f"cannot open backup file {p}: {e.strerror}"
        if not stat.S_ISREG(mode):
            return (f"{p} is not a regular file (a pipe or a device?): backup files are read "
                    "with random access; save it to a file first")
    return None


def cmd_backup(ns: argparse.Namespace) -> int:
    """POST /db/backup, stream the body to FILE (atomically), verify it, print the last version."""
    from doq.backup import chain_dir

    if ns.since is not None and ns.since < 0:
        return _fail("backup", "--since must be >= 0", 2)
    if ns.dir is not None and ns.since is not None:
        return _fail("backup", "--dir chooses --since itself (from the files in DIR): give one of them", 2)
    try:
        server = server_url(ns.server)
    except DoqError as e:
        return _fail("backup", e.message, 2)
    try:
        if ns.dir is not None:
            since, out = chain_dir.next_file(Path(ns.dir))
        else:
            since, out = ns.since or 0, Path(ns.output)
        written_in_place = _output_kind(out) == "in_place"
        summary = fetch_backup(server, since, out, ns.timeout, show_progress=progress.wanted(ns.json))
    except BackupOutputError as e:
        return _fail("backup", str(e), 2)
    except RequestFailed as e:
        return _fail("backup", str(e))
    except DoqError as e:
        return _fail("backup", e.message)
    except OSError as e:
        return _fail("backup", f"{e.filename or ''}: {e.strerror or e}")
    kind = "full backup" if since == 0 else f"incremental backup since {since}"
    human = (f"wrote {out}: {kind}, last version {summary.last_version} "
             f"({summary.record_count} records, {summary.tombstone_count} tombstones, {summary.file_bytes} bytes)")
    record = {"file": str(out), "since": since, "last_version": summary.last_version,
              "records": summary.record_count, "tombstones": summary.tombstone_count,
              "bytes": summary.file_bytes}
    if written_in_place:  # e.g. -o /dev/stdout: the result must not mix into the backup
        print(json.dumps(record) if ns.json else human, file=sys.stderr, flush=True)
    else:
        print_result(ns, human, record)
    return 0


def _output_kind(out: Path) -> str:
    """How a backup is written to `out`:
    - "replace": a new path, or a regular file named directly: written beside it as
      OUT.part and renamed over it once verified (atomic);
    - "in_place": a FIFO or a character device (`-o /dev/stdout` to a pipe or a terminal,
      `/dev/null`), or a symlink to a regular file (`/dev/stdout` redirected to a file):
      the verified backup is copied into it, which is never replaced (so a device node
      stays a device node);
    raises BackupOutputError for anything else (a directory, a socket, a block device)."""
    try:
        st = os.stat(out)  # follows symlinks
    except FileNotFoundError:
        return "replace"
    if stat.S_ISREG(st.st_mode):
        return "in_place" if out.is_symlink() or str(out).startswith(("/dev/", "/proc/")) else "replace"
    if stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode):
        return "in_place"
    raise BackupOutputError(f"{out} is not a regular file, a pipe or a character device: a backup "
                            "is not written there")


class BackupOutputError(OSError):
    """`-o` names something a backup must not be written to."""


def fetch_backup(server: str, since: int, out: Path, timeout_s: float, *,
                 show_progress: bool = False) -> BackupSummary:
    """`POST {server}/db/backup {"since"}` into `out`: the body goes to a temporary file,
    every checksum is verified and its last version checked against the X-Last-Version
    header, and only then does it reach `out`, renamed over it (OUT.part beside it: atomic)
    or copied into it (a pipe or a device: see `_output_kind`). Raises RequestFailed
    (naming the URL), BackupFormatError, or OSError (BackupOutputError for an output it
    refuses, before anything is downloaded); leaves no file behind on failure. With
    `show_progress`, the download's progress is drawn on stderr (`doq.progress`)."""
    from doq.backup.format import BackupReader

    url = server + "/db/backup"
    in_place = _output_kind(out) == "in_place"
    if in_place:
        fd, name = tempfile.mkstemp(prefix="doq-backup-", suffix=".part")  # mode 0600
        os.close(fd)
        tmp = Path(name)
    else:
        tmp = out.with_name(out.name + ".part")
    try:
        header_last = _download(url, {"since": since}, tmp, timeout_s, show_progress)
        with open(tmp, "rb") as f:
            summary = BackupReader(f).verify()
        if header_last is not None and header_last.strip() != str(summary.last_version):
            raise RequestFailed(f"{url}: X-Last-Version {header_last} disagrees with the file "
                                f"({summary.last_version})")
        if in_place:
            try:
                with open(tmp, "rb") as src, open(out, "wb") as dst:
                    shutil.copyfileobj(src, dst, CHUNK)
            except OSError as e:  # e.g. /dev/full: ENOSPC
                raise OSError(e.errno, f"cannot write the backup into it: {e.strerror}", str(out)) from None
        else:
            os.replace(tmp, out)
    finally:
        if in_place or tmp.exists():
            tmp.unlink(missing_ok=True)
    return summary


def cmd_restore(ns: argparse.Namespace) -> int:
    """Offline with --data-dir, otherwise online (POST /db/restore)."""
    paths = [ns.full, *ns.incremental]
    if ns.data_dir is not None and given(ns.server):
        return _fail("restore", "give either --data-dir or --server, not both", 2)
    try:
        where = ns.data_dir if ns.data_dir is not None else server_url(ns.server)
    except DoqError as e:
        return _fail("restore", e.message, 2)
    if (problem := _check_inputs(paths)) is not None:
        return _fail("restore", problem)
    try:
        if ns.data_dir is not None:
            res, where = _restore_offline(ns.data_dir, ns.node_id, ns.full, ns.incremental,
                                          show_progress=progress.wanted(ns.json))
        else:
            res = _restore_online(where, paths, ns.timeout, show_progress=progress.wanted(ns.json))
    except DoqError as e:
        return _fail("restore", e.message)
    except RequestFailed as e:
        return _fail("restore", str(e))
    print_result(
        ns,
        f"restored {res['records']} records ({res['tombstones']} tombstones) from {res['files']} "
        f"file(s) into {where}; version {res['to_version']}",
        {"target": where, **res},
    )
    return 0


class RequestFailed(Exception):
    """An HTTP request failed; the message names the URL."""


def _download(url: str, body: dict[str, Any], path: Path, timeout_s: float,
              show_progress: bool = False) -> str | None:
    """POST `body` as JSON to `url` and stream the answer into `path`; returns the
    X-Last-Version header. Raises RequestFailed (naming the URL) for any network or HTTP
    failure, OSError for a local file problem."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        resp = urllib.request.urlopen(req, timeout=timeout_s)
    except (OSError, http.client.HTTPException) as e:  # HTTPError, URLError, timeouts
        raise RequestFailed(describe_error(url, e)) from e
    expected = resp.headers.get("Content-Length")
    received = 0
    total = int(expected) if expected is not None and expected.isdigit() else None
    with resp, open_private_binary(path) as f, \
            progress.bytes_progress("backup", total, enabled=show_progress) as advance:  # 0600: every message
        while True:
            try:
                chunk = resp.read(CHUNK)
            except (OSError, http.client.HTTPException) as e:
                raise RequestFailed(describe_error(url, e)) from e
            if not chunk:
                break
            received += len(chunk)
            f.write(chunk)
            advance(len(chunk))
    if expected is not None and expected.isdigit() and received != int(expected):
        raise RequestFailed(f"{url}: the answer ended after {received} of {expected} bytes")
    return resp.headers.get("X-Last-Version")


def _restore_offline(data_dir: str, node_id: str, full: str, incrementals: list[str], *,
                     show_progress: bool = False) -> tuple[dict[str, Any], str]:
    """Restore into a stopped node's directory, holding its lock (refused while a node runs).
    With `show_progress`, the records written are counted on stderr (`doq.progress`)."""
    from dataclasses import asdict

    from doq.backup.ops import chain_record_total, restore_offline
    from doq.errors import FailedPrecondition
    from doq.storage.dirlock import NodeDirInUse, NodeDirLock
    from doq.storage.env import node_dir

    path = node_dir(data_dir, node_id)
    try:
        lock = NodeDirLock.acquire(path)
    except NodeDirInUse as e:
        raise FailedPrecondition(str(e), reason="NODE_RUNNING") from e
    except OSError as e:
        raise FailedPrecondition(f"cannot open data dir {path}: {e.strerror}", reason="DATA_DIR") from e
    done = False
    try:
        total = chain_record_total([full, *incrementals]) if show_progress else None
        with progress.count_progress("restore", total, "records", enabled=show_progress) as advance:
            res = restore_offline(data_dir, node_id, full, incrementals, advance=advance)
        done = True
    finally:
        lock.release(discard=not done)
    return asdict(res), str(path)


def _restore_online(server: str, paths: list[str], timeout: float, *, show_progress: bool = False) -> dict[str, Any]:
    """POST the files as multipart form fields `file` (in order), streamed from disk; returns
    the server's result (files, records, tombstones, to_version, last_version). With
    `show_progress`, the upload's progress is drawn on stderr (`doq.progress`)."""
    boundary = uuid.uuid4().hex
    heads = [
        (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
         f"filename=\"{os.path.basename(p)}\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
        for p in paths
    ]
    tail = f"--{boundary}--\r\n".encode()
    length = sum(len(h) + os.path.getsize(p) + 2 for h, p in zip(heads, paths, strict=True)) + len(tail)

    def body(advance: progress.Advance) -> Iterator[bytes]:
        for h, p in zip(heads, paths, strict=True):
            yield h
            with open(p, "rb") as f:
                while chunk := f.read(CHUNK):
                    advance(len(chunk))
                    yield chunk
            yield b"\r\n"
        yield tail

    url = server + "/db/restore"
    files_bytes = sum(os.path.getsize(p) for p in paths)
    try:
        with progress.bytes_progress("restore", files_bytes, enabled=show_progress) as advance:
            req = urllib.request.Request(
                url, data=body(advance), method="POST",
                headers={"Content-Type": f"multipart/form-data; boundary={boundary}", "Content-Length": str(length)},
            )
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                doc = json.loads(resp.read() or b"{}")
    except (OSError, http.client.HTTPException) as e:
        raise RequestFailed(describe_error(url, e)) from e
    except ValueError as e:
        raise RequestFailed(f"{url}: the answer is not JSON") from e
    keys = ("files", "records", "tombstones", "to_version", "last_version")
    return {k: doc.get(k, 0) for k in keys}
