"""The controller throttles a tenant whose backlog grows, releases it as it drains, and gates the drainers."""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

import boto3
import pytest

from breakwater.aws.counters import add_counters
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


def sideline_mapping(world: WorkerWorld) -> str:
    iam = boto3.client("iam", region_name=REGION)
    role = iam.create_role(RoleName="worker", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.writestr("handler.py", "def handler(event, context):\n    return {}\n")
    functions = boto3.client("lambda", region_name=REGION)
    functions.create_function(
        FunctionName="sideline-worker",
        Runtime="python3.11",
        Role=role,
        Handler="handler.handler",
        Code={"ZipFile": archive.getvalue()},
    )
    mapping = functions.create_event_source_mapping(
        EventSourceArn=world.arn(world.urls["backlog"]), FunctionName="sideline-worker", Enabled=False
    )
    return str(mapping["UUID"])


def environment(world: WorkerWorld, mapping: str) -> dict[str, str]:
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
    }


def multiplier(world: WorkerWorld, tenant: str) -> float:
    return float(world.item(f"tenant#{tenant}", "bucket#ingest").get("multiplier", 1))


def mapping_state(uuid: str) -> str:
    return str(boto3.client("lambda", region_name=REGION).get_event_source_mapping(UUID=uuid)["State"])


def report_live_age(world: WorkerWorld, age_ms: int) -> None:
    world.put(
        {
            "pk": {"S": "queue#live"},
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
    report_live_age(world, 120_000)  # live queues are behind: the drainers must stay off
    first = controller.handler({}, context)
    assert multiplier(world, "noisy") == pytest.approx(100 / 300, abs=1e-3)
    assert multiplier(world, "quiet") == 1.0
    assert first["sideline_enabled"] is False and mapping_state(mapping) == "Disabled"

    add_counters(dynamodb, STATE_TABLE, "noisy", {"accepted": 600})  # backlog 900: push back harder
    controller.handler({}, context)
    assert multiplier(world, "noisy") == pytest.approx(100 / 900, abs=1e-3)

    add_counters(dynamodb, STATE_TABLE, "noisy", {"processed": 950})  # drained: backlog 50
    report_live_age(world, 1_000)  # live queues are healthy again
    last = controller.handler({}, context)
    assert multiplier(world, "noisy") == 1.0
    assert last["sideline_enabled"] is True and mapping_state(mapping) == "Enabled"
    # ingest's own attributes are never touched: the controller SETs only the multiplier
    assert set(world.item("tenant#noisy", "bucket#ingest")) == {"pk", "sk", "multiplier"}
