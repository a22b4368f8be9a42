"""Pure transforms of the replay job: ``DataFrame -> DataFrame``, importing only pyspark.

The plan is shaped for throughput on a few cores (docs/performance.md, "Replay"):

* every line is parsed once, by the JSON reader with the envelope's schema and a corrupt-record
  column (straight from the file's bytes to the schema's columns, where text + ``from_json`` first
  copies every line into a string column), so a malformed line becomes a reject with a reason
  instead of failing the run;
* the only shuffle is one hash repartition by tenant; dedup, rank and the fair interleave are then
  partition-local windows and sorts: no global sort, no second exchange;
* two sorts of every row after the shuffle, not three: one in time order per tenant drops copies by
  id and ranks in the same window, one interleaves; only the envelopes with a ``dedup_key`` get a
  sort by key; each map task pre-sorts its rows, so the time sort merges sorted runs;
* sort keys are 64-bit longs (hashes, time), strings only break ties; the interleave sorts on one
  long, which Spark does as a radix sort.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F  # noqa: N812 - the usual Spark alias
from pyspark.sql.types import LongType, StringType, StructField, StructType

# The envelope (functions/breakwater/envelope.py) as Spark reads it; a test keeps the two equal.
# ``payload`` is kept as its JSON text: Spark's JSON reader returns nested values as raw JSON.
ENVELOPE_SCHEMA = StructType(
    [
        StructField("v", LongType(), nullable=False),
        StructField("id", StringType(), nullable=False),
        StructField("tenant", StringType(), nullable=False),
        StructField("type", StringType(), nullable=False),
        StructField("payload", StringType(), nullable=True),
        StructField("request_id", StringType(), nullable=True),
        StructField("trace_id", StringType(), nullable=True),
        StructField("enqueued_at", LongType(), nullable=False),
        StructField("expires_at", LongType(), nullable=True),
        StructField("dedup_key", StringType(), nullable=True),
        StructField("ordering_key", StringType(), nullable=True),
        StructField("attempt", LongType(), nullable=False),
        StructField("failed_receives", LongType(), nullable=True),
        StructField("origin", StringType(), nullable=False),
        StructField("replay_run", StringType(), nullable=True),
    ]
)

CORRUPT_COLUMN = "_corrupt_record"
# Spark fills every field of a lenient parse, so required fields are checked explicitly.
REQUIRED_FIELDS = tuple(field.name for field in ENVELOPE_SCHEMA.fields if not field.nullable)
# What the loader reads with: the envelope plus the column in which Spark keeps a line it cannot parse.
READ_SCHEMA = StructType([*ENVELOPE_SCHEMA.fields, StructField(CORRUPT_COLUMN, StringType(), nullable=True)])
READ_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT_COLUMN}

# Reject reasons and row statuses, as written into the rejects output and the run report.
REASON_MALFORMED = "malformed: not a JSON object of the envelope's types"
REASON_VERSION = "unsupported envelope version"
STATUS_OK = "ok"
STATUS_REJECTED = "rejected"
STATUS_EXPIRED = "expired"
STATUS_BEFORE_CUTOFF = "before_cutoff"

# The envelope's field names in the schema's order: the columns the job keeps and the send's body fields.
ENVELOPE_COLUMNS = tuple(field.name for field in ENVELOPE_SCHEMA.fields)


def validate(records: DataFrame) -> DataFrame:
    """Records read with :data:`READ_SCHEMA` -> envelope fields + ``reject_reason`` (null when valid)."""
    reason = F.when(F.col(CORRUPT_COLUMN).isNotNull(), F.lit(REASON_MALFORMED))
    for name in REQUIRED_FIELDS:
        reason = reason.when(F.col(name).isNull(), F.lit(f"missing required field: {name}"))
    reason = reason.when(F.col("v") != F.lit(1), F.lit(REASON_VERSION))
    return records.withColumn("reject_reason", reason)


def classify(
    envelopes: DataFrame,
    *,
    now_ms: int,
    cutoff_ms: int | None = None,
    window_start_ms: int | None = None,
    window_end_ms: int | None = None,
    tenants: tuple[str, ...] = (),
) -> DataFrame:
    """Add ``status``: rejected, expired, before_cutoff (older than the anti-entropy sweep) or ok.

    Envelopes outside the time window or the tenant filter are not part of this run and are removed.
    """
    in_scope: Column = F.lit(True)
    if window_start_ms is not None:
        in_scope = in_scope & (F.col("enqueued_at") >= window_start_ms)
    if window_end_ms is not None:
        in_scope = in_scope & (F.col("enqueued_at") < window_end_ms)
    if tenants:
        in_scope = in_scope & F.col("tenant").isin(list(tenants))
    rejected = F.col("reject_reason").isNotNull()
    status = (
        F.when(rejected, F.lit(STATUS_REJECTED))
        .when(F.col("expires_at").isNotNull() & (F.col("expires_at") <= now_ms), F.lit(STATUS_EXPIRED))
        .when(
            F.lit(cutoff_ms is not None) & (F.col("enqueued_at") < (cutoff_ms or 0)),
            F.lit(STATUS_BEFORE_CUTOFF),
        )
        .otherwise(F.lit(STATUS_OK))
    )
    # A rejected line has no trustworthy tenant or time, so the run's scope never filters it out.
    return envelopes.filter(rejected | in_scope).withColumn("status", status)


def rejects(classified: DataFrame) -> DataFrame:
    """The records a run could not use, with the reason: the rejects output.

    ``line`` is the archived line when Spark could not parse it, else the fields it did read.
    """
    fields = F.to_json(F.struct(*ENVELOPE_COLUMNS), {"ignoreNullFields": "false"})
    return classified.filter(F.col("status") == STATUS_REJECTED).select(
        F.coalesce(F.col(CORRUPT_COLUMN), fields).alias("line"), "reject_reason"
    )


def replayable(classified: DataFrame) -> DataFrame:
    """Valid, unexpired envelopes newer than the cutoff: the envelope's columns only."""
    return classified.filter(F.col("status") == STATUS_OK).select(*ENVELOPE_COLUMNS)


def by_tenant(envelopes: DataFrame, partitions: int) -> DataFrame:
    """The one shuffle of the job: every envelope of a tenant in one partition, so what follows is local.

    Partitioned on ``_tenant_hash`` (xxhash64 of the tenant), the key the windows group by. Each map
    task first sorts its own rows into (tenant, time) order (:func:`_run_key`: one long, a radix
    sort of a small batch), and a shuffle block keeps the order its map task wrote: a partition
    then arrives as one sorted run per map task, and the rank window's sort of a huge tenant merges
    runs instead of sorting rows that all tie on the tenant's hash (its first key). That moves work
    from the one task holding the huge tenant to the map stage, where both cores share it.

    The sort is on the run key's expression (a radix sort computes it once per row), and
    :func:`_partition_local`'s always-true, nondeterministic filter keeps it above the repartition:
    the optimizer drops a sort straight below a repartition. A projection dropping a sort column
    there did the same, at the cost of one more copy of every row (docs/performance.md, "Replay").
    A test counts the final plan's sorts.
    """
    keyed = envelopes.withColumn("_tenant_hash", F.xxhash64("tenant")).withColumn("_order", _order_key())
    runs = keyed.sortWithinPartitions(_run_key())
    return _partition_local(runs, F.lit(True)).repartition(partitions, "_tenant_hash")


def partition_of(partitions: int) -> Column:
    """The partition :func:`by_tenant` puts a row in (Spark's hash partitioning: pmod(murmur3, n)).

    Lets a pass before the shuffle count each partition's rows, for the send's pacing.
    """
    return F.pmod(F.hash(F.xxhash64("tenant")), F.lit(partitions))


# Sort keys are 64-bit longs wherever possible: Spark compares them without touching strings, and
# a sort on one long key is a radix sort. Strings follow only as tie-breakers.
_ID_BITS = 20  # enqueued_at (ms, < 2**43) * 2**20 + 20 bits of the id's hash fits a signed long
_TENANT_BITS = 32  # slot = rank * 2**32 + 32 bits of the tenant's hash


def _order_key() -> Column:
    """(enqueued_at, id) as one long: time first, then a hash of the id to break same-ms ties."""
    return F.col("enqueued_at") * (1 << _ID_BITS) + F.pmod(F.xxhash64("id"), F.lit(1 << _ID_BITS))


_RUN_TENANT_BITS = 16  # run key = top 16 bits of the tenant's hash, then _order >> 16


def _run_key() -> Column:
    """(tenant hash, ``_order``) squeezed into one long, so that sorting by it is a radix sort.

    The top bits of the tenant's hash (signed, as the window sorts it), then ``_order`` without its
    low bits: the rank window's order (tenant hash, ``_order``, ``id``, ``dedup_key``) except where
    two tenants share their top bits or two rows their millisecond; the window's own sort fixes those.
    """
    tenant_bits = F.shiftright("_tenant_hash", 64 - _RUN_TENANT_BITS)
    return F.shiftleft(tenant_bits, 63 - _RUN_TENANT_BITS) + F.shiftright("_order", _RUN_TENANT_BITS)


def _partition_local(frame: DataFrame, condition: Column) -> DataFrame:
    """``frame.filter(condition)``, kept above the exchange below it.

    The optimizer pushes a deterministic filter through a repartition. Two branches split by
    complementary filters would then shuffle (and read and parse the archive) once each; held above
    it, both read the one exchange (adaptive execution reuses it: one map stage, and each reduce task
    reads its block once per branch). ``spark_partition_id`` is nondeterministic, so a condition
    wrapped in it stays where it is written; it is always >= 0, so the filter is ``condition``.
    """
    return frame.filter(F.when(F.spark_partition_id() >= 0, condition))


def dedup_and_rank(envelopes: DataFrame) -> DataFrame:
    """Drop duplicates and number each tenant's envelopes by ``enqueued_at``: ``rank`` 1, 2, ...

    Dedup key: ``dedup_key`` when set (the newest envelope with that key wins), else the envelope
    ``id`` (an archiver crash may have written the same envelope twice). Ranks are dense over the
    kept rows, in (``enqueued_at``, ``id``) order. Partitioned by tenant first (:func:`by_tenant`,
    which also adds the ``_order`` key), everything here is partition-local: no exchange.

    One sort of all rows, not two (docs/performance.md, "Replay"):

    * only the envelopes with a ``dedup_key`` are grouped by key, in a window of their own (keyed
      by (group hash, tenant hash, tenant, key), the group hash being xxhash64 of (tenant, key): the
      strings only break hash ties, so a collision costs a comparison, never a wrong dedup; the
      group hash leads because Spark's sort compares an 8-byte prefix of the first key before it
      reads a row). The newest of each group is kept.
    * copies by ``id`` need no grouping of their own: an id is minted once, with its
      ``enqueued_at``, and neither ever changes (``Envelope.moved``), so copies tie on
      (``enqueued_at``, ``id``) and are neighbours in time order. One window over the tenant in
      (time, ``id``, ``dedup_key``) order then drops them (a row whose ``row_number`` differs from
      its ``rank`` repeats the row before it) and numbers the rest (``dense_rank``: copies share one
      number, so the kept rows are numbered 1..n without a gap). After the key dedup no two keyed
      rows of a tenant tie, and a keyed row never ties an unkeyed one, so only copies are dropped.

    The rank window groups by the tenant's 64-bit hash alone: a collision would merely share one
    rank sequence between two tenants (fairness, not correctness).
    """
    ordered = envelopes if "_order" in envelopes.columns else envelopes.withColumn("_order", _order_key())
    newest_first = Window.partitionBy("_group_hash", "_tenant_hash", "tenant", "dedup_key").orderBy(
        F.desc("_order"), F.desc("id")
    )
    newest_of_key = (
        _partition_local(ordered, F.col("dedup_key").isNotNull())
        .withColumn("_group_hash", F.xxhash64("tenant", "dedup_key"))
        .withColumn("_n", F.row_number().over(newest_first))
        .filter(F.col("_n") == 1)
        .drop("_group_hash", "_n")
    )
    without_key = _partition_local(ordered, F.col("dedup_key").isNull())
    in_time = Window.partitionBy("_tenant_hash").orderBy("_order", "id", "dedup_key")
    return (
        newest_of_key.unionByName(without_key)
        .withColumn("_first", F.row_number().over(in_time) == F.rank().over(in_time))
        .withColumn("rank", F.dense_rank().over(in_time))
        .filter(F.col("_first"))
        .drop("_first", "_order")
    )


def interleave(ranked: DataFrame) -> DataFrame:
    """Round-robin the tenants of each partition by rank: every tenant's 1st, then every 2nd, ...

    One tenant's huge backlog then takes one turn per round instead of the whole send, which is the
    fairness of the replay (the same idea as SQS fair queues). Partition-local: no global sort, and
    the key is one long (rank, then the tenant's hash), so the sort is a radix sort.

    Nothing is projected after the sort: a projection there copies every row once more, in the task
    that holds the largest tenant (docs/performance.md, "Replay"). So the sort is on the key's
    expression, not on a column to drop afterwards (a radix sort computes it once per row, as it
    inserts the row), and ``_tenant_hash`` stays in the output (the send reads the envelope's fields
    by name).
    """
    ranked = (
        ranked
        if "_tenant_hash" in ranked.columns
        else ranked.withColumn("_tenant_hash", F.xxhash64("tenant"))
    )
    slot = F.col("rank") * (1 << _TENANT_BITS) + F.pmod("_tenant_hash", F.lit(1 << _TENANT_BITS))
    return ranked.sortWithinPartitions(slot)


def replay_order(classified: DataFrame, partitions: int) -> DataFrame:
    """ok envelopes -> deduped, ranked within tenant, fairly interleaved, ready to send."""
    return interleave(dedup_and_rank(by_tenant(replayable(classified), partitions)))
