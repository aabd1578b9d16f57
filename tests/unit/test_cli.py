"""The `doq` command line: every default shown in --help, one default server for every client
command, errors that name the URL they tried (never a traceback), `--json` everywhere."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from doq.cli import build_parser, main
from doq.client_cli import DEFAULT_SERVER, grpc_target, server_url
from doq.config import ServeConfig
from doq.errors import InvalidArgument
from tests.support.proc import free_port

CLIENT_COMMANDS = {
    "backup": ["backup", "-o", "x.bak"],
    "restore": ["restore", "-f", "x.bak"],
    "bench": ["bench"],
}


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_serve_help_shows_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["serve", "--help"])
    assert e.value.code == 0
    text = _flat(capsys.readouterr().out)
    for f in fields(ServeConfig):
        default = getattr(ServeConfig(), f.name)
        if isinstance(default, bool):  # a switch: no value, off unless given (or DOQ_X=1)
            assert re.search(rf"--{f.name.replace('_', '-')} .*?\(env DOQ_{f.name.upper()}=1\)", text), f.name
            continue
        shown = (",".join(default) if isinstance(default, tuple) else str(default)) or "none"
        flag = "--" + f.name.replace("_", "-")
        if isinstance(default, bool):  # an on/off flag: off unless given
            assert re.search(rf"{flag} .*?\(env DOQ_{f.name.upper()}=true\)", text), flag
            continue
        assert re.search(rf"{flag} \S+ .*?\(env DOQ_{f.name.upper()}\) \(default: {re.escape(shown)}\)", text), flag


def test_every_option_of_every_command_shows_its_default() -> None:
    for name, p in _subparsers(build_parser()).items():
        text = _flat(p.format_help())
        for a in p._actions:
            if a.option_strings and a.nargs != 0 and a.default not in (None, []) and a.help:
                assert re.search(rf"{re.escape(a.option_strings[-1])} .*?\(default: ", text), (name, a.dest)


def test_flags_left_at_their_default_do_not_hide_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Showing defaults in --help must not turn them into flags: DOQ_* still applies."""
    from doq.config import load_config

    ns = build_parser().parse_args(["serve"])
    c = load_config(ns, {"DOQ_HTTP_ADDR": "127.0.0.1:8123", "DOQ_JOIN": "a:1"})
    assert (c.http_addr, c.join, c.grpc_addr) == ("127.0.0.1:8123", ("a:1",), "127.0.0.1:10000")
    ns = build_parser().parse_args(["serve", "--http-addr", "127.0.0.1:8000"])
    assert load_config(ns, {"DOQ_HTTP_ADDR": "127.0.0.1:8123"}).http_addr == "127.0.0.1:8000"


def test_one_default_server_for_every_client_command(monkeypatch: pytest.MonkeyPatch) -> None:
    assert DEFAULT_SERVER == "http://" + ServeConfig().http_addr  # what `doq serve` listens on
    monkeypatch.delenv("DOQ_SERVER", raising=False)
    for argv in CLIENT_COMMANDS.values():
        assert build_parser().parse_args(argv).server == DEFAULT_SERVER, argv
        assert "--json" in _subparsers(build_parser())[argv[0]].format_help()
    monkeypatch.setenv("DOQ_SERVER", "http://10.0.0.7:8001")
    for argv in CLIENT_COMMANDS.values():
        assert build_parser().parse_args(argv).server == "http://10.0.0.7:8001", argv


@pytest.mark.parametrize(("value", "url"), [
    ("http://h:1/", "http://h:1"), ("localhost:8001", "http://localhost:8001"),
    ("https://h", "https://h"), ("[::1]:8000", "http://[::1]:8000"),
])
def test_server_urls_are_normalized(value: str, url: str) -> None:
    assert server_url(value) == url


@pytest.mark.parametrize("value", ["ftp://h:1", "http://", "h:99999", ""])
def test_bad_server_urls_are_refused_by_name(value: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(repr(value))):
        server_url(value)


def _doq(*args: str, stdin: bytes | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DOQ_SERVER"}
    return subprocess.run([sys.executable, "-m", "doq", *args], input=stdin.decode() if stdin else None,
                          capture_output=True, text=True, timeout=60, env=env, cwd=cwd)


def test_connection_errors_name_the_url_and_print_no_traceback(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    url = f"http://127.0.0.1:{port}"
    (tmp_path / "x.bak").write_bytes(b"x")
    runs = {
        "backup": _doq("backup", "--server", url, "-o", str(tmp_path / "b.bak")),
        "restore": _doq("restore", "--server", url, "-f", str(tmp_path / "x.bak")),
        "bench": _doq("bench", "--server", url, "--count", "1"),
        "bench grpc": _doq("bench", "--server", f"grpc://127.0.0.1:{port}", "--count", "1"),
    }
    for name, r in runs.items():
        assert r.returncode == 1, (name, r.stderr)
        assert f"127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr, (name, r.stderr)
        assert r.stdout == ""
    assert not (tmp_path / "b.bak").exists() and not (tmp_path / "b.bak.part").exists()
    bad = _doq("backup", "--server", "ftp://h", "-o", str(tmp_path / "b.bak"))
    assert bad.returncode == 2 and "'ftp://h'" in bad.stderr and "Traceback" not in bad.stderr


def test_non_seekable_restore_input_is_a_clear_error(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for source, stdin in (("/dev/stdin", b"DOQB not really a backup"), (str(fifo), None)):
        for target in (["--data-dir", str(tmp_path / "d")], ["--server", "http://127.0.0.1:9"]):
            r = _doq("restore", "-f", source, *target, stdin=stdin)
            assert r.returncode == 1, r.stderr
            assert "not a regular file" in r.stderr and source in r.stderr, r.stderr
            assert "Traceback" not in r.stderr
    assert not (tmp_path / "d").exists()


@pytest.fixture
def cluster_stub() -> Iterator[tuple[str, dict[str, object]]]:
    """An HTTP server answering GET /cluster with `answer` (404 when it is empty)."""
    answer: dict[str, object] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps(answer).encode()
            self.send_response(200 if answer and self.path == "/cluster" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", answer
    finally:
        srv.shutdown()
        srv.server_close()


def test_grpc_clients_find_the_leaders_grpc_address(cluster_stub: tuple[str, dict[str, object]]) -> None:
    url, answer = cluster_stub
    assert grpc_target("grpc://10.1.1.1:10001") == "10.1.1.1:10001"
    assert grpc_target(url) == "127.0.0.1:10000"  # no /cluster: a single node, default port
    answer.update(node_id="n2", leader_id="n1", members=[
        {"node_id": "n1", "addrs": {"grpc_addr": "10.0.0.1:10001"}},
        {"node_id": "n2", "grpc_addr": "10.0.0.2:10002"},
    ])
    assert grpc_target(url) == "10.0.0.1:10001"
    answer["leader_id"] = ""
    assert grpc_target(url) == "10.0.0.2:10002"


@pytest.mark.parametrize("argv", [["--cluster.node_id", "a/b"], ["--http.port", "x", "--cluster.node_id", "n"]])
def test_flags_without_a_command_run_serve(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """The seed's `doq --cluster.node_id ...` is `doq serve ...` (a bad value: serve's own
    message and exit status 2, before anything starts)."""
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("doq serve: ")
