"""Generate Python code from proto/doq/v1/*.proto into clients/python/doq_client/v1/.

Usage: python proto/generate.py [--check]
--check regenerates into a temporary directory and exits 1 if the committed code differs
(CI runs it so generated code never goes stale). Needs grpcio-tools (the `dev` extra).
"""

from __future__ import annotations

import argparse
import filecmp
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
OUT_DIR = ROOT / "clients" / "python" / "doq_client" / "v1"
# protoc emits `from doq.v1 import x_pb2`; the generated modules live in doq_client.v1.
_IMPORT_RE = re.compile(r"^from doq\.v1 import (\w+_pb2)", re.MULTILINE)


def generate(out_dir: Path) -> None:
    from grpc_tools import protoc  # type: ignore[import-untyped]

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / "doq" / "v1").glob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={tmp}",
                f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", *protos]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        for src in sorted((Path(tmp) / "doq" / "v1").iterdir()):
            text = _IMPORT_RE.sub(r"from doq_client.v1 import \1", src.read_text())
            (out_dir / src.name).write_text(text)
    init = out_dir / "__init__.py"
    init.write_text('"""Generated protobuf and gRPC code for doq.v1 (do not edit)."""\n')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if generated code is stale")
    ns = parser.parse_args()
    if not ns.check:
        generate(OUT_DIR)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "v1"
        generate(fresh)
        names = sorted(p.name for p in fresh.iterdir())
        committed = sorted(p.name for p in OUT_DIR.iterdir() if p.is_file()) if OUT_DIR.exists() else []
        stale = [n for n in names if not (OUT_DIR / n).exists() or not filecmp.cmp(fresh / n, OUT_DIR / n, shallow=False)]
        extra = [n for n in committed if n not in names]
        if stale or extra:
            print(f"generated code is stale: {stale + extra}; run python proto/generate.py", file=sys.stderr)
            return 1
        shutil.rmtree(fresh)
    print("generated code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
