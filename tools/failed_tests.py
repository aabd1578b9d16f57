"""Print the tests a JUnit XML report (pytest --junitxml) records as failed or in error, one
per line, last thing in a CI log: whatever a run prints after pytest's own summary (threads
and atexit handlers of libraries) cannot bury them. Exit status 1 if there are any."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def failed(report_path: str) -> list[str]:
    root = ET.parse(report_path).getroot()
    out = []
    for case in root.iter("testcase"):
        for outcome in ("failure", "error"):
            found = case.find(outcome)
            if found is not None:
                name = f"{case.get('classname', '')}::{case.get('name', '')}"
                message = (found.get("message") or "").splitlines()[0][:200] if found.get("message") else ""
                out.append(f"{outcome.upper()} {name} - {message}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tools.failed_tests REPORT.xml", file=sys.stderr)
        return 2
    try:
        lines = failed(argv[1])
    except (OSError, ET.ParseError) as e:
        print(f"no test report to read ({e})", file=sys.stderr)
        return 1
    print(f"== {len(lines)} failed or in error (from {argv[1]})")
    for line in lines:
        print(line)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
