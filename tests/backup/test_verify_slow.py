"""The job run the three ways users run it, each in its own JVM (slow): `doq verify` as a
command, `spark-submit backup/verify_job.py` with the zip of `make backup-zip`, and
`doq verify --master spark://...` on a real standalone Spark cluster (a master and a
worker process started from the pyspark distribution on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.chain import ChainFile, generate

pytestmark = [pytest.mark.spark, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> list[ChainFile]:
    return generate(tmp_path_factory.mktemp("chain") / "chain", 6_000, 3, frame_bytes=8 * 1024)


def _env() -> dict[str, str]:
    return {**os.environ, "PYSPARK_PYTHON": sys.executable, "DOQ_PROGRESS": "1"}  # progress as on a terminal


def _check(report: Path, made: list[ChainFile], master_prefix: str) -> dict[str, object]:
    doc = json.loads(report.read_text())
    assert doc["verified"], doc["failures"]
    assert doc["state"]["digest"] == f"{made[-1].digest:064x}"
    assert str(doc["spark"]["master"]).startswith(master_prefix)  # type: ignore[index]
    return doc  # type: ignore[no-any-return]


def test_doq_verify_command(made: list[ChainFile], tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "doq", "verify", "--dir", str(made[0].path.parent),
                        "--master", "local[2]", "--report", str(report)],
                       capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stderr
    _check(report, made, "local[2]")
    assert "doq verify: verified: 3 files" in r.stdout
    assert "records/s" in r.stderr and "file(s) opened" in r.stderr  # progress on stderr


def test_spark_submit_with_the_zip(made: list[ChainFile], tmp_path: Path) -> None:
    import pyspark

    zip_path = tmp_path / "doq-verify.zip"
    r = subprocess.run([sys.executable, str(ROOT / "backup" / "make_zip.py"), str(zip_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    report = tmp_path / "r.json"
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    r = subprocess.run([str(submit), "--master", "local[2]", "--py-files", str(zip_path),
                        str(ROOT / "backup" / "verify_job.py"), *[str(f.path) for f in made],
                        "--report", str(report)],
                       capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    _check(report, made, "local[2]")


def _wait_for_line(log: Path, pattern: str, procs: list[subprocess.Popen[bytes]],
                   timeout_s: float = 120.0) -> re.Match[str]:
    """The first match of `pattern` in the cluster's log, waiting for it; fails early if a
    process of the cluster exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text(errors="replace"))
        if found:
            return found
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"a Spark process exited ({p.returncode}): {log.read_text()[-3000:]}")
        time.sleep(0.25)
    raise TimeoutError(f"no {pattern!r} in the Spark cluster's log: {log.read_text()[-3000:]}")


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    """A Spark standalone master and one worker (2 cores) on 127.0.0.1; yields its URL.

    Every port is chosen by the kernel (port 0) and read back from the log, so the
    cluster never depends on a port staying free between a probe and its use."""
    import pyspark

    home = Path(pyspark.__file__).parent
    env = {**_env(), "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(tmp_path)}
    cls = str(home / "bin" / "spark-class")
    log_path = tmp_path / "cluster.log"
    procs: list[subprocess.Popen[bytes]] = []
    with open(log_path, "wb") as log:
        try:
            procs.append(subprocess.Popen(
                [cls, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
                 "--webui-port", "0"], env=env, stdout=log, stderr=subprocess.STDOUT))
            url = _wait_for_line(log_path, r"Starting Spark master at (spark://127\.0\.0\.1:\d+)", procs)[1]
            procs.append(subprocess.Popen(
                [cls, "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", "2",
                 "--memory", "2g", "--webui-port", "0", "--work-dir", str(tmp_path / "work")],
                env=env, stdout=log, stderr=subprocess.STDOUT))
            _wait_for_line(log_path, r"Successfully registered with master", procs)
            yield url
        finally:
            for p in reversed(procs):  # ours only, by pid
                if p.poll() is None:
                    os.kill(p.pid, signal.SIGTERM)
                    try:
                        p.wait(20)
                    except subprocess.TimeoutExpired:
                        os.kill(p.pid, signal.SIGKILL)
                        p.wait(10)


def test_on_a_standalone_spark_cluster(made: list[ChainFile], standalone: str, tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "doq", "verify", *[str(f.path) for f in made],
                        "--master", standalone, "--report", str(report), "--frames-per-task", "4"],
                       capture_output=True, text=True, timeout=600, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    doc = _check(report, made, standalone)
    files = doc["files"]
    assert isinstance(files, list) and files[0]["tasks"] > 1 and files[0]["spark_partitions"] > 1
