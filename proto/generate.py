"""Generate Python code from the .proto files under proto/ into the `doq_proto` package.

Usage: python proto/generate.py [--check]
--check regenerates into a temporary directory and exits 1 if any committed file of the
package differs, is missing or is extra (CI runs it so generated code never goes stale).
Needs grpcio-tools (the `dev` extra).

Where the one generated copy lives, and why: `clients/python/doq_proto/` is a top-level
package of its own (`doq_proto.v1.doq_pb2`, `..._grpc`, `backup_pb2`) that needs only
protobuf and grpcio. The server (`doq`) and the client (`doq_client`) both import it, and
neither imports the other for it. It sits under clients/python because a distribution can
only ship files below its own directory: `pip install ./clients/python` ships doq_client
and doq_proto (the client works on a machine without the server), and the server's
distribution ships doq_proto from the same directory (its package search already covers
clients/python). This whole package is generated: edit the .proto files, never it.

Each directory of .proto files becomes a subpackage (`SOURCES`): proto/doq/v1 (the public
API) → `doq_proto.v1`; proto/doq/raft/v1 (the internal peer transport between members,
used only by the server) → `doq_proto.raft.v1`.
"""

from __future__ import annotations

import argparse
import filecmp
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"
PACKAGE = "doq_proto"
OUT_DIR = ROOT / "clients" / "python" / PACKAGE
_PACKAGE_INIT = '"""Generated protobuf and gRPC code of doq (do not edit; see proto/generate.py)."""\n'
# proto directory (under proto/) → subpackage of doq_proto, and its __init__ docstring.
SOURCES = {
    "doq/v1": ("v1", "Generated protobuf and gRPC code for doq.v1 (do not edit)."),
    "doq/raft/v1": ("raft/v1", "Generated protobuf and gRPC code for doq.raft.v1, the internal peer "
                               "transport (do not edit)."),
}


def generate(out_dir: Path) -> None:
    """Write the whole `doq_proto` package (modules, stubs, py.typed) into `out_dir`."""
    from grpc_tools import protoc  # type: ignore[import-untyped]

    include = str(Path(protoc.__file__).parent / "_proto")
    for proto_dir, (sub, doc) in SOURCES.items():
        protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / proto_dir).glob("*.proto"))
        # protoc emits `from doq.v1 import x_pb2`; the modules live in doq_proto.<sub>.
        import_re = re.compile(rf"^from {re.escape(proto_dir.replace('/', '.'))} import (\w+_pb2)", re.MULTILINE)
        module = f"{PACKAGE}.{sub.replace('/', '.')}"
        dest = out_dir / sub
        with tempfile.TemporaryDirectory() as tmp:
            args = ["protoc", f"-I{PROTO_ROOT}", f"-I{include}", f"--python_out={tmp}",
                    f"--pyi_out={tmp}", f"--grpc_python_out={tmp}", *protos]
            if protoc.main(args) != 0:
                raise SystemExit("protoc failed")
            dest.mkdir(parents=True, exist_ok=True)
            for src in sorted((Path(tmp) / proto_dir).iterdir()):
                (dest / src.name).write_text(import_re.sub(rf"from {module} import \1", src.read_text()))
        (dest / "__init__.py").write_text(f'"""{doc}"""\n')
        for parent in dest.relative_to(out_dir).parents:  # e.g. doq_proto/raft between the two
            if parent != Path("."):
                (out_dir / parent / "__init__.py").write_text(f'"""Generated code for doq.{parent}.* (do not edit)."""\n')
    (out_dir / "__init__.py").write_text(_PACKAGE_INIT)
    (out_dir / "py.typed").write_text("")


def package_files(root: Path) -> list[str]:
    """Relative paths of the package's files (caches excluded)."""
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if generated code is stale")
    ns = parser.parse_args()
    if not ns.check:
        generate(OUT_DIR)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / PACKAGE
        generate(fresh)
        names = package_files(fresh)
        committed = package_files(OUT_DIR)
        stale = [n for n in names
                 if not (OUT_DIR / n).exists() or not filecmp.cmp(fresh / n, OUT_DIR / n, shallow=False)]
        extra = [n for n in committed if n not in names]
    if stale or extra:
        print(f"generated code in {OUT_DIR.relative_to(ROOT)} is stale: {stale + extra}; "
              "run python proto/generate.py", file=sys.stderr)
        return 1
    print("generated code is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
