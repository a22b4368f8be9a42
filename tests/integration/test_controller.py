"""The controller throttles a tenant whose backlog grows, releases it as it drains, and gates the drainers;
it reads only the tenants whose counters changed and corrects an estimate the queues contradict."""

from __future__ import annotations

import io
import json
import zipfile
from types import ModuleType
from typing import Any

import boto3
import pytest

from breakwater.aws.counters import add_counters
from local.emulator import moto_patches
from local.emulator.moto_patches import lambda_ as lambda_patches
from tests.integration import worker_fixtures
from tests.integration.worker_fixtures import (
    REGION,
    STATE_TABLE,
    TENANTS_TABLE,
    TIERS,
    WorkerWorld,
    add_tenant,
    load,
    now_ms,
)

world = worker_fixtures.world  # the fixture


def create_function(name: str) -> None:
    iam = boto3.client("iam", region_name=REGION)
    try:
        role = iam.get_role(RoleName="function")["Role"]["Arn"]
    except iam.exceptions.NoSuchEntityException:
        role = iam.create_role(RoleName="function", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("handler.py", "def handler(event, context):\n    return {}\n")
    boto3.client("lambda", region_name=REGION).create_function(
        FunctionName=name,
        Runtime="python3.11",
        Role=role,
        Handler="handler.handler",
        Code={"ZipFile": archive.getvalue()},
    )


def sideline_mapping(world: WorkerWorld) -> str:
    create_function("sideline-worker")
    functions = boto3.client("lambda", region_name=REGION)
    mapping = functions.create_event_source_mapping(
        EventSourceArn=world.arn(world.urls["backlog"]), FunctionName="sideline-worker", Enabled=False
    )
    return str(mapping["UUID"])


def add_dirty_index(world: WorkerWorld) -> None:
    """The state table's index of changed tenants, as breakwater_cdk/tables.py declares it."""
    world.dynamodb.update_table(
        TableName=STATE_TABLE,
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
            {"AttributeName": "dirty_shard", "AttributeType": "S"},
        ],
        GlobalSecondaryIndexUpdates=[
            {
                "Create": {
                    "IndexName": "dirty",
                    "KeySchema": [
                        {"AttributeName": "dirty_shard", "KeyType": "HASH"},
                        {"AttributeName": "pk", "KeyType": "RANGE"},
                    ],
                    "Projection": {"ProjectionType": "KEYS_ONLY"},
                }
            }
        ],
    )


def enqueue(world: WorkerWorld, count: int, queue: str = "live-0") -> None:
    """Messages that really wait in a queue: the depth the estimates are reconciled with."""
    for start in range(0, count, 10):
        world.sqs.send_message_batch(
            QueueUrl=world.urls[queue],
            Entries=[{"Id": str(i), "MessageBody": "{}"} for i in range(min(10, count - start))],
        )


def environment(world: WorkerWorld, mapping: str) -> dict[str, str]:
    add_dirty_index(world)
    return {
        "TIERS": json.dumps(TIERS),
        "DEFAULT_TIER": "standard",
        "STATE_TABLE_NAME": STATE_TABLE,
        "TENANTS_TABLE_NAME": TENANTS_TABLE,
        "LIVE_QUEUE_URLS": world.urls["live-0"],
        "SIDELINE_QUEUE_URLS": f"{world.urls['spillover']},{world.urls['backlog']}",
        "SIDELINE_MAPPING_UUIDS": mapping,
        "BACKLOG_TARGET": "100",
        "MIN_MULTIPLIER": "0.1",
        "GROWTH_STEP": "0.1",
        "MAX_MULTIPLIER": "2",
        "HEALTHY_AGE_SECONDS": "60",
        "SURGE_QUEUE_URL": world.urls["surge"],
        "DIRTY_INDEX_NAME": "dirty",
    }


def multiplier(world: WorkerWorld, tenant: str) -> float:
    return float(world.item(f"tenant#{tenant}", "bucket#ingest").get("multiplier", 1))


def mapping_state(uuid: str) -> str:
    return str(boto3.client("lambda", region_name=REGION).get_event_source_mapping(UUID=uuid)["State"])


def report_live_age(world: WorkerWorld, age_ms: int, role: str = "live") -> None:
    world.put(
        {
            "pk": {"S": f"queue#{role}"},
            "sk": {"S": "health"},
            "oldest_age_ms": {"N": str(age_ms)},
            "observed_at": {"N": str(now_ms())},
        }
    )


def test_controller_throttles_a_growing_backlog_and_releases_it_after(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    for tenant in ("noisy", "quiet"):
        add_tenant(tenant, "standard")
    mapping = sideline_mapping(world)
    controller = load(monkeypatch, "controller.handler", environment(world, mapping))
    context: Any = worker_fixtures.FakeLambdaContext()
    dynamodb = world.dynamodb

    add_counters(dynamodb, STATE_TABLE, "noisy", {"accepted": 400, "processed": 100})  # backlog 300
    add_counters(dynamodb, STATE_TABLE, "quiet", {"accepted": 10, "processed": 10})
    enqueue(world, 300)
    report_live_age(world, 120_000)  # live queues are behind: the drainers must stay off
    first = controller.handler({}, context)
    assert multiplier(world, "noisy") == pytest.approx(100 / 300, abs=1e-3)
    assert multiplier(world, "quiet") == 1.0
    assert first["sideline_enabled"] is False and mapping_state(mapping) == "Disabled"
    assert first["backlogs"] == {"noisy": 300, "quiet": 0}

    add_counters(dynamodb, STATE_TABLE, "noisy", {"accepted": 600})  # backlog 900: push back harder
    enqueue(world, 600, queue="spillover")  # part of it sidelined: still in the system
    second = controller.handler({}, context)
    assert multiplier(world, "noisy") == pytest.approx(100 / 900, abs=1e-3)
    assert set(second["backlogs"]) == {"noisy"}  # quiet did not change: not read

    add_counters(dynamodb, STATE_TABLE, "noisy", {"processed": 850})  # drained: backlog 50
    for queue in ("live-0", "spillover"):
        world.sqs.purge_queue(QueueUrl=world.urls[queue])
    enqueue(world, 50)
    report_live_age(world, 1_000)  # live queues are healthy again
    last = controller.handler({}, context)
    assert multiplier(world, "noisy") == 1.0
    assert last["sideline_enabled"] is True and mapping_state(mapping) == "Enabled"
    # ingest's own attributes are never touched: the controller SETs only the multiplier
    assert set(world.item("tenant#noisy", "bucket#ingest")) == {"pk", "sk", "multiplier"}
    # Released: nothing left to look at until the next counter write.
    assert controller.handler({}, context)["backlogs"] == {}


def test_a_drifted_estimate_is_corrected_by_the_queues_depth(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counters say 5,000 waiting (a lost ``processed`` write); the queues hold 40: the tenant is not
    throttled for it, and its later traffic counts again from the corrected estimate."""
    add_tenant("victim", "standard")
    add_tenant("other", "standard")
    controller = load(monkeypatch, "controller.handler", environment(world, sideline_mapping(world)))
    context: Any = worker_fixtures.FakeLambdaContext()
    add_counters(world.dynamodb, STATE_TABLE, "victim", {"accepted": 5010})
    add_counters(world.dynamodb, STATE_TABLE, "other", {"accepted": 30})
    enqueue(world, 40)
    report = controller.handler({}, context)
    assert report["backlogs"]["victim"] <= 40 + 10 and multiplier(world, "victim") == 1.0
    counters = world.item("tenant#victim", "counters")
    assert float(counters["backlog_offset"]) < -4900 and "dirty_shard" not in counters
    add_counters(world.dynamodb, STATE_TABLE, "victim", {"accepted": 500})
    enqueue(world, 500)
    assert controller.handler({}, context)["backlogs"]["victim"] == pytest.approx(550, abs=10)
    assert multiplier(world, "victim") == pytest.approx(100 / 550, abs=0.02)


def test_a_phantom_beside_a_large_real_backlog_is_capped_by_the_tenants_own_queues(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four live queues, one per tenant (SHARD_SIZE 1): the total is within its tolerance of the
    estimates' sum, but the small tenant's own queue is empty, so its phantom goes in one run."""
    add_tenant("noisy", "standard")  # routed to live queue 3
    add_tenant("tiny", "standard")  # routed to live queue 1
    for index in (1, 2, 3):
        world.urls[f"live-{index}"] = world.sqs.create_queue(QueueName=f"bw-live-{index}")["QueueUrl"]
    live = ",".join(world.urls[f"live-{index}"] for index in range(4))
    env = environment(world, sideline_mapping(world)) | {"LIVE_QUEUE_URLS": live, "SHARD_SIZE": "1"}
    controller = load(monkeypatch, "controller.handler", env)
    add_counters(world.dynamodb, STATE_TABLE, "noisy", {"accepted": 300})
    enqueue(world, 300, queue="live-3")
    add_counters(world.dynamodb, STATE_TABLE, "tiny", {"accepted": 140})  # never sent: a lost count

    report = controller.handler({}, worker_fixtures.FakeLambdaContext())

    assert report["backlogs"] == {"noisy": 300, "tiny": 10}  # its empty queue plus the tolerance
    assert multiplier(world, "tiny") == 1.0
    assert multiplier(world, "noisy") == pytest.approx(100 / 300, abs=1e-3)


@pytest.fixture
def invocations() -> Any:
    """Lambda Invoke requests as moto receives them (its own runner would start Docker)."""
    received: list[tuple[str, dict[str, Any], str]] = []

    def record(function_name: str, payload: bytes, invocation_type: str) -> bytes:
        received.append((function_name, json.loads(payload), invocation_type))
        return b""

    with moto_patches.installed(names={"lambda.route_invocations"}):
        previous = lambda_patches.route_invocations(record)
        yield received
        lambda_patches.route_invocations(previous)


def archiving_controller(world: WorkerWorld, monkeypatch: pytest.MonkeyPatch) -> tuple[str, ModuleType]:
    """The backlog queue's drainer mapping and a controller with an archiver and budgets 600 s / 5."""
    add_tenant("noisy", "standard")
    mapping = sideline_mapping(world)
    create_function("archiver")
    env = environment(world, mapping) | {
        "SIDELINE_QUEUE_ROLES": "spillover,backlog",
        "ARCHIVER_FUNCTION_NAME": "archiver",
        "ARCHIVE_AGE_SECONDS": "600",
        "ARCHIVE_DEPTH": "5",
    }
    return mapping, load(monkeypatch, "controller.handler", env)


def test_controller_starts_the_archiver_for_a_sideline_queue_past_its_budget(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch, invocations: list[tuple[str, dict[str, Any], str]]
) -> None:
    _mapping, controller = archiving_controller(world, monkeypatch)
    context: Any = worker_fixtures.FakeLambdaContext()
    for _ in range(3):  # within both budgets
        world.sqs.send_message(QueueUrl=world.urls["spillover"], MessageBody="{}")
        world.sqs.send_message(QueueUrl=world.urls["backlog"], MessageBody="{}")
    # Live set behind: the drainers stay off (and moto's own mapping delivery never runs).
    report_live_age(world, 120_000)
    report_live_age(world, 599_000, role="spillover")
    assert controller.handler({}, context)["archiving"] == [] and invocations == []

    report_live_age(world, 601_000, role="spillover")  # the spillover's oldest is past the age budget
    for _ in range(2):  # the backlog reaches the depth budget
        world.sqs.send_message(QueueUrl=world.urls["backlog"], MessageBody="{}")
    report = controller.handler({}, context)
    assert report["archiving"] == [
        {"queue_url": world.urls["spillover"], "reason": "age"},
        {"queue_url": world.urls["backlog"], "reason": "depth"},
    ]
    assert invocations == [
        ("archiver", {"queue_url": world.urls["spillover"], "reason": "age"}, "Event"),
        ("archiver", {"queue_url": world.urls["backlog"], "reason": "depth"}, "Event"),
    ]


def test_a_queue_past_its_budget_is_held_for_the_archiver_and_released_under_it(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch, invocations: list[tuple[str, dict[str, Any], str]]
) -> None:
    mapping, controller = archiving_controller(world, monkeypatch)  # mapping: the backlog's drainer
    context: Any = worker_fixtures.FakeLambdaContext()
    report_live_age(world, 120_000)  # live set behind: the drainer is off (moto delivers nothing)
    # Delayed messages (a drainer's deferrals) wait too: they count toward the depth budget.
    world.sqs.send_message_batch(
        QueueUrl=world.urls["backlog"],
        Entries=[{"Id": str(i), "MessageBody": "{}", "DelaySeconds": 900} for i in range(3)],
    )
    world.sqs.send_message_batch(
        QueueUrl=world.urls["backlog"], Entries=[{"Id": str(i), "MessageBody": "{}"} for i in range(2)]
    )
    # Past the budget while the live set is healthy again: archived, and the drainer is held off.
    report_live_age(world, 1_000)
    first = controller.handler({}, context)
    assert first["archiving"] == [{"queue_url": world.urls["backlog"], "reason": "depth"}]
    assert [call[1]["queue_url"] for call in invocations] == [world.urls["backlog"]]
    assert first["sideline_enabled"] is True  # the live set is healthy ...
    assert mapping_state(mapping) == "Disabled"  # ... but this queue belongs to the archiver

    # The archiver took the visible ones: under budget again, the drainer gets the rest.
    received = world.sqs.receive_message(QueueUrl=world.urls["backlog"], MaxNumberOfMessages=10)
    assert len(received["Messages"]) == 2
    for message in received["Messages"]:
        world.sqs.delete_message(QueueUrl=world.urls["backlog"], ReceiptHandle=message["ReceiptHandle"])
    second = controller.handler({}, context)
    assert second["archiving"] == [] and len(invocations) == 1
    assert mapping_state(mapping) == "Enabled"


def same_shard_tenants() -> tuple[str, str]:
    from breakwater.backlog import shard_of

    names = [f"tenant-{i}" for i in range(200)]
    first = names[0]
    return first, next(name for name in names[1:] if shard_of(name) == shard_of(first))


def test_a_page_left_half_written_is_settled_by_the_next_run(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller dies between its tenants' writes: the ledger keeps its intent, and the next run
    counts exactly the writes that landed, so the sum of the estimates never drifts from the ledger."""
    written, lost = same_shard_tenants()
    for tenant in (written, lost):
        add_tenant(tenant, "standard")
    controller = load(monkeypatch, "controller.handler", environment(world, sideline_mapping(world)))
    context: Any = worker_fixtures.FakeLambdaContext()
    add_counters(world.dynamodb, STATE_TABLE, written, {"accepted": 30})
    add_counters(world.dynamodb, STATE_TABLE, lost, {"accepted": 50})
    enqueue(world, 80)
    state = controller.ports.commit.__self__
    write_tenant = state._write_tenant

    def dying(write: Any, version: int) -> None:
        if write.tenant == lost:
            raise RuntimeError("the invocation timed out here")
        write_tenant(write, version)

    monkeypatch.setattr(state, "_write_tenant", dying)
    first = controller.handler({}, context)
    assert first["shards"]["failed"] and "scaled" in first
    from breakwater.aws.controller_ports import LEDGER_SK, ledger_pk
    from breakwater.backlog import shard_of

    key = ledger_pk(shard_of(written))
    assert "intent" in world.item(key, LEDGER_SK)
    assert "dirty_shard" not in world.item(f"tenant#{written}", "counters")
    assert "dirty_shard" in world.item(f"tenant#{lost}", "counters")

    monkeypatch.setattr(state, "_write_tenant", write_tenant)
    world.dynamodb.update_item(  # the dead invocation's lease runs out
        TableName=STATE_TABLE,
        Key={"pk": {"S": key}, "sk": {"S": LEDGER_SK}},
        UpdateExpression="SET lease_until = :zero",
        ExpressionAttributeValues={":zero": {"N": "0"}},
    )
    second = controller.handler({}, context)
    assert second["backlogs"] == {lost: 50}
    ledger = world.item(key, LEDGER_SK)
    assert "intent" not in ledger and float(ledger["total"]) == pytest.approx(80)
