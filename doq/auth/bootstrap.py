"""The first admin key of a secure cluster: `<data_dir>/admin.key`, printed once.

On a node that requires keys, `ensure_admin_key` waits until the node either sees a key
in the replicated table (nothing to do: the cluster has keys) or leads a state without
any. As the leader of a keyless state, if `<data_dir>/admin.key` does not exist, it
generates an admin key, writes the file (mode 0600, the key on one line, created
exclusively) and only then proposes the key. It prints the key once on stdout (never to
the log) only when stdout is a terminal or `print_key` is set (`--print-admin-key`):
a node's stdout is otherwise usually a log someone else reads (a Kubernetes pod's log, a
journal), so then it prints only where the file is. A failed proposal removes the file again. If the file exists while the table
is empty (a crash between the write and the commit, or a file left from another
cluster), it logs a warning and creates nothing: remove the file to get a new key.

So a bootstrapping node writes the file on its first secure start, and so does the
leader of a cluster that ran without keys and is restarted with them.

With `--admin-key-file FILE` (a key the operator made, e.g. a Kubernetes Secret the Pulumi
program generated) that leader registers the key in FILE instead: no `admin.key` is
written and nothing is printed (the operator has the key already). Every member may be
given the same file: only the leader of a state without keys registers it, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from pathlib import Path

from doq.auth.admin import create_key
from doq.auth.tokens import NewKey, hash_of, key_id_of, new_key
from doq.errors import DoqError, OutcomeUnknown
from doq.node.base import Node

log = logging.getLogger("doq.auth")
ADMIN_KEY_FILE = "admin.key"


def write_key_file(path: Path, token: str) -> None:
    """Create `path` (0600, whatever the umask; fails if it exists) holding `token` + newline."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_admin_key_file(path: str) -> NewKey | None:
    """The key in `path` (`--admin-key-file`; "" : None). ValueError, naming the file but
    never its content, if it cannot be read or holds no well-formed key."""
    if not path:
        return None
    try:
        token = Path(path).read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--admin-key-file {path}: cannot read it ({type(e).__name__})") from None
    key_id = key_id_of(token)
    if key_id is None or any(c.isspace() for c in token):
        raise ValueError(f"--admin-key-file {path}: not a doq key (one line doq_<id>_<secret>)")
    return NewKey(key_id, token, hash_of(token))


def announce(key_id: str, path: Path, token: str, *, print_key: bool | None = None) -> None:
    """Tell the operator about a new admin key on stdout: the key itself only to a terminal
    (or with `print_key`), else the file that holds it."""
    if print_key is None:
        print_key = sys.stdout.isatty()
    if print_key:
        print(f"doq: admin key {key_id} written to {path} (shown once): {token}", flush=True)
    else:
        print(f"doq: admin key {key_id} written to {path} (mode 0600; not printed: stdout is not a "
              "terminal, see --print-admin-key)", flush=True)


async def ensure_admin_key(node: Node, data_dir: str | Path, *, provided: NewKey | None = None,
                           poll_s: float = 0.1, print_key: bool | None = None) -> str | None:
    """See the module docstring. Returns the key's id if this call created one; retries
    while the proposal meets a retryable error (e.g. leadership moved). `print_key`: print
    the key (True), only the file (False), or the key only if stdout is a terminal (None)."""
    path = Path(data_dir) / ADMIN_KEY_FILE
    unknown: NewKey | None = None  # a generated key whose proposal's outcome is unknown
    while True:
        if keys := node.state.keys():
            if unknown is not None and unknown.id in keys:  # it committed after all
                announce(unknown.id, path, unknown.token, print_key=print_key)
                return unknown.id
            return None
        if not (node.is_leader and node.is_ready()):
            await asyncio.sleep(poll_s)
            continue
        if provided is not None:
            try:
                created = await create_key(node, ("admin",), key=provided)
            except DoqError as e:
                if not e.retryable and not isinstance(e, OutcomeUnknown):  # (it may have committed: look again)
                    raise
                log.info("registering the provided admin key: %s; trying again", e.reason)
                await asyncio.sleep(poll_s)
                continue
            log.info("admin key %s (from --admin-key-file) registered", created.record.id)
            return created.record.id
        if unknown is None and path.exists():
            log.warning("no client key exists but %s does: not creating one (remove the file to have a "
                        "new admin key generated)", path)
            return None
        new = unknown or new_key()
        if unknown is None:
            write_key_file(path, new.token)
        try:
            created = await create_key(node, ("admin",), key=new)
        except OutcomeUnknown:  # it may still commit: keep its file, look again (or propose it again)
            unknown = new
            await asyncio.sleep(poll_s)
            continue
        except DoqError as e:
            with contextlib.suppress(OSError):
                path.unlink()
            if not e.retryable:
                raise
            log.info("creating the admin key: %s; trying again", e.reason)
            await asyncio.sleep(poll_s)
            continue
        except BaseException:
            with contextlib.suppress(OSError):
                path.unlink()
            raise
        announce(created.record.id, path, new.token, print_key=print_key)
        return created.record.id
