"""One SparkSession (local[2]) for the whole test session: starting one costs ~10 s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from doq.backup.spark import spark_session

    session = spark_session("local[2]", {"spark.default.parallelism": "2"}, app="doq tests")
    try:
        yield session
    finally:
        session.stop()
