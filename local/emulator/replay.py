"""Run the replay job: on Glue (``StartJobRun``), or its own entry point on a local SparkSession.

moto creates no Glue job (``AWS::Glue::Job`` is skipped), so the embedded default runs
``glue_jobs/replay_backlog.py`` itself, as plain ``python`` on ``local[2]`` — the entry point falls
back to a local SparkSession when ``awsglue`` is missing. The job reads the archive through Hadoop's
FileSystem, which cannot reach moto's S3 without the hadoop-aws jars, so the archive objects are first
staged from S3 into a local directory (``tenant=/dt=/hour=`` kept, so the job's pruning still works);
the job sends to the queues with boto3 against ``AWS_ENDPOINT_URL``. Where the queues, the shard size
and the queue mode come from: the Ingest function's environment (the same routing as ingest).

Used by ``bin/replay`` and by the local runtime's :meth:`LocalRuntime.run_replay`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[2]
JOB_SCRIPT = ROOT / "glue_jobs" / "replay_backlog.py"
ARCHIVE_PREFIX = "archive/"


@dataclass(frozen=True)
class ReplayRequest:
    """What an operator chooses for one run; empty means the job's default."""

    window_start: str = ""  # ISO-8601 instant or epoch ms of enqueued_at
    window_end: str = ""
    tenants: tuple[str, ...] = ()
    target_rate: float | None = None  # messages/s
    cutoff: str = ""  # anti-entropy cutoff: nothing enqueued before it is replayed
    dry_run: bool = False
    run_id: str = ""

    def job_arguments(self) -> dict[str, str]:
        """Glue's ``--name value`` overrides of the job's default arguments, only those set."""
        values = {
            "window_start": self.window_start,
            "window_end": self.window_end,
            "tenants": ",".join(self.tenants),
            "target_rate": "" if self.target_rate is None else str(self.target_rate),
            "cutoff": self.cutoff,
            "dry_run": "true" if self.dry_run else "",
            "run_id": self.run_id,
        }
        return {f"--{name}": value for name, value in values.items() if value}


def start_glue_run(glue: Any, job_name: str, request: ReplayRequest) -> str:
    """Start the deployed job with the request's arguments; the run id Glue assigned."""
    return str(glue.start_job_run(JobName=job_name, Arguments=request.job_arguments())["JobRunId"])


def stack_outputs(cloudformation: Any, stack_name: str) -> dict[str, str]:
    stack = cloudformation.describe_stacks(StackName=stack_name)["Stacks"][0]
    return {o["OutputKey"]: o.get("OutputValue", "") for o in stack.get("Outputs", [])}


@dataclass(frozen=True)
class LocalTarget:
    """Where a local run reads and sends: the archive bucket and the live queues as ingest routes."""

    bucket: str
    queue_urls: tuple[str, ...]
    shard_size: int
    fair_queues: bool
    endpoint_url: str | None


def discover_target(
    cloudformation: Any, lambda_client: Any, stack_name: str, endpoint_url: str | None
) -> LocalTarget:
    outputs = stack_outputs(cloudformation, stack_name)
    ingest = lambda_client.get_function_configuration(FunctionName=outputs["IngestFunctionName"])
    env = ingest["Environment"]["Variables"]
    return LocalTarget(
        bucket=outputs["ArchiveBucketName"],
        queue_urls=tuple(url for url in env["LIVE_QUEUE_URLS"].split(",") if url),
        shard_size=int(env["SHARD_SIZE"]),
        fair_queues=env.get("FAIR_QUEUES", "true") != "false",
        endpoint_url=endpoint_url,
    )


def stage_archive(s3: Any, bucket: str, destination: Path, tenants: tuple[str, ...] = ()) -> int:
    """Copy ``archive/`` (or only the tenants' directories) into ``destination``; objects copied."""
    prefixes = [f"{ARCHIVE_PREFIX}tenant={quote(t, safe='')}/" for t in tenants] or [ARCHIVE_PREFIX]
    copied = 0
    paginator = s3.get_paginator("list_objects_v2")
    for prefix in prefixes:
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                key = item["Key"]
                target = destination / key.removeprefix(ARCHIVE_PREFIX)
                target.parent.mkdir(parents=True, exist_ok=True)
                s3.download_file(bucket, key, str(target))
                copied += 1
    return copied


def job_command(
    target: LocalTarget, request: ReplayRequest, archive_dir: Path, output_dir: Path
) -> list[str]:
    arguments = {
        "--archive_path": str(archive_dir),
        "--output_path": str(output_dir),
        "--queue_urls": ",".join(target.queue_urls),
        "--shard_size": str(min(target.shard_size, len(target.queue_urls))),
        "--fair_queues": "true" if target.fair_queues else "false",
        "--endpoint_url": target.endpoint_url or "",
        **request.job_arguments(),
    }
    command = [sys.executable, str(JOB_SCRIPT)]
    for name, value in arguments.items():
        if value:
            command += [name, value]
    return command


def job_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A local[2] session on the loopback; the job's imports found as on Glue's executors."""
    paths = [str(ROOT), str(ROOT / "functions"), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        **(extra or {}),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": os.pathsep.join(path for path in paths if path),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_SUBMIT_ARGS": (
            "--master local[2] --conf spark.ui.enabled=false --conf spark.ui.showConsoleProgress=false "
            "--conf spark.driver.bindAddress=127.0.0.1 --conf spark.sql.session.timeZone=UTC "
            "--conf spark.sql.shuffle.partitions=4 --conf spark.default.parallelism=2 pyspark-shell"
        ),
    }


@dataclass(frozen=True)
class LocalRun:
    run_id: str
    staged_objects: int
    report: dict[str, Any]  # the job's run report (read, rejected, expired, deduplicated, replayed, failed)
    output_dir: Path
    seconds: float
    session: dict[str, Any]  # the JVM the job's local session got (its collectors)


class ReplayError(RuntimeError):
    pass


def run_local(
    target: LocalTarget,
    request: ReplayRequest,
    workdir: Path,
    *,
    s3: Any,
    env: dict[str, str] | None = None,
    timeout_s: float = 600,
) -> LocalRun:
    """Stage the archive, run the job's entry point on local[2], return its report."""
    run_id = request.run_id or uuid.uuid4().hex[:12]
    request = ReplayRequest(**{**request.__dict__, "run_id": run_id})
    archive_dir, output_dir = workdir / f"archive-{run_id}", workdir / "replay"
    shutil.rmtree(archive_dir, ignore_errors=True)  # a rerun of a run id stages afresh
    archive_dir.mkdir(parents=True, exist_ok=True)
    staged = stage_archive(s3, target.bucket, archive_dir, request.tenants)
    started = time.monotonic()
    completed = subprocess.run(  # noqa: S603 - our own job script, with our own arguments
        job_command(target, request, archive_dir, output_dir),
        env=job_environment(env),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    seconds = time.monotonic() - started
    printed = {
        key: value
        for line in completed.stdout.splitlines()
        if line.startswith('{"replay_')
        for key, value in json.loads(line).items()
    }
    report = printed.get("replay_report")
    if completed.returncode != 0 or report is None:
        tail = "\n".join(completed.stderr.splitlines()[-30:])
        raise ReplayError(f"replay job exited {completed.returncode}:\n{tail}")
    session = printed.get("replay_session", {})
    return LocalRun(run_id, staged, report, output_dir / f"run={run_id}", round(seconds, 1), session)
