"""tools.failed_tests: the failed tests of a JUnit report, printed last in a CI log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.a.test_x" name="test_ok" time="0.1"/>
<testcase classname="tests.a.test_x" name="test_bad" time="0.1"><failure message="assert 1 == 2&#10;more">tb</failure></testcase>
<testcase classname="tests.b.test_y" name="test_setup" time="0.1"><error message="fixture broke">tb</error></testcase>
</testsuite></testsuites>"""


def _run(report: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tools.failed_tests", str(report)], capture_output=True,
                          text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])


def test_failures_and_errors_are_listed_and_fail_the_run(tmp_path: Path) -> None:
    (tmp_path / "r.xml").write_text(REPORT)
    r = _run(tmp_path / "r.xml")
    assert r.returncode == 1
    assert r.stdout.splitlines()[1:] == ["FAILURE tests.a.test_x::test_bad - assert 1 == 2",
                                         "ERROR tests.b.test_y::test_setup - fixture broke"]


def test_a_clean_report_passes_and_a_missing_one_does_not(tmp_path: Path) -> None:
    (tmp_path / "r.xml").write_text(REPORT.replace('<failure message="assert 1 == 2&#10;more">tb</failure>', "")
                                    .replace('<error message="fixture broke">tb</error>', ""))
    assert _run(tmp_path / "r.xml").returncode == 0
    assert _run(tmp_path / "missing.xml").returncode == 1
