"""Online restore into a real three-node cluster of `doq serve` processes on 127.0.0.1: it goes
through the Raft log, so every member ends with the state an offline restore of the same
chain gives (the same `GET /db/digest`), all or nothing — also when the leader is killed
(SIGKILL) in the middle of it."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from doq.storage.state import STAGE_CHUNK, STAGE_KEY
from tests.support.cluster import (
    alive,
    call,
    cluster_view,
    leader,
    leader_id,
    node_files,
    node_procs,
    running_cluster,
    until,
)
from tests.support.proc import NodeProc
from tests.support.restore_chain import RestoreChain, build_chain, digest_of_offline_restore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
EMPTY_DIGEST = "0" * 64


def post_restore(node: NodeProc, paths: list[Path], timeout_s: float = 300) -> tuple[int, Any]:
    """`POST /db/restore` with the files as multipart fields `file`, in order."""
    handles = [open(p, "rb") for p in paths]  # noqa: SIM115 - closed below
    try:
        r = httpx.post(node.http_url + "/db/restore", timeout=timeout_s,
                       files=[("file", (p.name, f, "application/octet-stream")) for p, f in zip(paths, handles, strict=True)])
        return r.status_code, r.json()
    finally:
        for f in handles:
            f.close()


def backup(node: NodeProc, since: int, out: Path) -> int:
    """`POST /db/backup` into `out`; returns X-Last-Version."""
    r = httpx.post(node.http_url + "/db/backup", json={"since": since}, timeout=120)
    assert r.status_code == 200, r.text
    out.write_bytes(r.content)
    return int(r.headers["X-Last-Version"])


def digest(node: NodeProc) -> str:
    status, body = call(node, "GET", "/db/digest")
    assert status == 200, body
    return str(body["digest"])


def converged_digests(nodes: list[NodeProc]) -> dict[str, str]:
    """The digests of the live nodes once they all applied the same index."""
    live = [n for n in nodes if alive(n)]

    def same() -> dict[str, str] | None:
        views = [cluster_view(n.http_url) for n in live]
        if len({v["applied_index"] for v in views}) != 1 or not views[0]["leader_id"]:
            return None
        return {n.node_id: digest(n) for n in live}

    return dict(until("the live nodes at one applied index", same))


def hexd(d: int) -> str:
    return f"{d:064x}"


def applied(node: NodeProc) -> int:
    return int(cluster_view(node.http_url)["applied_index"])


def no_staging_left(nodes: list[NodeProc]) -> None:
    for n in nodes:
        n.kill9()
        with node_files(n) as (state, _):
            with state.env.begin() as txn:
                keys = [bytes(k) for k, _ in txn.cursor(db=state._meta).iternext()]
        assert STAGE_KEY not in keys and not any(k.startswith(STAGE_CHUNK) for k in keys), n.node_id


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> RestoreChain:
    return build_chain(tmp_path_factory.mktemp("chain"), messages=400)


def test_a_cluster_restores_through_a_follower_and_a_node_that_was_down_catches_up(
        tmp_path: Path, chain: RestoreChain) -> None:
    nodes = node_procs(tmp_path / "data", ["--snapshot-every", "8", "--keep-entries", "0",
                                           "--restore-chunk-bytes", "4096"])
    with running_cluster(nodes):
        lead = leader(nodes)
        down = next(n for n in nodes if n is not lead)
        via = next(n for n in nodes if n is not lead and n is not down)
        down.kill9()
        down_at = applied(lead)

        # a damaged file: refused before anything is proposed, nothing changes
        damaged = tmp_path / "inc-damaged.bak"
        raw = bytearray(chain.inc.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        damaged.write_bytes(bytes(raw))
        before = applied(lead)
        status, body = post_restore(via, [chain.full, damaged])
        assert status == 400 and body["reason"].startswith("BACKUP_") and "inc-damaged.bak" in body["detail"], body
        assert applied(lead) == before and digest(lead) == EMPTY_DIGEST

        # the seed's command line, against a follower: it forwards to the leader
        out = subprocess.run(
            [sys.executable, "-m", "doq", "restore", "-f", str(chain.full), "-i", str(chain.inc),
             "--server", via.http_url, "--json"], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert applied(lead) - down_at > 10  # the chunks and the commit went through the log
        live = converged_digests(nodes)
        assert set(live.values()) == {hexd(chain.digest)}, live
        assert {call(n, "GET", "/db/digest")[1]["cluster_id"] for n in nodes if alive(n)} == {chain.cluster_id}

        # a non-empty cluster refuses, and nothing changes
        status, body = post_restore(lead, chain.paths)
        assert (status, body["reason"]) == (409, "RESTORE_TARGET_NOT_EMPTY"), body
        assert converged_digests(nodes) == live

        # writes after the restore get versions above the restored ones: an incremental
        # backup after it holds them, and the whole chain restores to the live digest
        r = httpx.post(via.http_url + "/API/v1/queues/jobs/messages", json={"content": "after"}, timeout=30)
        assert r.status_code == 201, r.text
        post = tmp_path / "post.bak"
        last = backup(via, chain.to_version + 1, post)
        assert last > chain.to_version

        # it catches up: from the log (the leader's transport kept the appends it could not
        # deliver) or by a snapshot (the leader's log is compacted every 8 entries)
        down.start(timeout_s=120)
        live = converged_digests(nodes)
        assert len(set(live.values())) == 1 and down.node_id in live
        assert set(live.values()) == {hexd(digest_of_offline_restore([*chain.paths, post], tmp_path / "off"))}
        no_staging_left(nodes)


def test_a_leader_killed_mid_restore_changes_nothing_and_a_retry_works(tmp_path: Path) -> None:
    big = build_chain(tmp_path / "chain", messages=16_000, content_bytes=400)
    nodes = node_procs(tmp_path / "data", ["--restore-chunk-bytes", "8192"])
    with running_cluster(nodes):
        old = leader(nodes)
        start = applied(old)
        answer: list[object] = []

        def run() -> None:
            try:
                answer.append(post_restore(old, big.paths))
            except httpx.HTTPError as e:
                answer.append(e)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        until("chunks applied on the leader", lambda: applied(old) >= start + 8, 120)
        assert not answer, answer  # still in the middle (some 900 chunks to go)
        old.kill9()
        t.join(60)
        assert answer and not (isinstance(answer[0], tuple) and answer[0][0] == 200), answer
        survivors = [n for n in nodes if n is not old]
        ids = {n.node_id for n in survivors}
        until("a new leader", lambda: leader_id(survivors) in ids)
        for n in survivors:  # (a member answers its digest once it knows the new leader: a read barrier)
            until(f"{n.node_id} knows the leader", lambda n=n: call(n, "GET", "/db/digest")[0] == 200)
            assert digest(n) == EMPTY_DIGEST
            assert call(n, "GET", "/API/v1/queues")[1]["queues"] == []

        t0 = time.monotonic()
        status, body = post_restore(survivors[1], big.paths)  # through any member
        assert status == 200, body
        assert body["to_version"] == big.to_version and body["files"] == 2
        seconds = time.monotonic() - t0
        print(f"restore of {big.full.stat().st_size} bytes through 2 live members: {seconds:.1f} s")
        assert set(converged_digests(survivors).values()) == {hexd(big.digest)}, f"restore took {seconds:.1f}s"
        old.start(timeout_s=120)
        assert set(converged_digests(nodes).values()) == {hexd(big.digest)}
        no_staging_left(nodes)
