"""`doq queues ...`, `doq enqueue`, `doq dequeue`, `doq top`, `doq --version` against a real
`doq serve` process (real HTTP gateway, real LMDB): human tables and `--json`, exit
statuses, errors on stderr. The commands run as child processes, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tests.support.proc import NodeProc, refused_addr, running_node

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    with running_node(tmp_path_factory.mktemp("qcli") / "data") as n:
        yield n


def doq(node: NodeProc | None, *args: str, ok: bool = True, env: dict[str, str] | None = None,
        ) -> subprocess.CompletedProcess[str]:
    """Run `doq ARGS` (with `--server` set to the node, unless `node` is None)."""
    server = ["--server", node.http_url] if node is not None else []
    proc = subprocess.run([sys.executable, "-m", "doq", *args, *server], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def rows(out: str) -> list[list[str]]:
    """The table's rows (header first), split on runs of spaces."""
    return [line.split() for line in out.splitlines() if line.strip()]


def test_version() -> None:
    proc = subprocess.run([sys.executable, "-m", "doq", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    name, version = proc.stdout.split()
    assert name == "doq" and version[0].isdigit()


def test_create_list_stats_delete(node: NodeProc) -> None:
    assert doq(node, "queues", "create", "cli-delayed").stdout.strip() == "created delayed queue cli-delayed"
    doc = json.loads(doq(node, "queues", "create", "cli-fair", "--type", "fair", "--max-attempts", "3",
                         "--default-group-weight", "2", "--default-group-max-per-second", "50",
                         "--json").stdout)
    assert doc["name"] == "cli-fair" and doc["type"] == "fair" and doc["settings"]["max_attempts"] == 3
    assert (doc["settings"]["default_group_weight"], doc["settings"]["default_group_max_per_second"]) == (2, 50)

    table = rows(doq(node, "queues", "list").stdout)
    assert table[0] == ["NAME", "TYPE", "READY", "DELAYED", "IN", "FLIGHT", "DEAD", "TOTAL"]
    by_name = {r[0]: r for r in table[1:]}
    assert by_name["cli-fair"][1:] == ["fair", "0", "0", "0", "0", "0"]
    assert by_name["cli-delayed"][1] == "delayed"
    listed = json.loads(doq(node, "queues", "list", "--json").stdout)
    assert {"cli-fair", "cli-delayed"} <= {q["name"] for q in listed["queues"]}

    stats = dict((r[0], r[-1]) for r in rows(doq(node, "queues", "stats", "cli-fair").stdout)[1:])
    assert stats["type"] == "fair" and stats["ready"] == "0"
    assert json.loads(doq(node, "queues", "stats", "cli-fair", "--json").stdout)["settings"]["max_attempts"] == 3

    assert doq(node, "queues", "delete", "cli-fair").stdout.strip() == "deleted queue cli-fair"
    assert "cli-fair" not in {q["name"] for q in json.loads(doq(node, "queues", "list", "--json").stdout)["queues"]}


def test_enqueue_dequeue_ack_and_purge(node: NodeProc) -> None:
    doq(node, "queues", "create", "cli-work", "--type", "fair")
    first = doq(node, "enqueue", "cli-work", "hello", "--group", "tenant-a", "--priority", "5").stdout
    assert first.startswith("enqueued ") and first.strip().endswith(" to cli-work")
    second = json.loads(doq(node, "enqueue", "cli-work", "world", "--group", "tenant-b", "--dedup-id", "d1",
                            "--json").stdout)
    again = json.loads(doq(node, "enqueue", "cli-work", "world", "--group", "tenant-b", "--dedup-id", "d1",
                           "--json").stdout)
    assert again["duplicate"] is True and again["id"] == second["id"]
    doq(node, "enqueue", "cli-work", "later", "--delay-ms", "600000")

    stats = json.loads(doq(node, "queues", "stats", "cli-work", "--json").stdout)["stats"]
    assert (stats["ready"], stats["delayed"]) == (2, 1)

    leased = rows(doq(node, "dequeue", "cli-work").stdout)
    assert leased[0] == ["ID", "GROUP", "PRIORITY", "ATTEMPTS", "LEASE", "ID", "CONTENT"]
    assert len(leased) == 2 and leased[1][1] == "tenant-a" and leased[1][-1] == "hello"
    taken = json.loads(doq(node, "dequeue", "cli-work", "-n", "5", "--ack", "--json").stdout)["messages"]
    assert [m["content"] for m in taken] == ["world"] and taken[0]["id"] == second["id"]
    assert doq(node, "dequeue", "cli-work", "--ack").stdout.strip() == "no message ready in cli-work"

    stats = json.loads(doq(node, "queues", "stats", "cli-work", "--json").stdout)["stats"]
    assert (stats["ready"], stats["delayed"], stats["in_flight"]) == (0, 1, 1)
    assert doq(node, "queues", "purge", "cli-work").stdout.strip() == "purged 2 messages from cli-work"
    assert json.loads(doq(node, "queues", "stats", "cli-work", "--json").stdout)["stats"]["total"] == 0


def test_peek_looks_without_taking(node: NodeProc) -> None:
    doq(node, "queues", "create", "cli-peek")
    for prio in (3, 1, 2):
        doq(node, "enqueue", "cli-peek", f"p{prio}", "--priority", str(prio))
    table = rows(doq(node, "peek", "cli-peek").stdout)
    assert table[0] == ["ID", "GROUP", "PRIORITY", "ATTEMPTS", "CONTENT"]
    assert [r[-1] for r in table[1:]] == ["p1", "p2", "p3"]  # delivery order
    page = json.loads(doq(node, "peek", "cli-peek", "-n", "1", "--offset", "1", "--json").stdout)
    assert [m["content"] for m in page["messages"]] == ["p2"] and page["next_offset"] == 2
    assert json.loads(doq(node, "queues", "stats", "cli-peek", "--json").stdout)["stats"]["in_flight"] == 0
    assert doq(node, "peek", "cli-peek", "--state", "delayed").stdout.strip() == "no delayed message in cli-peek"
    bad = doq(node, "peek", "cli-peek", "-n", "0", ok=False)
    assert bad.returncode == 1 and "HTTP 400" in bad.stderr


def test_top_draws_the_queues_table(node: NodeProc) -> None:
    doq(node, "queues", "create", "cli-top")
    doq(node, "enqueue", "cli-top", "x")
    out = doq(node, "top", "--iterations", "2", "--interval", "0.1").stdout
    assert "doq top" in out and node.http_url in out
    line = next(r for r in rows(out) if r and r[0] == "cli-top")
    assert line[1:3] == ["delayed", "1"]
    docs = [json.loads(x) for x in doq(node, "top", "--iterations", "2", "--interval", "0.1", "--json")
            .stdout.splitlines()]
    assert len(docs) == 2 and "cli-top" in {q["name"] for q in docs[0]["queues"]}


def test_server_from_env_and_errors(node: NodeProc) -> None:
    listed = doq(None, "queues", "list", "--json", env={"DOQ_SERVER": node.http_url})
    assert "queues" in json.loads(listed.stdout)

    missing = doq(node, "queues", "stats", "no-such-queue", ok=False)
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.startswith("doq queues stats: ") and "HTTP 404" in missing.stderr

    doq(node, "queues", "create", "cli-dup")
    assert doq(node, "queues", "create", "cli-dup").returncode == 0  # the same queue again: idempotent
    dup = doq(node, "queues", "create", "cli-dup", "--type", "fair", ok=False)
    assert dup.returncode == 1 and "HTTP 409" in dup.stderr and "already exists" in dup.stderr

    with refused_addr() as nobody:
        dead = doq(None, "queues", "list", "--server", f"http://{nobody}", ok=False)
    assert dead.returncode == 1 and "cannot reach" in dead.stderr
    bad = doq(None, "queues", "list", "--server", "ftp://x", ok=False)
    assert bad.returncode == 2 and "--server must be an http(s) URL" in bad.stderr


def test_a_closed_pipe_is_not_an_error(node: NodeProc) -> None:
    """`doq queues list | head -1`: the reader is gone before the table is written."""
    doq(node, "queues", "create", "cli-pipe")
    proc = subprocess.Popen([sys.executable, "-m", "doq", "queues", "list", "--server", node.http_url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # long before the child has its answer to print
    err = proc.stderr.read().decode()
    assert proc.wait(120) == 141, err  # as a shell reports a command a closed pipe stopped
    assert "Traceback" not in err and "BrokenPipe" not in err
