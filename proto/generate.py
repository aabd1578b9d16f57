"""Generate Python code from the .proto files under proto/ (see TARGETS for where it goes).

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
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"


@dataclass(frozen=True)
class Target:
    """Every .proto of `proto_dir` (under proto/) → Python modules in `out_dir`, importable
    as `module` (protoc's `from <proto package> import x_pb2` lines are rewritten to it)."""

    proto_dir: str
    out_dir: Path
    module: str
    doc: str

    def import_re(self) -> re.Pattern[str]:
        return re.compile(rf"^from {re.escape(self.proto_dir.replace('/', '.'))} import (\w+_pb2)", re.MULTILINE)


TARGETS = (
    # The public API (doq.v1): shipped with the client library.
    Target("doq/v1", ROOT / "clients" / "python" / "doq_client" / "v1", "doq_client.v1",
           "Generated protobuf and gRPC code for doq.v1 (do not edit)."),
    # The internal peer transport (doq.raft.v1): server side only.
    Target("doq/raft/v1", ROOT / "doq" / "_pb", "doq._pb",
           "Generated protobuf and gRPC code for doq.raft.v1, the internal peer transport (do not edit)."),
)


def generate(target: Target, out_dir: Path) -> None:
    from grpc_tools import protoc  # type: ignore[import-untyped]

    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / target.proto_dir).glob("*.proto"))
    include = str(Path(protoc.__file__).parent / "_proto")
    import_re = target.import_re()
    with tempfile.TemporaryDirectory() as tmp:
        args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={tmp}",
                f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", *protos]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        for src in sorted((Path(tmp) / target.proto_dir).iterdir()):
            text = import_re.sub(rf"from {target.module} import \1", src.read_text())
            (out_dir / src.name).write_text(text)
    (out_dir / "__init__.py").write_text(f'"""{target.doc}"""\n')


def check(target: Target) -> list[str]:
    """The names of `target`'s committed files that differ from freshly generated ones."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "out"
        generate(target, fresh)
        out = target.out_dir
        names = sorted(p.name for p in fresh.iterdir())
        committed = sorted(p.name for p in out.iterdir() if p.is_file()) if out.exists() else []
        stale = [n for n in names if not (out / n).exists() or not filecmp.cmp(fresh / n, out / n, shallow=False)]
        extra = [n for n in committed if n not in names]
        shutil.rmtree(fresh)
    return [str((out / n).relative_to(ROOT)) for n in stale + extra]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if generated code is stale")
    ns = parser.parse_args()
    if not ns.check:
        for target in TARGETS:
            generate(target, target.out_dir)
        return 0
    stale = [name for target in TARGETS for name in check(target)]
    if stale:
        print(f"generated code is stale: {stale}; run python proto/generate.py", file=sys.stderr)
        return 1
    print("generated code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
