"""The README's examples, run in order and as written against a real `doq serve`.

Every fenced ```sh block runs line by line through bash (curl is the real curl, `doq` the
installed command), every fenced ```python block through the Python interpreter with the
real client. The only change: the default node's addresses become the test node's (it runs
on free ports), and `$DOQ_SERVER` points the `doq` client commands at it. The README's
`make serve` is `doq serve` with no flags (checked in the Makefile); the test starts that
with the free ports."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.proc import NodeProc, running_node

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
FENCED = re.compile(r"^```(sh|python)\n(.*?)^```$", re.M | re.S)


def readme_examples() -> list[tuple[str, str]]:
    """(language, code) of every fenced sh/python block of README.md, in order."""
    return FENCED.findall((ROOT / "README.md").read_text())


def shell_lines(block: str) -> list[str]:
    """One command per line, continuation lines joined; blank lines and comments dropped."""
    joined = block.replace("\\\n", " ")
    return [x.strip() for x in joined.splitlines() if x.strip() and not x.lstrip().startswith("#")]


DEMO_DIR = "/tmp/doq-demo"  # where the README's examples write their files (not the checkout)


def on_node(code: str, node: NodeProc, demo: Path) -> str:
    code = code.replace(DEMO_DIR, str(demo))
    for host in ("localhost", "127.0.0.1"):
        code = code.replace(f"{host}:8000", f"127.0.0.1:{node.http_port}")
        code = code.replace(f"{host}:10000", node.grpc_addr)
    return code


def test_make_serve_runs_doq_serve_on_the_defaults() -> None:
    text = (ROOT / "README.md").read_text()
    assert "\n    make serve\n" in text
    recipe = re.search(r"^serve:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe is not None and recipe.group(1).strip() == "$(VENV)/bin/doq serve"


def test_readme_examples_run_in_order_as_written(tmp_path: Path) -> None:
    examples = readme_examples()
    assert {lang for lang, _ in examples} == {"sh", "python"}
    work = tmp_path / "work"
    work.mkdir()
    (work / ".curlrc").write_text('silent\nshow-error\nwrite-out = "\\n%{http_code}"\n')
    env = {**os.environ, "CURL_HOME": str(work),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    outputs: list[str] = []
    with running_node(tmp_path / "data") as node:
        env["DOQ_SERVER"] = node.http_url
        for lang, code in examples:
            code = on_node(code, node, tmp_path / "demo")
            if lang == "python":
                r = subprocess.run([sys.executable, "-c", code], cwd=work, env=env,
                                   capture_output=True, text=True, timeout=120)
                assert r.returncode == 0, f"{code}\n{r.stdout}\n{r.stderr}"
                outputs.append(r.stdout)
                continue
            for cmd in shell_lines(code):
                r = subprocess.run(["bash", "-c", cmd], cwd=work, env=env,
                                   capture_output=True, text=True, timeout=120)
                assert r.returncode == 0, f"{cmd}\n{r.stdout}\n{r.stderr}"
                if cmd.startswith("curl "):
                    body, _, status = r.stdout.rpartition("\n")
                    assert 200 <= int(status) < 300, f"{cmd}\n{status} {body}"
                outputs.append(r.stdout)
    text = "\n".join(outputs)
    assert '"content":"hello"' in text.replace(" ", "")  # the curl dequeue got the message
    assert "Received message: ID=" in text and "acked True" in text
    assert (tmp_path / "demo" / "backup-0.bak").is_file() and (tmp_path / "demo" / "backups").is_dir()
    restored = re.search(r"restored \d+ records .* into (/\S+?); version", text)
    assert restored is not None and (Path(restored.group(1)) / "doq.lmdb").is_dir()
    shutil.rmtree(Path(restored.group(1)).parent)  # the example's `mktemp -d`
    assert sorted(p.name for p in work.iterdir()) == [".curlrc"]  # nothing written where the user stands
