"""The local replay (``bin/replay --local``, ``LocalRuntime.run_replay``): archive staged from moto's S3,
the job's entry point run as its own process on local[2], envelopes sent to moto's queues."""

from __future__ import annotations

import gzip
from pathlib import Path

import boto3
import pytest

from breakwater.archive import object_key, partition_for
from local.emulator.embedded_aws import FAKE_CREDENTIALS
from local.emulator.replay import LocalTarget, ReplayRequest, run_local
from tests.spark.helpers import T0, envelope
from tests.spark.test_replay_main import _drain, moto_endpoint  # noqa: F401 - the fixture

pytestmark = pytest.mark.slow


def _put_archive(s3: object, bucket: str, tenant: str, count: int, at: int) -> None:
    lines = "".join(envelope(tenant, at + i).to_json() + "\n" for i in range(count))
    key = object_key(partition_for(tenant, at), f"{tenant}-obj", "archive/")
    s3.put_object(Bucket=bucket, Key=key, Body=gzip.compress(lines.encode()))  # type: ignore[attr-defined]


def test_run_local_stages_the_archive_and_replays_it_into_the_live_queues(
    tmp_path: Path,
    moto_endpoint: str,  # noqa: F811 - the fixture
) -> None:
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket="archive-bucket")
    _put_archive(s3, "archive-bucket", "noisy", 30, T0)
    _put_archive(s3, "archive-bucket", "quiet", 5, T0 + 3_600_000)
    sqs = boto3.client("sqs", endpoint_url=moto_endpoint, region_name="us-east-1")
    urls = [sqs.create_queue(QueueName=f"local-replay-live-{i}")["QueueUrl"] for i in range(2)]
    target = LocalTarget("archive-bucket", tuple(urls), 2, True, moto_endpoint)
    env = {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": moto_endpoint, "AWS_REGION": "us-east-1"}

    dry = run_local(target, ReplayRequest(dry_run=True, tenants=("quiet",)), tmp_path, s3=s3, env=env)
    assert dry.staged_objects == 1 and dry.report["read"] == 5 and dry.report["replayed"] == 0

    run = run_local(target, ReplayRequest(target_rate=500, run_id="local-1"), tmp_path, s3=s3, env=env)
    assert run.staged_objects == 2
    assert {k: run.report[k] for k in ("read", "rejected", "replayed", "failed")} == {
        "read": 35, "rejected": 0, "replayed": 35, "failed": 0,
    }  # fmt: skip
    assert (run.output_dir / "report.json").exists()
    # The job's local session got LOCAL_SESSION_CONF's JVM: the parallel collector took effect.
    assert set(run.session["collectors"]) == {"PS Scavenge", "PS MarkSweep"}
    bodies = _drain(sqs, urls)
    assert len(bodies) == 35 and {b["origin"] for b in bodies} == {"replay"}
    assert {b["replay_run"] for b in bodies} == {"local-1"}
