"""Spark plumbing of the verification job: the session, and shipping `doq` to executors."""

from __future__ import annotations

import os
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any


def spark_session(master: str | None = None, conf: dict[str, str] | None = None, app: str = "doq verify") -> Any:
    """A SparkSession for `master` (None: as configured, e.g. by spark-submit, else
    local[*]). Executors run this Python (PYSPARK_PYTHON, unless set); on a non-local
    master the `doq` package is shipped to them as a zip (`build_zip`)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master is None or master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # (before the JVM) bind nothing but loopback
    # The driver's JVM, unless one runs already (spark-submit, an earlier session). C1 only:
    # the JIT's optimizing tier costs seconds of CPU a job this short never earns back
    # (local mode, 10 M records: 13 s of JVM CPU instead of 22 s).
    launch = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1", **(conf or {})}
    SparkContext._ensure_initialized(conf=SparkConf(loadDefaults=False).setAll(list(launch.items())))
    configured = SparkConf()
    chosen = master or configured.get("spark.master") or "local[*]"
    b = SparkSession.builder.appName(app).master(chosen)
    local_host = chosen.startswith("local") or "//127.0.0.1:" in chosen or "//localhost:" in chosen
    defaults = {"spark.python.worker.reuse": "true", "spark.ui.showConsoleProgress": "false"}
    if local_host and not configured.contains("spark.driver.host"):
        defaults.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    if chosen.startswith("local") and not configured.contains("spark.ui.enabled"):
        defaults["spark.ui.enabled"] = "false"
    for k, v in {**defaults, **(conf or {})}.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if not chosen.startswith("local"):
        ship_doq(spark)
    return spark


def ship_doq(spark: Any) -> None:
    """Make `doq` (and `doq_proto`) importable on the executors: a zip added with addPyFile."""
    out = Path(tempfile.mkdtemp(prefix="doq-verify-zip-")) / "doq.zip"
    build_zip(out)
    spark.sparkContext.addPyFile(str(out))


def build_zip(out: str | os.PathLike[str]) -> Path:
    """Zip the `doq` and `doq_proto` packages (.py and .pyi files) for `--py-files` /
    addPyFile. Executors still need zstandard and protobuf installed (the decoder's
    dependencies)."""
    import doq_proto

    import doq

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for pkg in (doq, doq_proto):
            root = Path(pkg.__file__).resolve().parent  # type: ignore[arg-type]
            dirs = set()
            for p in sorted(root.rglob("*.py")):
                if "__pycache__" not in p.parts:
                    z.write(p, Path(root.name) / p.relative_to(root))
                    dirs.add(p.parent)
            for d in sorted(dirs):  # a namespace package (no __init__.py) is a regular one in the
                if not (d / "__init__.py").exists():  # zip, so no other copy of doq can supply it
                    z.writestr(str(Path(root.name) / d.relative_to(root) / "__init__.py"), "")
    return out
