"""`make backup-zip`: build/doq-verify.zip, the `doq` and `doq_proto` packages for
`spark-submit --py-files` (executors also need `zstandard` and `protobuf` installed).

Usage: python backup/make_zip.py [OUT.zip]
"""

import sys
from pathlib import Path

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root), str(root / "clients" / "python")]

from doq.backup.spark import build_zip  # noqa: E402

if __name__ == "__main__":
    out = build_zip(sys.argv[1] if len(sys.argv) > 1 else root / "build" / "doq-verify.zip")
    print(out)
