"""`doq cluster status|remove|transfer` against real HTTP servers: human and JSON output,
--server / $DOQ_SERVER, errors on stderr with exit status 1."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from doq.cli import main
from tests.cluster.support import FakeCluster, cluster_app, env, serving, three_members
from tests.support.proc import free_port


async def doq(*args: str) -> int:
    return await asyncio.to_thread(main, ["cluster", *args])


async def test_status_human_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    node = FakeCluster("node-2", "node-1", three_members())
    async with serving(cluster_app(node)) as addr:
        assert await doq("status", "--server", f"http://{addr}") == 0
        out = capsys.readouterr().out
        assert out.splitlines()[0] == "leader node-1, term 3; seen by node-2 (follower): commit 120, applied 118"
        assert out.splitlines()[1].split() == ["NODE", "ROLE", "REACHABLE", "LAST", "CONTACT", "MATCH", "LAG",
                                               "RAFT", "GRPC", "HTTP"]
        assert out.splitlines()[2].split() == ["node-1", "voter,", "leader", "?", "?", "?", "?", "127.0.0.1:9001",
                                               "127.0.0.1:10001", "127.0.0.1:8001"]  # "?": the fake tells none
        assert out.splitlines()[4].split()[:2] == ["node-3", "voter"]
        with env(DOQ_SERVER=addr):  # HOST:PORT is accepted too
            assert await doq("status", "--json") == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["leader_id"] == "node-1" and len(doc["members"]) == 3


async def test_remove_and_transfer(capsys: pytest.CaptureFixture[str]) -> None:
    node = FakeCluster("node-1", "node-1", three_members())
    async with serving(cluster_app(node)) as addr:
        assert await doq("remove", "node-3", "--server", addr) == 0
        assert capsys.readouterr().out == "removed node-3\n"
        assert await doq("remove", "node-3", "--server", addr) == 1
        err = capsys.readouterr().err
        assert err.startswith("doq cluster remove: no member 'node-3' (404 MEMBER_NOT_FOUND)")
        assert await doq("transfer", "--server", addr, "--json") == 0
        assert json.loads(capsys.readouterr().out) == {"success": True, "leader_id": "node-2"}
        # node-1 follows now: a second transfer is refused with the leader's address
        assert await doq("transfer", "node-2", "--server", addr) == 1
        err = capsys.readouterr().err
        assert "503 NOT_LEADER" in err and "(leader: 127.0.0.1:8002)" in err
    assert node.calls == [("remove", "node-3"), ("transfer", "node-2")]


async def test_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    assert await doq("status", "--server", f"127.0.0.1:{free_port()}") == 1
    assert "Connection refused" in capsys.readouterr().err


def test_usage_errors_exit_2() -> None:
    r = subprocess.run([sys.executable, "-m", "doq", "cluster", "remove"], capture_output=True, text=True)
    assert r.returncode == 2 and "ID" in r.stderr


async def test_bad_server_url_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert await doq("status", "--server", "ftp://x:1") == 2
    assert "--server must be an http(s) URL" in capsys.readouterr().err
