"""`doq backup` / `doq restore --server` against a stub HTTP server speaking the contract."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from doq.backup.format import BackupReader
from doq.backup.ops import restore_into, write_backup
from doq.cli import main
from tests.backup.fakes import FakeState


class Stub:
    def __init__(self) -> None:
        self.live = FakeState()
        for i in range(1, 30):
            self.live.apply(i, {b"k%d" % i: b"v" * i, b"k%d" % (i // 2): None})
        self.restored = FakeState()
        self.uploads: list[str] = []
        self.corrupt = False
        self.truncate = False


@pytest.fixture
def stub() -> Iterator[tuple[Stub, str]]:
    st = Stub()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path == "/db/backup":
                buf = io.BytesIO()
                last = write_backup(st.live, json.loads(body)["since"], buf)
                data = bytearray(buf.getvalue())
                if st.corrupt:
                    data[40] ^= 1
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("X-Last-Version", str(last))
                self.send_header("Content-Length", str(len(data) + 100 * st.truncate))
                self.end_headers()
                self.wfile.write(bytes(data))
                self.close_connection = True
            elif self.path == "/db/restore":
                head = f"Content-Type: {self.headers['Content-Type']}\r\n\r\n".encode()
                msg = BytesParser(policy=HTTP).parsebytes(head + body)
                parts = [p for p in msg.iter_parts() if p.get_param("name", header="content-disposition") == "file"]
                st.uploads = [p.get_filename() for p in parts]
                readers = [BackupReader(io.BytesIO(p.get_payload(decode=True))) for p in parts]
                res = restore_into(st.restored, readers, st.uploads)
                out = json.dumps({"records": res.records, "to_version": res.to_version}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield st, f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def test_backup_then_online_restore(stub, tmp_path: Path, capsys):
    st, url = stub
    assert main(["backup", "--server", url, "--since", "0", "-o", str(tmp_path / "b0.bak")]) == 0
    line = capsys.readouterr().out
    assert line.startswith(f"wrote {tmp_path / 'b0.bak'}: full backup, last version 29 ")
    last = 29
    st.live.apply(30, {b"k3": None, b"new": b"x"})
    assert main(["backup", "--server", url, "--since", str(last + 1), "-o", str(tmp_path / "b1.bak"),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["file"], doc["since"], doc["last_version"]) == (str(tmp_path / "b1.bak"), 30, 30)
    assert main(["backup", "--server", url, "--since", "31", "-o", str(tmp_path / "b2.bak"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["last_version"] == 30  # empty incremental: since - 1

    rc = main(["restore", "--server", url, "-f", str(tmp_path / "b0.bak"),
               "-i", str(tmp_path / "b1.bak"), "-i", str(tmp_path / "b2.bak"), "--json"])
    assert rc == 0, capsys.readouterr().err
    doc = json.loads(capsys.readouterr().out)
    assert doc["target"] == url and doc["records"] > 0 and doc["to_version"] == 30
    assert st.uploads == ["b0.bak", "b1.bak", "b2.bak"]
    assert st.restored.records == st.live.records
    st.restored = type(st.live)()
    assert main(["restore", "--server", url.removeprefix("http://"), "-f", str(tmp_path / "b0.bak")]) == 0
    assert capsys.readouterr().out.startswith("restored ")  # a URL without scheme is http


def test_backup_refuses_a_corrupt_download(stub, tmp_path: Path, capsys):
    st, url = stub
    st.corrupt = True
    out = tmp_path / "b.bak"
    assert main(["backup", "--server", url, "-o", str(out)]) == 1
    assert "CRC" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "b.bak.part").exists()


def test_backup_cut_short_names_the_url_and_leaves_no_file(stub, tmp_path: Path, capsys):
    st, url = stub
    st.truncate = True  # the server promises more bytes than it sends, then closes
    out = tmp_path / "b.bak"
    assert main(["backup", "--server", url, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"{url}/db/backup" in err and "Traceback" not in err
    assert not out.exists() and not (tmp_path / "b.bak.part").exists()


def test_restore_reports_missing_file_and_unreachable_server(tmp_path: Path, capsys):
    assert main(["restore", "--server", "http://127.0.0.1:9", "-f", str(tmp_path / "nope.bak")]) == 1
    err = capsys.readouterr().err
    assert str(tmp_path / "nope.bak") in err and "No such file" in err
    f = tmp_path / "x.bak"
    f.write_bytes(b"x")
    assert main(["restore", "--server", "http://127.0.0.1:9", "-f", str(f)]) == 1
    assert "127.0.0.1:9" in capsys.readouterr().err


def test_offline_restore_of_a_bad_file_is_a_clear_error(tmp_path: Path, capsys):
    f = tmp_path / "x.bak"
    f.write_bytes(b"not a backup at all, just text")
    assert main(["restore", "--data-dir", str(tmp_path / "d"), "-f", str(f)]) == 1
    err = capsys.readouterr().err
    assert "not a doq backup" in err and str(f) in err
    assert not (tmp_path / "d").exists()  # a refused restore creates nothing


def test_offline_restore_refuses_a_directory_a_node_holds(tmp_path: Path, capsys):
    import os

    from doq.storage.dirlock import NodeDirLock

    f = tmp_path / "x.bak"
    f.write_bytes(b"x")
    with NodeDirLock.acquire(tmp_path / "d" / "node-1"):  # as a running `doq serve` holds it
        assert main(["restore", "--data-dir", str(tmp_path / "d"), "-f", str(f)]) == 1
    err = capsys.readouterr().err
    assert str(tmp_path / "d" / "node-1") in err and f"pid {os.getpid()}" in err
