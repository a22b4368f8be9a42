"""Generated archives for the replay benchmark, made by Spark itself (in parallel, so even a 10M-line
one is quick to make) and reused once written.

The mix is what a parked backlog looks like: one noisy tenant with half of the records and 99 quiet
ones, about 1% duplicates (archiver crashes), 5% expired, 10% with a dedup key, a few bad lines.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SPAN_MS = 6 * 3_600_000  # six hours of backlog
MARKER = "_GENERATED"


def _records(spark: SparkSession, count: int) -> DataFrame:
    n = F.col("id")
    enqueued = F.lit(BASE_MS) + (n * 7919) % SPAN_MS
    tenant = F.when(n % 2 == 0, F.lit("t-000")).otherwise(
        F.concat(F.lit("t-"), F.lpad(((F.abs(F.hash(n)) % 99) + 1).cast("string"), 3, "0"))
    )
    envelope_id = F.concat(F.lpad(F.hex(enqueued), 12, "0"), F.lpad(n.cast("string"), 14, "0"))
    expires = F.when(n % 20 == 1, F.lit(BASE_MS - 1)).when(n % 5 == 2, F.lit(BASE_MS + 10 * SPAN_MS))
    dedup_key = F.when(n % 10 == 3, F.concat(F.lit("order-"), (n % 50_000).cast("string")))
    payload = F.struct(n.alias("seq"), F.lit("widget").alias("sku"), (n % 97).alias("qty"))
    envelope = F.struct(
        F.lit(1).alias("v"),
        envelope_id.alias("id"),
        tenant.alias("tenant"),
        F.lit("order.created").alias("type"),
        payload.alias("payload"),
        F.concat(F.lit("req-"), n.cast("string")).alias("request_id"),
        F.lit(None).cast("string").alias("trace_id"),
        enqueued.alias("enqueued_at"),
        expires.alias("expires_at"),
        dedup_key.alias("dedup_key"),
        F.lit(None).cast("string").alias("ordering_key"),
        F.lit(0).alias("attempt"),
        F.lit("backlog").alias("origin"),
        F.lit(None).cast("string").alias("replay_run"),
    )
    line = F.when(n % 10_007 == 5, F.lit("{not json")).otherwise(
        F.to_json(envelope, {"ignoreNullFields": "false"})
    )
    stamp = F.timestamp_millis(enqueued)
    return spark.range(count).select(
        tenant.alias("tenant"),
        F.date_format(stamp, "yyyy-MM-dd").alias("dt"),
        F.date_format(stamp, "HH").alias("hour"),
        line.alias("value"),
    )


def generate_archive(spark: SparkSession, path: str, count: int) -> str:
    """Write ``count`` records (+1% duplicates) as NDJSON.gz under tenant=/dt=/hour=; reuse a finished one."""
    if (Path(path) / MARKER).exists():
        return path
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    records = _records(spark, count)
    duplicates = records.filter(F.abs(F.hash("value")) % 100 == 0)
    (
        records.unionByName(duplicates)
        .repartition(64, "tenant", "dt", "hour")
        .write.mode("overwrite")
        .partitionBy("tenant", "dt", "hour")
        .option("compression", "gzip")
        .text(path)
    )
    (Path(path) / MARKER).write_text(f"{count}\n")
    return path
