"""The chaos run's faults inside the containers: kills the pool survives, and AWS answers botocore retries."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from breakwater.archive import encode_ndjson_gz
from local.emulator.container import FAULT_LOG_ENV, KILLS_ENV, AwsFaults, FaultLog
from local.emulator.embedded_aws import EmbeddedAws
from local.emulator.functions import FunctionPool, FunctionSpec
from local.scenarios.chaos import archived

PROBE = Path(__file__).parent / "handlers"
SLEEPY = {"Records": [{"messageId": "m", "body": "sleep"}]}  # the probe sleeps a moment on it
QUICK = {"Records": [{"messageId": "m", "body": "ok"}]}


def probe_pool(env: dict[str, str] | None = None) -> FunctionPool:
    spec = FunctionSpec(
        "Probe", "probe", "arn:aws:lambda:us-east-1:123456789012:function:probe", "probe/handler.handler",
        5, 128, {}, PROBE,
    )  # fmt: skip
    return FunctionPool(spec, {"AWS_LAMBDA_FUNCTION_NAME": "probe", **(env or {})}, lambda *_: None, 1)


@pytest.fixture
def pool() -> Iterator[FunctionPool]:
    function_pool = probe_pool()
    yield function_pool
    function_pool.stop()


def test_a_container_killed_mid_invocation_fails_it_as_a_crashed_lambda_and_is_replaced(
    pool: FunctionPool,
) -> None:
    assert pool.invoke(QUICK).ok
    container = pool._idle[0]
    box: list[Any] = []
    invoking = threading.Thread(target=lambda: box.append(pool.invoke(SLEEPY)))
    invoking.start()
    time.sleep(0.1)  # inside the probe's sleep
    container.process.kill()
    invoking.join(10)
    crashed = box[0]
    assert crashed.error["errorType"] == "Runtime.ExitError"
    assert "Runtime exited with error: signal: killed" in crashed.error["errorMessage"]
    assert pool.crashes == 1 and container not in pool._all
    again = pool.invoke(QUICK)  # in a new container
    assert again.ok and again.cold_start_ms is not None


def test_a_kill_switch_kills_the_invocations_it_picks_and_writes_them_down(tmp_path: Path) -> None:
    log = tmp_path / "faults.jsonl"
    kills = {"probe/": {"rate": 1.0, "within_s": 0.05, "kind": "worker_killed", "seed": 3}}
    pool = probe_pool({KILLS_ENV: json.dumps(kills), FAULT_LOG_ENV: str(log)})
    try:
        first, second = pool.invoke(SLEEPY), pool.invoke(SLEEPY)
    finally:
        pool.stop()
    assert first.error and first.error["errorType"] == "Runtime.ExitError"
    assert second.error and second.error["errorType"] == "Runtime.ExitError"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["kind"] for line in lines] == ["worker_killed", "worker_killed"]
    assert {line["request_id"] for line in lines} == {first.request_id, second.request_id}
    assert pool.crashes == 2


def client(service: str, faults: AwsFaults) -> Any:
    made = boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    ).client(service, endpoint_url="http://127.0.0.1:9", config=Config(retries={"max_attempts": 0}))
    made.meta.events.register("before-send.*.*", faults)
    return made


CALLS = {
    "sqs": (
        lambda c: c.send_message(QueueUrl="http://127.0.0.1:9/q", MessageBody="x"),
        "ThrottlingException",
    ),
    "dynamodb": (lambda c: c.get_item(TableName="t", Key={"k": {"S": "v"}}), "ThrottlingException"),
    "lambda": (lambda c: c.invoke(FunctionName="f"), "ThrottlingException"),
    "s3": (lambda c: c.get_object(Bucket="b", Key="k"), "SlowDown"),
    "sts": (lambda c: c.get_caller_identity(), "Throttling"),
}


@pytest.mark.parametrize("service", sorted(CALLS))
def test_an_injected_throttle_or_500_reads_as_aws_answers_read(service: str, tmp_path: Path) -> None:
    call, throttle_code = CALLS[service]
    log = tmp_path / "faults.jsonl"
    throttles = AwsFaults(1.0, 0.0, seed=1, log=FaultLog(str(log), "probe"))
    errors = AwsFaults(0.0, 1.0, seed=1, log=FaultLog(str(log), "probe"))
    throttles.armed = errors.armed = True
    with pytest.raises(ClientError) as throttled:
        call(client(service, throttles))
    assert throttled.value.response["Error"]["Code"] == throttle_code
    with pytest.raises(ClientError) as failed:
        call(client(service, errors))
    assert failed.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    kinds = [json.loads(line)["kind"] for line in log.read_text().splitlines()]
    assert kinds == ["aws_throttle", "aws_server_error"]


def test_aws_faults_wait_until_armed_and_keep_to_their_rate() -> None:
    faults = AwsFaults(0.1, 0.05, seed=2, log=FaultLog(None, "probe"))
    request = type("Request", (), {"url": "http://x", "headers": {}})()
    assert all(faults(request=request, event_name="before-send.sqs.SendMessage") is None for _ in range(200))
    faults.armed = True
    answers = [faults(request=request, event_name="before-send.sqs.SendMessage") for _ in range(4000)]
    statuses = [answer.status_code for answer in answers if answer is not None]
    assert 300 < statuses.count(400) < 500 and 120 < statuses.count(500) < 280


def test_the_archive_s_envelopes_are_accounted_for_by_tenant_and_key(aws: EmbeddedAws) -> None:
    s3 = aws.client("s3")
    s3.create_bucket(Bucket="archive")
    bodies = [
        json.dumps({"id": "01A", "tenant": "t1", "dedup_key": "k-1"}),
        json.dumps({"id": "01B", "tenant": "t2"}),  # no key: its id stands for it
        "not an envelope",
    ]
    s3.put_object(
        Bucket="archive", Key="tenant=t1/dt=2026-01-01/hour=00/a.ndjson.gz", Body=encode_ndjson_gz(bodies)
    )
    runtime = SimpleNamespace(aws=aws, deployment=SimpleNamespace(outputs={"ArchiveBucketName": "archive"}))
    assert archived(runtime) == {("t1", "k-1"), ("t2", "id:01B")}  # type: ignore[arg-type]
