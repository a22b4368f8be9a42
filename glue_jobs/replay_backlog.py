"""Replay a parked backlog from the S3 archive into the live queues, fairly and at a rate the system can take.

Structure: :func:`load` / :func:`transform` / :func:`save` / :func:`main`. The transforms are pure
(``glue_jobs.replay_transforms``); ``awsglue`` is imported only under ``__main__``, and without it
the same entry point runs as plain ``spark-submit`` or on a local SparkSession (the embedded default)::

    spark-submit glue_jobs/replay_backlog.py --archive_path out/archive --output_path out/replay \\
        --queue_urls http://.../live-0,http://.../live-1 --shard_size 2 --target_rate 200

Outputs under ``output_path/run=<run_id>/``: ``rejects/`` (line + reason), ``failures/`` (envelopes
that could not be sent: replay them next run) and ``report.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F  # noqa: N812 - the usual Spark alias

from glue_jobs import replay_transforms as transforms
from glue_jobs.replay_load import read_archive
from glue_jobs.replay_save import Extremes, SendOptions, partition_rates, send_partition_function

# Job arguments (Glue passes them as --name value; every one has a default in the CDK job).
ARGUMENT_NAMES = (
    "archive_path", "output_path", "run_id", "window_start", "window_end", "tenants", "target_rate",
    "cutoff", "dry_run", "queue_urls", "shard_size", "fair_queues", "partitions", "endpoint_url",
)  # fmt: skip


def _instant_ms(value: str) -> int | None:
    """Epoch milliseconds or an ISO-8601 instant (UTC when no offset); empty means unbounded."""
    if not value:
        return None
    if value.isdigit():
        return int(value)
    moment = datetime.fromisoformat(value)
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp() * 1000)


@dataclass(frozen=True, slots=True)
class ReplayArgs:
    archive_path: str
    output_path: str
    queue_urls: tuple[str, ...] = ()
    shard_size: int = 1
    target_rate: float = 100.0
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    window_start_ms: int | None = None
    window_end_ms: int | None = None
    tenants: tuple[str, ...] = ()
    cutoff_ms: int | None = None
    dry_run: bool = False
    fair_queues: bool = True
    partitions: int = 0  # 0: default_partitions()
    endpoint_url: str | None = None

    @classmethod
    def from_mapping(cls, raw: Mapping[str, str]) -> ReplayArgs:
        """From Glue's resolved options or argparse: strings, empty meaning "not set"."""

        def text(name: str) -> str:
            return str(raw.get(name) or "").strip()

        args = cls(
            archive_path=text("archive_path"),
            output_path=text("output_path"),
            queue_urls=tuple(url for url in text("queue_urls").split(",") if url),
            shard_size=int(text("shard_size") or 1),
            target_rate=float(text("target_rate") or 100),
            run_id=text("run_id") or uuid.uuid4().hex[:12],
            window_start_ms=_instant_ms(text("window_start")),
            window_end_ms=_instant_ms(text("window_end")),
            tenants=tuple(tenant for tenant in text("tenants").split(",") if tenant),
            cutoff_ms=_instant_ms(text("cutoff")),
            dry_run=text("dry_run").lower() in {"1", "true", "yes"},
            fair_queues=text("fair_queues").lower() not in {"0", "false", "no"},
            partitions=int(text("partitions") or 0),
            endpoint_url=text("endpoint_url") or None,
        )
        if not args.archive_path or not args.output_path:
            raise ValueError("archive_path and output_path are required")
        if args.target_rate <= 0:
            raise ValueError(f"target_rate must be > 0, got {args.target_rate}")
        if not args.dry_run and not args.queue_urls:
            raise ValueError("queue_urls are required unless dry_run")
        return args

    @property
    def run_path(self) -> str:
        return f"{self.output_path.rstrip('/')}/run={self.run_id}"


@dataclass(frozen=True, slots=True)
class ReplayReport:
    run_id: str
    dry_run: bool
    read: int
    rejected: int
    expired: int
    before_cutoff: int
    deduplicated: int
    replayed: int
    failed: int
    target_rate: float
    send_seconds: float  # the send pass, including the read, dedup and sort that feed it
    sending_seconds: float  # first task's first send to the last task's last send

    @property
    def achieved_rate(self) -> float:
        """Messages per second over the sending window (what the live queues saw)."""
        return self.replayed / self.sending_seconds if self.sending_seconds > 0 else 0.0


def default_partitions(spark: SparkSession) -> int:
    """Two tenant partitions per core: enough to spread the tenants, few enough to keep tasks cheap.

    A tenant's envelopes share one partition (its ranks are partition-local). More partitions
    spread the other tenants away from a huge one, but every partition is one more task for each
    sort and one more sending task with its own SQS client, batches and depth probes; with many
    partitions per core that overhead made both the transform and the send slower on the bench
    (``bench/replay.py``). ``--partitions`` overrides it.
    """
    return 2 * spark.sparkContext.defaultParallelism


# SQL settings the job sets on its session before reading (and the bench measures with them). The
# archive is many small gzip objects (one per tenant and hour and archiver run), which Spark cannot
# split: a read task packs whole objects up to ``maxPartitionBytes``, counting each one as at least
# ``openCostInBytes``. Spark's default open cost (4 MiB) is far above a typical object, so a task got
# only a few objects and the fixed cost of all those tasks became a large share of the run's CPU.
# 128 KiB packs the objects by their real size; 16 MiB keeps enough tasks for every core to the end
# of the scan.
READ_CONF = {
    "spark.sql.files.maxPartitionBytes": str(16 << 20),
    "spark.sql.files.openCostInBytes": str(128 << 10),
}


# The JVM of a session the job starts itself: the embedded default (``local/emulator/replay.py`` runs
# this script as plain ``python`` on local[2]) and the bench, one definition. Options of the JVM take
# effect only when this process launches it (PySpark passes them to spark-submit); Glue and a plain
# ``spark-submit`` start the JVM first, so there they are the launcher's to set, and the stack sets
# none. The parallel collector: on two cores G1 (Java 17's default) runs write barriers and
# concurrent threads that compete with the tasks for the same cores, and the parallel collector spends
# less JVM CPU on the same plan; its pauses are a small part of a large run. 3g: the heap the bench
# measures with (a run's sorts spill past it, bounded).
LOCAL_SESSION_CONF = {
    "spark.driver.memory": "3g",
    "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
}


def local_session(app_name: str) -> SparkSession:
    """A session with :data:`LOCAL_SESSION_CONF` (the master comes from spark-submit's arguments)."""
    builder = SparkSession.builder.appName(app_name)
    for name, value in LOCAL_SESSION_CONF.items():
        builder = builder.config(name, value)
    return builder.getOrCreate()


def jvm_collectors(spark: SparkSession) -> list[str]:
    """The collectors of the session's JVM as it reports them: what took effect, not what was asked."""
    jvm: Any = spark.sparkContext._jvm
    beans = jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    return [str(bean.getName()) for bean in beans]


def configure(spark: SparkSession) -> None:
    """Apply :data:`READ_CONF` to the session (runtime SQL settings: Glue, spark-submit and local alike)."""
    for name, value in READ_CONF.items():
        spark.conf.set(name, value)


def load(spark: SparkSession, args: ReplayArgs) -> DataFrame:
    return read_archive(
        spark,
        args.archive_path,
        window_start_ms=args.window_start_ms,
        window_end_ms=args.window_end_ms,
        tenants=args.tenants,
    )


def transform(
    records: DataFrame, args: ReplayArgs, now_ms: int, partitions: int
) -> tuple[DataFrame, DataFrame]:
    """(classified records, envelopes in replay order). Pure: no I/O happens until an action."""
    classified = transforms.classify(
        transforms.validate(records),
        now_ms=now_ms,
        cutoff_ms=args.cutoff_ms,
        window_start_ms=args.window_start_ms,
        window_end_ms=args.window_end_ms,
        tenants=args.tenants,
    )
    return classified, transforms.replay_order(classified, partitions)


def save(spark: SparkSession, classified: DataFrame, ordered: DataFrame, args: ReplayArgs) -> ReplayReport:
    """Two passes: rejects (counting every status on the way), then the paced send."""
    status = F.col("status")
    observation = Observation("replay_counts")
    partitions = ordered.rdd.getNumPartitions()
    partition = transforms.partition_of(partitions)
    ok_in = (  # each send partition's ok rows (before dedup): the pacing's shares
        F.sum(F.when((status == transforms.STATUS_OK) & (partition == index), 1).otherwise(0)).alias(
            f"_partition_{index}"
        )
        for index in range(partitions)
    )
    counted = classified.observe(
        observation,
        F.count(F.lit(1)).alias("read"),
        *(
            F.sum(F.when(status == value, 1).otherwise(0)).alias(value)
            for value in (
                transforms.STATUS_REJECTED,
                transforms.STATUS_EXPIRED,
                transforms.STATUS_BEFORE_CUTOFF,
                transforms.STATUS_OK,
            )
        ),
        *ok_in,
    )
    transforms.rejects(counted).write.mode("overwrite").json(f"{args.run_path}/rejects", compression="gzip")
    counts = {name: int(value or 0) for name, value in observation.get.items()}

    context = spark.sparkContext
    considered, replayed, failed = context.accumulator(0), context.accumulator(0), context.accumulator(0)
    window = context.accumulator((float("inf"), float("-inf")), Extremes())
    concurrent_tasks = max(1, min(partitions, context.defaultParallelism))
    shares = [counts.get(f"_partition_{index}", 0) for index in range(partitions)]
    options = SendOptions(
        queue_urls=args.queue_urls,
        shard_size=args.shard_size,
        rate_per_task=args.target_rate / concurrent_tasks,
        run_id=args.run_id,
        failures_path=f"{args.run_path}/failures",
        fair_queues=args.fair_queues,
        dry_run=args.dry_run,
        endpoint_url=args.endpoint_url,
        region=context.getConf().get("spark.executorEnv.AWS_REGION") or None,
        partition_rates=partition_rates(shares, args.target_rate, concurrent_tasks),
    )
    started = time.monotonic()
    ordered.foreachPartition(send_partition_function(options, considered, replayed, failed, window))
    first_send, last_send = window.value
    return ReplayReport(
        run_id=args.run_id,
        dry_run=args.dry_run,
        read=counts["read"],
        rejected=counts[transforms.STATUS_REJECTED],
        expired=counts[transforms.STATUS_EXPIRED],
        before_cutoff=counts[transforms.STATUS_BEFORE_CUTOFF],
        deduplicated=counts[transforms.STATUS_OK] - int(considered.value),
        replayed=int(replayed.value),
        failed=int(failed.value),
        target_rate=args.target_rate,
        send_seconds=round(time.monotonic() - started, 3),
        sending_seconds=round(max(0.0, last_send - first_send), 3),
    )


def write_report(report: ReplayReport, args: ReplayArgs) -> str:
    """The run report as JSON next to the run's outputs (S3 on Glue, a file locally)."""
    body = json.dumps(asdict(report) | {"achieved_rate": round(report.achieved_rate, 2)}, indent=2)
    target = f"{args.run_path}/report.json"
    if target.startswith("s3://"):
        import boto3

        bucket, _, key = target.removeprefix("s3://").partition("/")
        boto3.client("s3", endpoint_url=args.endpoint_url).put_object(
            Bucket=bucket, Key=key, Body=body.encode()
        )
    else:
        local = Path(target.removeprefix("file://"))
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(body + "\n")
    return target


def main(spark: SparkSession, args: ReplayArgs, *, now_ms: int | None = None) -> ReplayReport:
    now = int(time.time() * 1000) if now_ms is None else now_ms
    configure(spark)
    partitions = args.partitions or default_partitions(spark)
    classified, ordered = transform(load(spark, args), args, now, partitions)
    report = save(spark, classified, ordered, args)
    target = write_report(report, args)
    print(json.dumps({"replay_report": asdict(report), "written_to": target}), flush=True)
    return report


def _parse_cli(argv: Sequence[str]) -> dict[str, str]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for name in ARGUMENT_NAMES:
        parser.add_argument(f"--{name}", default="")
    known, _ = parser.parse_known_args(argv)
    return {name: str(value) for name, value in vars(known).items()}


def ship_runtime_library(spark: SparkSession) -> None:
    """Locally, do what ``--extra-py-files`` does on Glue: ship ``breakwater`` and ``glue_jobs``."""
    import shutil
    import tempfile

    root = Path(__file__).resolve().parent.parent
    staging = Path(tempfile.mkdtemp(prefix="breakwater-replay-"))
    shutil.copytree(root / "functions" / "breakwater", staging / "lib" / "breakwater")
    shutil.copytree(root / "glue_jobs", staging / "lib" / "glue_jobs")
    archive = shutil.make_archive(str(staging / "runtime"), "zip", staging / "lib")
    spark.sparkContext.addPyFile(archive)


if __name__ == "__main__":
    try:
        from awsglue.context import GlueContext
        from awsglue.job import Job
        from awsglue.utils import getResolvedOptions
    except ImportError:  # plain spark-submit / the embedded default
        session = local_session("breakwater-replay")
        print(json.dumps({"replay_session": {"collectors": jvm_collectors(session)}}), flush=True)
        ship_runtime_library(session)
        main(session, ReplayArgs.from_mapping(_parse_cli(sys.argv[1:])))
    else:
        # Resolve only what was passed: an argument left empty may not reach the script at all.
        present = [name for name in ARGUMENT_NAMES if f"--{name}" in sys.argv]
        options = getResolvedOptions(sys.argv, ["JOB_NAME", *present])
        glue_context = GlueContext(SparkSession.builder.getOrCreate().sparkContext)
        job = Job(glue_context)
        job.init(options["JOB_NAME"], options)  # job bookmarks: the run is recorded when committed
        main(glue_context.spark_session, ReplayArgs.from_mapping(options))
        job.commit()
