"""The emulated SQS event source mappings honour Lambda's semantics, against moto's server.

The queue, function and mapping are made through the AWS APIs here (this tests the emulator, not
the stack); the function is a probe whose record bodies say what to do.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from local.emulator import mappings as mappings_module
from local.emulator.assembly import CloudAssembly
from local.emulator.discovery import INVOCATIONS_PER_POLLER, MappingSpec, mapping_concurrency
from local.emulator.embedded_aws import EmbeddedAws
from local.emulator.functions import FunctionPool, FunctionSpec
from local.emulator.mappings import MappingConfigs, SqsMapping
from tests.local.helpers import wait_for

PROBE = Path(__file__).parent / "handlers"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool(aws: EmbeddedAws) -> Iterator[FunctionPool]:
    spec = FunctionSpec(
        "Probe",
        "probe",
        "arn:aws:lambda:us-east-1:123456789012:function:probe",
        "probe/handler.handler",
        5,
        128,
        {},
        PROBE,
    )
    env = {**aws.environment(), "AWS_LAMBDA_FUNCTION_NAME": "probe"}
    function_pool = FunctionPool(spec, env, lambda _fn, _line: None, max_containers=4)
    yield function_pool
    function_pool.stop()


@pytest.fixture(autouse=True)
def fast_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mappings_module, "REFRESH_SECONDS", 0.2)


def depth(aws: EmbeddedAws, url: str) -> int:
    attributes = aws.client("sqs").get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


def make_mapping(aws: EmbeddedAws, pool: FunctionPool, name: str, **esm: Any) -> tuple[SqsMapping, str, str]:
    sqs, lam, iam = aws.client("sqs"), aws.client("lambda"), aws.client("iam")
    dlq = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    url = sqs.create_queue(
        QueueName=name,
        Attributes={
            "VisibilityTimeout": "1",
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}),
        },
    )["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    try:
        role = iam.create_role(RoleName="probe", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        lam.create_function(
            FunctionName="probe",
            Runtime="python3.12",
            Role=role,
            Handler="probe/handler.handler",
            Code={"ZipFile": b"PK\x05\x06" + b"\0" * 18},
        )
    except lam.exceptions.ResourceConflictException:
        pass
    except iam.exceptions.EntityAlreadyExistsException:
        pass
    uuid = lam.create_event_source_mapping(EventSourceArn=arn, FunctionName="probe", **esm)["UUID"]
    spec = MappingSpec(uuid, "Probe", arn, url)
    mapping = SqsMapping(spec, pool, aws, ThreadPoolExecutor(8), default_max_concurrency=4)
    return mapping, url, dlq


def test_partial_failures_are_retried_then_go_to_the_dlq(aws: EmbeddedAws, pool: FunctionPool) -> None:
    mapping, url, dlq = make_mapping(
        aws, pool, "partial", BatchSize=10, FunctionResponseTypes=["ReportBatchItemFailures"]
    )
    sqs = aws.client("sqs")
    for body in ("ok-1", "ok-2", "ok-3", "fail-1"):
        sqs.send_message(QueueUrl=url, MessageBody=body)
    mapping.start()
    try:
        assert wait_for(lambda: depth(aws, dlq) == 1)
        assert wait_for(lambda: depth(aws, url) == 0)
    finally:
        mapping.stop()
    moved = sqs.receive_message(QueueUrl=dlq)["Messages"][0]["Body"]
    assert moved == "fail-1"
    assert mapping.stats.deleted == 3  # the successes, once; the failure never
    assert mapping.stats.reported_failures == 2  # delivered twice (maxReceiveCount 2), then redriven by SQS


def test_a_function_error_deletes_nothing(aws: EmbeddedAws, pool: FunctionPool) -> None:
    mapping, url, dlq = make_mapping(
        aws, pool, "crash", BatchSize=10, FunctionResponseTypes=["ReportBatchItemFailures"]
    )
    sqs = aws.client("sqs")
    for body in ("ok-1", "crash"):
        sqs.send_message(QueueUrl=url, MessageBody=body)
    mapping.start()
    try:
        assert wait_for(lambda: depth(aws, dlq) == 2)
    finally:
        mapping.stop()
    assert mapping.stats.deleted == 0
    assert mapping.stats.function_errors >= 1


def test_maximum_concurrency_bounds_parallel_invocations(aws: EmbeddedAws, pool: FunctionPool) -> None:
    mapping, url, _ = make_mapping(aws, pool, "bounded", BatchSize=1, ScalingConfig={"MaximumConcurrency": 2})
    sqs = aws.client("sqs")
    for index in range(12):
        sqs.send_message(QueueUrl=url, MessageBody=f"sleep-{index}")
    mapping.start()
    try:
        assert wait_for(lambda: depth(aws, url) == 0, timeout=30)
    finally:
        mapping.stop()
    assert mapping.stats.max_in_flight == 2  # reached, never exceeded, though the pool has 4 containers
    assert mapping.stats.batch_sizes and max(mapping.stats.batch_sizes) == 1


def test_a_slot_is_free_when_the_function_returns_not_after_the_delete(
    aws: EmbeddedAws, pool: FunctionPool
) -> None:
    # Lambda's MaximumConcurrency bounds invocations; the service's delete after one is not an
    # invocation. So with both slots' deletes held back, a third batch is still invoked.
    mapping, url, _ = make_mapping(
        aws, pool, "settling", BatchSize=1, ScalingConfig={"MaximumConcurrency": 2}
    )
    sqs = aws.client("sqs")
    for index in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=f"ok-{index}")
    before = pool.invocations
    third_invoked_while_deleting = threading.Event()

    def hold_the_delete(**_: Any) -> None:
        if wait_for(lambda: pool.invocations - before >= 3, timeout=5):
            third_invoked_while_deleting.set()

    mapping._sqs.meta.events.register("before-call.sqs.DeleteMessageBatch", hold_the_delete)
    mapping.start()
    try:
        assert wait_for(lambda: depth(aws, url) == 0, timeout=30)
        mapping.drain()
    finally:
        mapping.stop()
    assert third_invoked_while_deleting.is_set()
    assert mapping.stats.max_in_flight == 2
    assert mapping.stats.deleted == 3


def test_a_disabled_mapping_does_not_poll(aws: EmbeddedAws, pool: FunctionPool) -> None:
    mapping, url, _ = make_mapping(aws, pool, "toggled", BatchSize=5, Enabled=False)
    sqs, lam = aws.client("sqs"), aws.client("lambda")
    sqs.send_message(QueueUrl=url, MessageBody="ok-waiting")
    mapping.start()
    try:
        time.sleep(1.0)
        assert mapping.stats.polls == 0
        assert depth(aws, url) == 1
        lam.update_event_source_mapping(UUID=mapping.spec.uuid, Enabled=True)  # as the controller does
        assert wait_for(lambda: depth(aws, url) == 0)
        lam.update_event_source_mapping(UUID=mapping.spec.uuid, Enabled=False)
        time.sleep(0.6)
        polls = mapping.stats.polls
        time.sleep(1.0)
        assert mapping.stats.polls == polls
    finally:
        mapping.stop()


def test_the_context_honours_the_function_timeout(pool: FunctionPool) -> None:
    lines: list[str] = []
    probe = FunctionPool(pool.spec, pool._runtime_env, lambda _fn, line: lines.append(line), max_containers=1)
    try:
        invocation = probe.invoke({"Records": [{"messageId": "m", "body": "ok"}]})
    finally:
        probe.stop()
    assert invocation.ok and invocation.result == {"batchItemFailures": []}
    remaining = next(json.loads(line)["remaining_ms"] for line in lines if "remaining_ms" in line)
    assert 0 < remaining <= 5000


def test_one_listing_serves_every_mapping_until_it_is_older_than_asked(
    aws: EmbeddedAws, pool: FunctionPool
) -> None:
    first, _, _ = make_mapping(aws, pool, "configs-a", BatchSize=3)
    second, _, _ = make_mapping(aws, pool, "configs-b", BatchSize=4)
    configs = MappingConfigs(aws)
    calls: list[str] = []
    aws_lambda = configs._lambda
    aws_lambda.meta.events.register("before-call.lambda", lambda model, **_: calls.append(model.name))
    assert configs.get(first.spec.uuid, 60)["BatchSize"] == 3
    assert configs.get(second.spec.uuid, 60)["BatchSize"] == 4
    assert calls == ["ListEventSourceMappings"]  # one read for both
    aws.client("lambda").update_event_source_mapping(UUID=second.spec.uuid, BatchSize=7)
    assert configs.get(second.spec.uuid, 60)["BatchSize"] == 4  # young enough: not read again
    time.sleep(0.05)
    assert configs.get(second.spec.uuid, 0.01)["BatchSize"] == 7  # older than asked: read again
    assert calls == ["ListEventSourceMappings", "ListEventSourceMappings"]
    with pytest.raises(aws_lambda.exceptions.ResourceNotFoundException):
        configs.get("00000000-0000-0000-0000-000000000000", 60)


def receiving_threads(mapping: SqsMapping) -> set[str]:
    """The names of the threads that call ReceiveMessage for ``mapping`` from now on."""
    names: set[str] = set()
    mapping._sqs.meta.events.register(
        "before-call.sqs.ReceiveMessage", lambda **_: names.add(threading.current_thread().name)
    )
    return names


def test_minimum_pollers_always_poll_while_the_mapping_is_enabled(
    aws: EmbeddedAws, pool: FunctionPool
) -> None:
    mapping, url, _ = make_mapping(
        aws,
        pool,
        "provisioned-idle",
        BatchSize=1,
        Enabled=False,
        ProvisionedPollerConfig={"MinimumPollers": 3, "MaximumPollers": 4},
    )
    lam = aws.client("lambda")
    receivers = receiving_threads(mapping)
    mapping.start()
    try:
        time.sleep(0.6)
        assert mapping.stats.polls == 0 and mapping.stats.pollers == 1  # disabled: one waits, none polls
        lam.update_event_source_mapping(UUID=mapping.spec.uuid, Enabled=True)
        # An empty queue all along: three pollers receive from it all the same, and no fourth starts.
        assert wait_for(lambda: len(receivers) == 3 and mapping.stats.empty_polls >= 9)
        assert mapping.stats.pollers == 3
        assert mapping.stats.max_pollers == 3
        lam.update_event_source_mapping(UUID=mapping.spec.uuid, Enabled=False)
        assert wait_for(lambda: mapping.stats.pollers == 1)
    finally:
        mapping.stop()
    assert depth(aws, url) == 0


def test_pollers_scale_to_the_maximum_under_load_and_back_to_the_minimum(
    aws: EmbeddedAws, pool: FunctionPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One batch per poller instead of Lambda's ten, so that four containers can keep every poller busy.
    monkeypatch.setattr(mappings_module, "INVOCATIONS_PER_POLLER", 1)
    mapping, url, _ = make_mapping(
        aws,
        pool,
        "provisioned-busy",
        BatchSize=1,
        ProvisionedPollerConfig={"MinimumPollers": 2, "MaximumPollers": 3},
    )
    sqs = aws.client("sqs")
    for index in range(12):
        sqs.send_message(QueueUrl=url, MessageBody=f"sleep-{index}")
    mapping.start()
    try:
        assert wait_for(lambda: depth(aws, url) == 0, timeout=30)
        assert wait_for(lambda: mapping.stats.pollers == 2)  # the queue is empty: the third stopped
    finally:
        mapping.stop()
    assert mapping.stats.max_pollers == 3  # reached, never exceeded, though the pool has 4 containers
    assert mapping.stats.max_in_flight == 3  # each poller holds at most its own batches
    assert mapping.stats.deleted == 12


def test_the_functions_containers_bound_a_provisioned_mapping(aws: EmbeddedAws, pool: FunctionPool) -> None:
    # Two pollers may hold twenty batches, but the function has four containers: four in flight, and
    # no third poller, as the two are never all busy.
    mapping, url, _ = make_mapping(
        aws,
        pool,
        "provisioned-capped",
        BatchSize=1,
        ProvisionedPollerConfig={"MinimumPollers": 2, "MaximumPollers": 200},
    )
    sqs = aws.client("sqs")
    for index in range(12):
        sqs.send_message(QueueUrl=url, MessageBody=f"sleep-{index}")
    mapping.start()
    try:
        assert wait_for(lambda: depth(aws, url) == 0, timeout=30)
    finally:
        mapping.stop()
    assert mapping.stats.max_in_flight == 4
    assert mapping.stats.max_pollers == 2
    assert mapping.stats.deleted == 12


def test_a_provisioned_mapping_gives_its_function_what_its_maximum_pollers_run() -> None:
    def mapping(function: str, queue: str, **properties: Any) -> dict[str, Any]:
        return {
            "Type": "AWS::Lambda::EventSourceMapping",
            "Properties": {
                "FunctionName": {"Ref": function},
                "EventSourceArn": {"Fn::GetAtt": [queue, "Arn"]},
                **properties,
            },
        }

    resources = {
        "Live": mapping("Worker", "Live", ProvisionedPollerConfig={"MinimumPollers": 2, "MaximumPollers": 5}),
        "Surge": mapping("Worker", "Surge", ScalingConfig={"MaximumConcurrency": 3}),
        "Fifo": mapping("FifoWorker", "Fifo", ProvisionedPollerConfig={"MinimumPollers": 4}),
    }
    assembly = CloudAssembly(Path("cdk.out"), "Stack", {"Resources": resources})

    assert mapping_concurrency(assembly) == {
        "Worker": 5 * INVOCATIONS_PER_POLLER + 3,
        "FifoWorker": 200 * INVOCATIONS_PER_POLLER,  # Lambda's default maximum
    }
