"""`doq backup` and `doq restore` (hooked into `doq.cli` by `add_parser`). Standard library only.

    doq backup [--server URL] --since N -o FILE        prints the last version contained
    doq restore -f FULL [-i INC ...] --data-dir DIR [--node-id ID]     offline
    doq restore -f FULL [-i INC ...] [--server URL]                    online

`--server` defaults to $DOQ_SERVER or http://localhost:8001 (the seed's examples).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

from doq.errors import DoqError

DEFAULT_SERVER = "http://localhost:8001"
CHUNK = 1024 * 1024


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register the `backup` and `restore` subcommands."""
    b = sub.add_parser("backup", help="write a backup file of a running node (POST /db/backup)")
    b.add_argument("--server", default=None, help=f"node HTTP URL (env DOQ_SERVER; default {DEFAULT_SERVER})")
    b.add_argument("--since", type=int, default=0, help="0 = full; last+1 = the next incremental")
    b.add_argument("-o", "--output", required=True, help="backup file to write")
    b.add_argument("--timeout", type=float, default=3600.0, help="HTTP timeout in seconds")
    b.set_defaults(func=cmd_backup)

    r = sub.add_parser("restore", help="restore full + incremental backups (offline or online)")
    r.add_argument("-f", "--full", required=True, help="the full backup file (since 0)")
    r.add_argument("-i", "--incremental", action="append", default=[], metavar="INC",
                   help="an incremental backup, in order (repeatable)")
    r.add_argument("--data-dir", default=None, help="offline: a STOPPED node's data dir")
    r.add_argument("--node-id", default=None, help="offline: the node id (env DOQ_NODE_ID; default node-1)")
    r.add_argument("--server", default=None,
                   help=f"online: node HTTP URL (env DOQ_SERVER; default {DEFAULT_SERVER}) when no --data-dir")
    r.add_argument("--timeout", type=float, default=3600.0, help="HTTP timeout in seconds")
    r.set_defaults(func=cmd_restore)


def _server(ns: argparse.Namespace) -> str:
    return (ns.server or os.environ.get("DOQ_SERVER") or DEFAULT_SERVER).rstrip("/")


def _http_error(e: urllib.error.HTTPError) -> str:
    body = e.read().decode(errors="replace")
    try:
        doc = json.loads(body)
        detail = doc.get("detail") or doc.get("title") or body
        reason = doc.get("reason")
        return f"HTTP {e.code}: {detail}" + (f" ({reason})" if reason else "")
    except (ValueError, AttributeError):
        return f"HTTP {e.code}: {body.strip()[:500]}"


def cmd_backup(ns: argparse.Namespace) -> int:
    """POST /db/backup, stream the body to FILE (atomically), verify it, print the last version."""
    from doq.backup.format import BackupFormatError, BackupReader

    if ns.since < 0:
        print("doq backup: --since must be >= 0", file=sys.stderr)
        return 2
    out = Path(ns.output)
    tmp = out.with_name(out.name + ".part")
    req = urllib.request.Request(
        _server(ns) + "/db/backup", data=json.dumps({"since": ns.since}).encode(),
        headers={"Content-Type": "application/json"}, method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=ns.timeout) as resp, open(tmp, "wb") as f:
            header_last = resp.headers.get("X-Last-Version")
            while chunk := resp.read(CHUNK):
                f.write(chunk)
        with open(tmp, "rb") as f:
            summary = BackupReader(f).verify()
    except urllib.error.HTTPError as e:
        tmp.unlink(missing_ok=True)
        print(f"doq backup: {_http_error(e)}", file=sys.stderr)
        return 1
    except (OSError, BackupFormatError) as e:
        tmp.unlink(missing_ok=True)
        msg = e.message if isinstance(e, DoqError) else str(e)
        print(f"doq backup: {msg}", file=sys.stderr)
        return 1
    if header_last is not None and int(header_last) != summary.last_version:
        tmp.unlink(missing_ok=True)
        print(f"doq backup: X-Last-Version {header_last} disagrees with the file "
              f"({summary.last_version})", file=sys.stderr)
        return 1
    os.replace(tmp, out)
    print(summary.last_version)
    return 0


def cmd_restore(ns: argparse.Namespace) -> int:
    """Offline with --data-dir, otherwise online (POST /db/restore)."""
    paths = [ns.full, *ns.incremental]
    try:
        if ns.data_dir is not None:
            if ns.server:
                print("doq restore: give either --data-dir or --server, not both", file=sys.stderr)
                return 2
            from doq.backup.ops import restore_offline

            node_id = ns.node_id or os.environ.get("DOQ_NODE_ID") or "node-1"
            res = restore_offline(ns.data_dir, node_id, ns.full, ns.incremental)
            print(f"restored {res.records} records ({res.tombstones} tombstones) from "
                  f"{res.files} file(s) into {Path(ns.data_dir) / node_id}; version {res.to_version}")
            return 0
        return _restore_online(_server(ns), paths, ns.timeout)
    except DoqError as e:
        print(f"doq restore: {e.message}", file=sys.stderr)
        return 1


def _restore_online(server: str, paths: list[str], timeout: float) -> int:
    """POST the files as multipart form fields `file` (in order), streamed from disk."""
    for p in paths:
        if not os.path.isfile(p):
            print(f"doq restore: no such file: {p}", file=sys.stderr)
            return 1
    boundary = uuid.uuid4().hex
    heads = [
        (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
         f"filename=\"{os.path.basename(p)}\"\r\nContent-Type: application/octet-stream\r\n\r\n").encode()
        for p in paths
    ]
    tail = f"--{boundary}--\r\n".encode()
    length = sum(len(h) + os.path.getsize(p) + 2 for h, p in zip(heads, paths, strict=True)) + len(tail)

    def body() -> Iterator[bytes]:
        for h, p in zip(heads, paths, strict=True):
            yield h
            with open(p, "rb") as f:
                while chunk := f.read(CHUNK):
                    yield chunk
            yield b"\r\n"
        yield tail

    req = urllib.request.Request(
        server + "/db/restore", data=body(), method="POST",
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}", "Content-Length": str(length)},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode(errors="replace").strip()
    except urllib.error.HTTPError as e:
        print(f"doq restore: {_http_error(e)}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"doq restore: {server}: {e}", file=sys.stderr)
        return 1
    print(text or "restored")
    return 0
