"""The doq backup verification job, for `spark-submit` (the same job as `doq verify`).

    make backup-zip                  # build/doq-verify.zip: the doq and doq_proto packages
    spark-submit --master spark://HOST:7077 --py-files build/doq-verify.zip \\
        backup/verify_job.py FILE [FILE ...] | --dir DIR [--against URL] [--report out.json]

Arguments are those of `doq verify` (see backup/README.md); the master comes from
spark-submit. The job's code is doq.backup.verify: this script only runs it.
"""

import sys
from pathlib import Path

try:
    from doq.backup.verify_cli import main
except ImportError:  # run from a checkout without --py-files (local mode)
    root = Path(__file__).resolve().parents[1]
    sys.path[:0] = [str(root), str(root / "clients" / "python")]
    from doq.backup.verify_cli import main

if __name__ == "__main__":
    sys.exit(main())
