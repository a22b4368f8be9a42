"""Load: the archive's NDJSON.gz records, from the partition directories the run's scope can touch.

The archive is laid out ``tenant=<t>/dt=<YYYY-MM-DD>/hour=<HH>/`` (``breakwater.archive``). The
directories are listed on the driver (metadata, no data) and filtered by the time window and the
tenant filter, then read with the envelope's schema. ``recursiveFileLookup`` turns off Spark's
partition inference, so ``tenant`` comes from the envelope itself, never from a directory name.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from pyspark.sql import DataFrame, SparkSession

from glue_jobs.replay_transforms import READ_OPTIONS, READ_SCHEMA


def hour_label(epoch_ms: int) -> str:
    """``YYYY-MM-DD/HH``: the (dt, hour) directory pair of an instant, comparable as a string."""
    return datetime.fromtimestamp(epoch_ms / 1000, tz=UTC).strftime("%Y-%m-%d/%H")


def in_scope(
    relative_dir: str,
    *,
    window_start_ms: int | None,
    window_end_ms: int | None,
    tenants: tuple[str, ...],
) -> bool:
    """Whether ``tenant=<t>/dt=<d>/hour=<h>`` can hold envelopes of the run's window and tenants."""
    parts = dict(part.split("=", 1) for part in relative_dir.strip("/").split("/") if "=" in part)
    if tenants and parts.get("tenant") not in {quote(tenant, safe="") for tenant in tenants}:
        return False
    label = f"{parts.get('dt', '')}/{parts.get('hour', '')}"
    if window_start_ms is not None and label < hour_label(window_start_ms):
        return False
    return not (window_end_ms is not None and label > hour_label(window_end_ms))


def _list_hour_dirs(spark: SparkSession, archive_path: str) -> list[str]:
    """Every ``tenant=*/dt=*/hour=*`` directory of the archive, listed by Hadoop (S3 or local)."""
    jvm: Any = spark.sparkContext._jvm
    pattern = jvm.org.apache.hadoop.fs.Path(archive_path.rstrip("/") + "/tenant=*/dt=*/hour=*")
    filesystem = pattern.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    statuses = filesystem.globStatus(pattern) or []
    return [str(status.getPath().toString()) for status in statuses if status.isDirectory()]


def read_archive(
    spark: SparkSession,
    archive_path: str,
    *,
    window_start_ms: int | None = None,
    window_end_ms: int | None = None,
    tenants: tuple[str, ...] = (),
) -> DataFrame:
    """The archived records of the run's scope, read with :data:`READ_SCHEMA` (bad lines kept, not fatal)."""
    reader = spark.read.schema(READ_SCHEMA).options(**READ_OPTIONS).option("recursiveFileLookup", "true")
    if window_start_ms is None and window_end_ms is None and not tenants:
        return reader.json(archive_path)
    root = archive_path.rstrip("/")
    selected = [
        path
        for path in _list_hour_dirs(spark, root)
        if in_scope(
            path.split("/tenant=", 1)[-1].join(["tenant=", ""]),
            window_start_ms=window_start_ms,
            window_end_ms=window_end_ms,
            tenants=tenants,
        )
    ]
    if not selected:
        return spark.createDataFrame([], READ_SCHEMA)
    return reader.json(selected)
