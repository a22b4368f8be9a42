"""The emulator's replay runner (``bin/replay --local``, ``LocalRuntime.run_replay``): the archive staged
from the embedded S3, the job's entry point run as its own process on local[2], envelopes sent to the
embedded queues."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from breakwater.archive import object_key, partition_for
from local.emulator.embedded_aws import EmbeddedAws
from local.emulator.replay import LocalTarget, ReplayRequest, run_local
from tests.spark.helpers import T0, envelope

pytestmark = pytest.mark.slow


def _put_archive(s3: Any, bucket: str, tenant: str, count: int, at: int) -> None:
    lines = "".join(envelope(tenant, at + i).to_json() + "\n" for i in range(count))
    key = object_key(partition_for(tenant, at), f"{tenant}-obj", "archive/")
    s3.put_object(Bucket=bucket, Key=key, Body=gzip.compress(lines.encode()))


def _drain(sqs: Any, urls: list[str]) -> list[dict[str, Any]]:
    bodies: list[dict[str, Any]] = []
    for url in urls:
        while messages := sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", []):
            bodies.extend(json.loads(m["Body"]) for m in messages)
            sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
            )
    return bodies


def test_run_local_stages_the_archive_and_replays_it_into_the_live_queues(
    tmp_path: Path, aws: EmbeddedAws
) -> None:
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="archive-bucket")
    _put_archive(s3, "archive-bucket", "noisy", 30, T0)
    _put_archive(s3, "archive-bucket", "quiet", 5, T0 + 3_600_000)
    sqs = aws.client("sqs")
    urls = [sqs.create_queue(QueueName=f"local-replay-live-{i}")["QueueUrl"] for i in range(2)]
    target = LocalTarget("archive-bucket", tuple(urls), 2, True, aws.endpoint)
    env = aws.environment()  # what LocalRuntime.run_replay gives the job

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
