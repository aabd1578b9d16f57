"""One SparkSession (local[2]) for the whole test session: starting one costs ~10 s."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """Skips (with the reason) where PySpark or a Java runtime is missing; CI has both."""
    pytest.importorskip("pyspark", reason="needs pyspark (`make setup`)")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("needs a Java runtime for Spark (apt-get install default-jre-headless)")
    from pyspark.errors import PySparkRuntimeError

    from doq.backup.spark import spark_session

    try:
        session = spark_session("local[2]", {"spark.default.parallelism": "2"}, app="doq tests")
    except PySparkRuntimeError as e:
        # once, in a loaded CI run, the JVM gateway exited at launch in a test worker whose
        # earlier tests had left gRPC threads running (not reproduced alone): start it again
        if "JAVA_GATEWAY_EXITED" not in str(e):
            raise
        session = spark_session("local[2]", {"spark.default.parallelism": "2"}, app="doq tests")
    try:
        yield session
    finally:
        session.stop()
