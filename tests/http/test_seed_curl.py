"""The seed's examples (CONTRACT.md), run verbatim with the real `curl` and the real `doq`
against real `doq serve` processes; only `localhost:8001` is replaced by the node's address
(for `doq restore`, through DOQ_SERVER)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.proc import NodeProc, running_node

pytestmark = pytest.mark.integration

# Verbatim from CONTRACT.md, "The seed's own examples".
SEED = r"""
curl -X POST http://localhost:8001/API/v1/queues -H 'Content-Type: application/json' \
  -d '{"name": "user_indexing_queue", "type": "delayed"}'
curl -X POST http://localhost:8001/API/v1/queues/user_indexing_queue/messages \
  -H 'Content-Type: application/json' \
  -d '{"content": "{\"user_id\": 1}", "group": "default", "priority": 60}'
curl 'http://localhost:8001/API/v1/queues/user_indexing_queue/messages?ack=true'
curl -X POST http://localhost:8001/API/v1/queues/user_indexing_queue/messages/123/ack
curl -X PUT http://localhost:8001/API/v1/queues/user_indexing_queue/messages/123/priority \
  -H 'Content-Type: application/json' -d '{"priority": 12}'
curl -X DELETE http://localhost:8001/API/v1/queues/user_indexing_queue
curl -X POST http://localhost:8001/db/backup -H 'Content-Type: application/json' \
  -d '{"since": 0}' -o backup-0.bak        # response header X-Last-Version
curl -X POST http://localhost:8001/db/restore -F 'file=@backup-0.bak'
doq restore -f backup-0.bak -i backup-1.bak -i backup-2.bak
"""


def seed_commands() -> list[str]:
    """The seed block as one shell command per example (continuation lines joined)."""
    return [c.strip() for c in SEED.replace("\\\n", " ").strip().splitlines() if c.strip()]


def curl(cmd: str, node: NodeProc, cwd: Path) -> tuple[int, str]:
    """Run one seed command through the shell with the node's address; (HTTP status, body).

    The command is not otherwise changed: a `.curlrc` in CURL_HOME adds `--silent` and a
    write-out of the status on its own last line.
    """
    assert cmd.startswith("curl ")
    cmd = cmd.replace("localhost:8001", f"127.0.0.1:{node.http_port}")
    (cwd / ".curlrc").write_text('silent\nwrite-out = "\\n%{http_code}"\n')
    out = subprocess.run(
        cmd, shell=True, cwd=cwd, capture_output=True, text=True, timeout=30, check=True,
        env={**os.environ, "CURL_HOME": str(cwd)},
    ).stdout
    body, _, status = out.rpartition("\n")
    return int(status), body


def post_json(node: NodeProc, path: str, doc: object) -> dict[str, object]:
    req = urllib.request.Request(node.http_url + path, data=json.dumps(doc).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def get(node: NodeProc, path: str) -> tuple[int, bytes, dict[str, str]]:
    try:
        with urllib.request.urlopen(node.http_url + path, timeout=10) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def problem(body: str, status: int, reason: str) -> None:
    doc = json.loads(body)
    assert doc["status"] == status and doc["reason"] == reason, doc


def test_seed_curl_examples_verbatim(tmp_path: Path) -> None:
    create, enqueue, dequeue, ack, priority, delete, backup, restore, _ = seed_commands()
    with running_node(tmp_path / "a") as node, running_node(tmp_path / "b") as fresh:
        status, body = curl(create, node, tmp_path)
        assert status == 201
        assert json.loads(body)["queue"]["name"] == "user_indexing_queue"

        status, body = curl(enqueue, node, tmp_path)
        assert status == 201
        first = json.loads(body)
        assert isinstance(first["id"], str) and first["id"].isdigit()
        assert first["priority"] == 60 and first["group"] == "default"

        # ids 123 is needed by the ack example: fill up to it (priority 61 sorts after the seed's 60)
        more = 123 - int(first["id"])
        res = post_json(node, "/API/v1/queues/user_indexing_queue/messages:batch",
                        {"messages": [{"content": f"m{i}", "priority": 61 if i == more - 1 else 100} for i in range(more)]})
        assert res["results"][-1]["id"] == "123"  # type: ignore[index]

        status, body = curl(dequeue, node, tmp_path)
        assert status == 200
        msg = json.loads(body)
        assert msg["id"] == first["id"] and msg["content"] == '{"user_id": 1}' and msg["priority"] == 60

        status, raw, _ = get(node, "/API/v1/queues/user_indexing_queue/messages?ack=false")  # leases 123
        assert status == 200 and json.loads(raw)["id"] == "123"

        status, body = curl(ack, node, tmp_path)
        assert (status, json.loads(body)) == (200, {"success": True})

        status, body = curl(priority, node, tmp_path)  # 123 was acked: gone
        assert status == 404
        problem(body, 404, "MESSAGE_NOT_FOUND")
        status, raw, _ = get(node, "/API/v1/queues/user_indexing_queue")
        assert json.loads(raw)["stats"]["ready"] == 121

        status, body = curl(delete, node, tmp_path)
        assert (status, json.loads(body)) == (200, {"success": True})
        status, raw, _ = get(node, "/API/v1/queues/user_indexing_queue")
        assert status == 404

        status, body = curl(backup, node, tmp_path)
        assert status == 200, body
        data = (tmp_path / "backup-0.bak").read_bytes()
        assert data.startswith(b"DOQBAK1\n")

        status, body = curl(restore, fresh, tmp_path)  # into a fresh (empty) node
        assert status == 200, body
        res = json.loads(body)
        assert res["success"] is True and res["files"] == 1 and res["records"] > 0

        status, body = curl(restore, fresh, tmp_path)  # not empty any more: refused, nothing changed
        problem(body, 409, "RESTORE_TARGET_NOT_EMPTY")


def backup_to(node: NodeProc, since: int, path: Path) -> int:
    """`POST /db/backup {"since"}` into `path`; returns X-Last-Version."""
    req = urllib.request.Request(node.http_url + "/db/backup", data=json.dumps({"since": since}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        path.write_bytes(r.read())
        return int(r.headers["X-Last-Version"])


def state_of(node: NodeProc) -> list[object]:
    """Every queue with its counts and each ready message's content, in delivery order."""
    _, raw, _ = get(node, "/API/v1/queues")
    out: list[object] = []
    for q in json.loads(raw)["queues"]:
        out.append(q)
        for _ in range(q["stats"]["ready"]):
            _, msg, _ = get(node, f"/API/v1/queues/{q['name']}/messages?ack=true")
            m = json.loads(msg)
            out.append((m["id"], m["content"], m["priority"]))
    return out


def test_seed_doq_restore_full_and_incrementals_verbatim(tmp_path: Path) -> None:
    """The seed's last line: full + two incrementals (since = X-Last-Version + 1) restored
    online by `doq restore` into a fresh node, which then holds the same state."""
    *_, doq_restore = seed_commands()
    assert doq_restore.startswith("doq restore ")
    with running_node(tmp_path / "src") as src, running_node(tmp_path / "dst") as dst:
        post_json(src, "/API/v1/queues", {"name": "user_indexing_queue", "type": "delayed"})
        post_json(src, "/API/v1/queues/user_indexing_queue/messages", {"content": "{\"user_id\": 1}", "priority": 60})
        last = backup_to(src, 0, tmp_path / "backup-0.bak")
        post_json(src, "/API/v1/queues/user_indexing_queue/messages", {"content": "{\"user_id\": 2}", "priority": 5})
        post_json(src, "/API/v1/queues", {"name": "other", "type": "fair"})
        last = backup_to(src, last + 1, tmp_path / "backup-1.bak")
        first = json.loads(get(src, "/API/v1/queues/user_indexing_queue/messages?ack=true")[1])  # a deletion
        assert first["content"] == "{\"user_id\": 2}"
        post_json(src, "/API/v1/queues/other/messages", {"content": "three", "group": "g"})
        backup_to(src, last + 1, tmp_path / "backup-2.bak")

        out = subprocess.run(
            doq_restore, shell=True, cwd=tmp_path, capture_output=True, text=True, timeout=60,
            env={**os.environ, "DOQ_SERVER": dst.http_url,
                 "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", "")))},
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert state_of(dst) == state_of(src)


def test_backup_headers(doq_node: NodeProc) -> None:
    post_json(doq_node, "/API/v1/queues", {"name": "b1"})
    req = urllib.request.Request(doq_node.http_url + "/db/backup", data=b'{"since": 0}', method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        last = int(r.headers["X-Last-Version"])
        assert r.headers["Content-Type"] == "application/octet-stream"
        assert len(r.read()) == int(r.headers["Content-Length"])
    assert last >= 1
