"""The state digest: one definition (doq.storage.digest) that the node computes over its
LMDB records and that a backup records in its footer; version-1 files without it read."""

from __future__ import annotations

import io
import json
import random
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import lmdb
import pytest

from doq.backup.format import BackupFormatError, BackupReader, write_records
from doq.backup.ops import write_backup
from doq.queues import commands as c
from doq.queues.model import QueueSettings
from doq.storage import digest as D
from doq.storage.env import open_env
from doq.storage.state import StateStore
from tests.backup.fakes import FakeState
from tests.storage.test_state import _batch, apply
from tests.storage.workload import T0, entries
from tests.support.proc import NodeProc

WORK = entries(seed=11, n=500)


def _open(path: Path) -> tuple[lmdb.Environment, StateStore]:
    env = open_env(path)
    return env, StateStore(env)


def _full_state(st: StateStore) -> list[tuple[bytes, bytes | None, int]]:
    return [r for r in st.iter_changes(0) if r[1] is not None]


def test_the_digest_is_a_sum_independent_of_order() -> None:
    recs = [(bytes([i]) * (i % 7 + 1), bytes(i), i + 1) for i in range(50)]
    shuffled = recs[:]
    random.Random(3).shuffle(shuffled)
    d = D.digest_of(recs)
    assert d == D.digest_of(shuffled) == D.combine(D.digest_of(recs[:20]), D.digest_of(recs[20:]))
    assert D.remove(d, D.digest_of(recs[:20])) == D.digest_of(recs[20:])
    assert D.digest_of([]) == D.EMPTY == 0
    assert D.digest_of([*recs, (b"gone", None, 99)]) == d  # tombstones are not state
    # key, value and version all count; the key length prefix keeps key/value apart
    assert D.item_hash(b"ab", b"c", 1) != D.item_hash(b"a", b"bc", 1)
    assert D.item_hash(b"a", b"b", 1) != D.item_hash(b"a", b"b", 2)
    assert D.item_hash_stored(b"a", (7).to_bytes(8, "big") + b"xyz") == D.item_hash(b"a", b"xyz", 7)
    assert D.parse_hex(D.hex_digest(d)) == d and D.from_bytes(D.to_bytes(d)) == d
    assert len(D.hex_digest(0)) == 64


def test_the_node_digest_equals_the_digest_of_its_records_and_survives_a_restore(tmp_path: Path) -> None:
    env, st = _open(tmp_path / "live")
    apply(env, st, WORK, chunk=25)
    apply(env, st, [_batch(len(WORK) + 1, T0 + 10**7, c.DeleteQueue("d"))])
    applied, d = st.state_digest()
    assert applied == st.applied_index == len(WORK) + 1
    assert d == D.digest_of(_full_state(st)) != 0
    # the digest is a function of the records only: a restored copy has the same one
    renv, rst = _open(tmp_path / "restored")
    rst.restore(list(st.iter_changes(0)), applied)
    assert rst.state_digest() == (applied, d)
    # and any change of state changes it
    apply(env, st, [_batch(len(WORK) + 2, T0 + 10**7 + 1, c.CreateQueue("z", "delayed", QueueSettings()))])
    assert st.state_digest()[1] != d


def test_a_backup_records_the_digest_of_the_whole_state_at_its_to_version(tmp_path: Path) -> None:
    env, st = _open(tmp_path / "live")
    apply(env, st, WORK[:250], chunk=10)
    full = io.BytesIO()
    last0 = write_backup(st, 0, full)
    d0 = st.state_digest()
    apply(env, st, WORK[250:], chunk=10)
    inc = io.BytesIO()
    write_backup(st, last0 + 1, inc)
    d1 = st.state_digest()
    for buf, (applied, d) in ((full, d0), (inc, d1)):
        buf.seek(0)
        s = BackupReader(buf).verify()
        assert (s.header.to_version, s.state_digest) == (applied, d)
    assert d0[1] != d1[1]


def test_snapshot_changes_takes_digest_and_records_from_one_read_txn(tmp_path: Path) -> None:
    env, st = _open(tmp_path / "live")
    apply(env, st, WORK[:100])
    applied, d, it = st.snapshot_changes(0)
    apply(env, st, WORK[100:200])  # commits while the snapshot is open
    records = list(it)
    assert applied == 100
    assert D.digest_of(r for r in records if r[1] is not None) == d


def test_fake_state_digest_matches_its_live_records() -> None:
    fs = FakeState()
    fs.apply(1, {b"a": b"1", b"b": b"2"})
    fs.apply(2, {b"a": None})
    assert fs.snapshot_changes(0)[1] == D.digest_of([(b"b", b"2", 1)])


# -- format: version-1 files without a digest still read -----------------------------------
SMALLEST_V1 = bytes.fromhex(  # docs/backup.md: the 64-byte file the first writer produced
    "444f5142414b310a0100000006000000" "32047a737464" "4a1921f5" "30cab284a90f"
    "1a00000000000000060000000000000008792" "0a80100" "0000444f5142414b450a")


def test_a_version_1_file_without_a_digest_still_reads() -> None:
    assert len(SMALLEST_V1) == 64
    s = BackupReader(io.BytesIO(SMALLEST_V1)).verify()
    assert (s.state_digest, s.record_count, s.header.format_version) == (None, 0, 1)
    buf = io.BytesIO()
    write_records(buf, [(b"k", b"v", 1)], from_version=0, to_version=1)  # no digest given
    buf.seek(0)
    assert BackupReader(buf).verify().state_digest is None


def test_a_recorded_digest_round_trips_and_a_malformed_one_is_refused() -> None:
    buf = io.BytesIO()
    d = D.digest_of([(b"k", b"v", 1)])
    write_records(buf, [(b"k", b"v", 1)], from_version=0, to_version=1, state_digest=d)
    buf.seek(0)
    assert BackupReader(buf).verify().state_digest == d
    # the zero digest (empty state) is recorded as 32 zero bytes, not as "absent"
    buf = io.BytesIO()
    write_records(buf, [], from_version=0, to_version=0, state_digest=0)
    buf.seek(0)
    assert BackupReader(buf).summary.state_digest == 0


def test_every_flipped_byte_is_caught_with_an_offset() -> None:
    recs = [(b"M" + bytes([i % 5]) * 10, None if i % 9 == 0 else b"v" * (i % 40), i + 1) for i in range(300)]
    buf = io.BytesIO()
    write_records(buf, recs, from_version=0, to_version=300, frame_bytes=700,
                  state_digest=D.digest_of(recs), cluster_id="c", node_id="n")
    data = buf.getvalue()
    assert len(BackupReader(io.BytesIO(data)).frames) > 3
    for pos in range(len(data)):
        bad = bytearray(data)
        bad[pos] ^= 0x40
        try:
            BackupReader(io.BytesIO(bytes(bad))).verify()
        except BackupFormatError as e:
            assert e.offset is not None and 0 <= e.offset <= len(data), (pos, e.message)
        else:
            raise AssertionError(f"a flipped byte at {pos} of {len(data)} went unnoticed")


@pytest.mark.integration
def test_get_db_digest_of_a_live_node_is_the_one_its_backups_record(doq_node: NodeProc, tmp_path: Path) -> None:
    def call(method: str, path: str, body: object | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(doq_node.http_url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"null")

    empty = call("GET", "/db/digest")
    assert empty["digest"] == "0" * 64
    call("POST", "/API/v1/queues", {"name": "q", "type": "delayed"})
    call("POST", "/API/v1/queues/q/messages", {"content": "hello"})
    live = call("GET", "/db/digest")
    out = tmp_path / "full.bak"
    r = subprocess.run([sys.executable, "-m", "doq", "backup", "--server", doq_node.http_url, "-o", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    with open(out, "rb") as f:
        s = BackupReader(f).summary
    assert (s.header.to_version, D.hex_digest(s.state_digest or 0)) == (live["applied_index"], live["digest"])
    assert live["digest"] != empty["digest"] and live["applied_index"] > empty["applied_index"]
