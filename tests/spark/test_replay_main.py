"""``main`` end to end: a local archive replayed into queues of moto's server.

Executors are separate Python processes, so an in-process ``mock_aws`` would not reach them: moto runs
as a server on 127.0.0.1 and the job gets its address as ``endpoint_url``, as it would any endpoint.
"""

from __future__ import annotations

import gzip
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from glue_jobs.replay_backlog import READ_CONF, ReplayArgs, main
from glue_jobs.replay_load import read_archive
from tests.spark.helpers import NOW, T0, archive_envelopes, envelope, write_archive

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def _queues(endpoint: str, prefix: str, count: int) -> tuple[object, list[str]]:
    sqs = boto3.client("sqs", endpoint_url=endpoint, region_name="us-east-1")
    return sqs, [sqs.create_queue(QueueName=f"{prefix}-live-{i}")["QueueUrl"] for i in range(count)]


def _drain(sqs, urls: list[str]) -> list[dict]:
    bodies: list[dict] = []
    for url in urls:
        while True:
            messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
            if not messages:
                break
            bodies.extend(json.loads(m["Body"]) for m in messages)
            sqs.delete_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)],
            )
    return bodies


def test_every_valid_archived_envelope_is_replayed_exactly_once(spark, tmp_path, moto_endpoint) -> None:
    sqs, urls = _queues(moto_endpoint, "e2e", 4)
    valid = [envelope("noisy", T0 + i) for i in range(40)] + [
        envelope(f"quiet-{n}", T0 + n) for n in range(5)
    ]
    expired = envelope("quiet-0", T0 + 50, expires_at=NOW - 1)
    superseded = envelope("quiet-1", T0 + 60, dedup_key="k")
    winner = envelope("quiet-1", T0 + 70, dedup_key="k")
    archive = tmp_path / "archive"
    archive_envelopes(archive, [*valid, expired, superseded, winner], name="first")
    archive_envelopes(archive, valid[:10], name="crash-duplicate")
    write_archive(archive, ["{broken", ""], tenant="quiet-2", name="bad")

    args = ReplayArgs(
        archive_path=str(archive),
        output_path=str(tmp_path / "out"),
        queue_urls=tuple(urls),
        shard_size=2,
        target_rate=400,
        run_id="run-e2e",
        endpoint_url=moto_endpoint,
    )
    report = main(spark, args, now_ms=NOW)

    replayed = _drain(sqs, urls)
    expected = {e.id for e in [*valid, winner]}
    assert sorted(b["id"] for b in replayed) == sorted(expected)  # exactly once each
    assert {(b["origin"], b["replay_run"]) for b in replayed} == {("replay", "run-e2e")}
    assert (report.read, report.rejected, report.expired, report.deduplicated) == (59, 1, 1, 11)
    assert (report.replayed, report.failed) == (len(expected), 0)
    written = json.loads((tmp_path / "out" / "run=run-e2e" / "report.json").read_text())
    assert written["replayed"] == len(expected) and written["rejected"] == 1
    reject_files = list((tmp_path / "out" / "run=run-e2e" / "rejects").glob("*.json.gz"))
    rejects = [
        json.loads(line) for f in reject_files for line in gzip.decompress(f.read_bytes()).splitlines()
    ]
    assert [(r["line"], r["reject_reason"]) for r in rejects] == [
        ("{broken", "malformed: not a JSON object of the envelope's types")
    ]


def test_routing_matches_ingest(spark, tmp_path, moto_endpoint) -> None:
    from breakwater.routing import shard_for

    sqs, urls = _queues(moto_endpoint, "routing", 5)
    items = [envelope(f"tenant-{n}", T0 + n) for n in range(12)]
    archive_envelopes(tmp_path / "archive", items)
    args = ReplayArgs(
        archive_path=str(tmp_path / "archive"), output_path=str(tmp_path / "out"),
        queue_urls=tuple(urls), shard_size=2, target_rate=500, endpoint_url=moto_endpoint,
    )  # fmt: skip
    main(spark, args, now_ms=NOW)
    for index, url in enumerate(urls):
        for body in _drain(sqs, [url]):
            assert index in shard_for(body["tenant"], 5, 2)


def test_failed_sends_go_to_a_replayable_failures_output(spark, tmp_path, moto_endpoint) -> None:
    items = [envelope("acme", T0 + n) for n in range(7)]
    archive_envelopes(tmp_path / "archive", items)
    missing = f"{moto_endpoint}/123456789012/no-such-queue"
    args = ReplayArgs(
        archive_path=str(tmp_path / "archive"), output_path=str(tmp_path / "out"), queue_urls=(missing,),
        target_rate=1000, run_id="run-fail", endpoint_url=moto_endpoint,
    )  # fmt: skip
    report = main(spark, args, now_ms=NOW)

    assert (report.replayed, report.failed) == (0, 7)
    failures = read_archive(spark, str(tmp_path / "out" / "run=run-fail" / "failures"))
    assert sorted(row["id"] for row in failures.collect()) == sorted(e.id for e in items)
    assert {row["origin"] for row in failures.collect()} == {"backlog"}  # the original, not the replay copy


def test_dry_run_sends_nothing_and_reports(spark, tmp_path, moto_endpoint) -> None:
    sqs, urls = _queues(moto_endpoint, "dry", 1)
    archive_envelopes(tmp_path / "archive", [envelope("acme", T0 + n) for n in range(5)])
    args = ReplayArgs(
        archive_path=str(tmp_path / "archive"), output_path=str(tmp_path / "out"), queue_urls=tuple(urls),
        dry_run=True, endpoint_url=moto_endpoint,
    )  # fmt: skip
    report = main(spark, args, now_ms=NOW)
    assert (report.read, report.replayed, report.deduplicated) == (5, 0, 0)
    assert _drain(sqs, urls) == []


def test_main_reads_with_the_jobs_read_settings(spark, tmp_path, moto_endpoint) -> None:
    """Small gzip objects are packed by their size, not by Spark's 4 MiB open cost (the bench's settings)."""
    for name in READ_CONF:
        spark.conf.unset(name)
    archive_envelopes(tmp_path / "archive", [envelope(f"t{n}", T0 + n) for n in range(3)])
    args = ReplayArgs(archive_path=str(tmp_path / "archive"), output_path=str(tmp_path / "out"), dry_run=True)
    main(spark, args, now_ms=NOW)
    assert {name: spark.conf.get(name) for name in READ_CONF} == READ_CONF


def test_arguments_from_glue_options() -> None:
    args = ReplayArgs.from_mapping(
        {
            "archive_path": "s3://b/archive/", "output_path": "s3://b/replay/", "queue_urls": "u0,u1",
            "shard_size": "2", "target_rate": "250", "window_start": "2026-01-01T00:00:00", "window_end": "",
            "tenants": "a,b", "cutoff": "1767225600000", "dry_run": "true", "run_id": "", "fair_queues": "",
            "partitions": "", "endpoint_url": "",
        }
    )  # fmt: skip
    assert args.queue_urls == ("u0", "u1") and args.tenants == ("a", "b")
    assert args.window_start_ms == T0 and args.window_end_ms is None and args.cutoff_ms == T0
    assert args.dry_run and args.fair_queues and args.endpoint_url is None and len(args.run_id) == 12
    with pytest.raises(ValueError, match="queue_urls"):
        ReplayArgs.from_mapping({"archive_path": "a", "output_path": "b"})


def test_glue_entry_point_imports_awsglue_only_under_main() -> None:
    source = (Path(__file__).resolve().parents[2] / "glue_jobs" / "replay_backlog.py").read_text()
    head, _, tail = source.partition('if __name__ == "__main__":')
    assert "awsglue" not in head.replace("``awsglue``", "") and "from awsglue" in tail
    transforms = (Path(__file__).resolve().parents[2] / "glue_jobs" / "replay_transforms.py").read_text()
    imports = {line.split()[1] for line in transforms.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"__future__", "pyspark.sql", "pyspark.sql.types"}
