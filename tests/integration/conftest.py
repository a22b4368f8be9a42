"""moto-backed fixtures: the tables and queues of docs/architecture.md, the handlers, an injected clock.

Handler modules are imported inside fixtures (after the mock starts and the environment is set),
and their module-level service is rebuilt with the test's clock, so nothing depends on wall time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import boto3
import pytest
from moto import mock_aws

from breakwater.aws.front_door import build_authorizer, build_ingest
from breakwater.settings import AuthorizerSettings, IngestSettings
from tests.integration.apigateway import ApiGateway
from tests.integration.handlers import fresh_import

TENANTS_TABLE = "breakwater-tenants"
STATE_TABLE = "breakwater-state"
LIVE_QUEUE_COUNT = 4
SHARD_SIZE = 2
TIERS = {
    "standard": {"rate": 5, "burst": 10, "consumer_rate": 5, "concurrency": 2, "concurrency_floor": 1},
    "premium": {"rate": 50, "burst": 100, "consumer_rate": 50, "concurrency": 8, "concurrency_floor": 2},
}
START = 1_700_000_000.0


@dataclass
class FakeClock:
    """Epoch seconds that move only when a test says so."""

    now: float = START

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def aws() -> Iterator[None]:
    with mock_aws():
        yield


def create_tenants_table(name: str = TENANTS_TABLE) -> str:
    boto3.client("dynamodb").create_table(
        TableName=name,
        AttributeDefinitions=[{"AttributeName": "tenant_id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "tenant_id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return name


def create_table(name: str, *, ttl_attribute: str | None = None) -> str:
    """An on-demand table keyed by the strings ``pk`` and ``sk``; ``ttl_attribute``, if given, is its TTL."""
    client = boto3.client("dynamodb")
    client.create_table(
        TableName=name,
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        BillingMode="PAY_PER_REQUEST",
    )
    if ttl_attribute is not None:
        client.update_time_to_live(
            TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": ttl_attribute}
        )
    return name


def create_state_table(name: str = STATE_TABLE) -> str:
    return create_table(name, ttl_attribute="ttl")


def create_live_queues(count: int = LIVE_QUEUE_COUNT, prefix: str = "breakwater") -> list[str]:
    """``live-0`` … ``live-<N-1>``: SQS standard, each with its own DLQ."""
    sqs = boto3.client("sqs")
    urls = []
    for index in range(count):
        dlq_url = sqs.create_queue(QueueName=f"{prefix}-live-{index}-dlq")["QueueUrl"]
        dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        urls.append(
            sqs.create_queue(
                QueueName=f"{prefix}-live-{index}",
                Attributes={
                    "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 5})
                },
            )["QueueUrl"]
        )
    return urls


@pytest.fixture
def tenants_table(aws: None) -> str:
    return create_tenants_table()


@pytest.fixture
def state_table(aws: None) -> str:
    return create_state_table()


@pytest.fixture
def live_queue_urls(aws: None) -> list[str]:
    return create_live_queues()


@pytest.fixture
def authorizer_env(monkeypatch: pytest.MonkeyPatch, tenants_table: str) -> dict[str, str]:
    env = {
        "TENANTS_TABLE_NAME": tenants_table,
        "TIERS": json.dumps(TIERS),
        "DEFAULT_TIER": "standard",
        "CACHE_SECONDS": "60",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def ingest_env(
    monkeypatch: pytest.MonkeyPatch, state_table: str, live_queue_urls: list[str]
) -> dict[str, str]:
    env = {
        "STATE_TABLE_NAME": state_table,
        "LIVE_QUEUE_URLS": ",".join(live_queue_urls),
        "SHARD_SIZE": str(SHARD_SIZE),
        "FAIR_QUEUES": "true",
        "MAX_PAYLOAD_BYTES": "1024",
        "MAX_TTL_SECONDS": "3600",
        "LEASE_SECONDS": "1.0",
        "LEASE_MAX_FRACTION": "0.5",
        "DEPTH_REFRESH_SECONDS": "5",
        "THROTTLING_ENABLED": "true",
        "TIERS": json.dumps(TIERS),
        "DEFAULT_TIER": "standard",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def load_handler(module_name: str) -> Any:
    """Import (or re-import) a handler so its module-level settings and clients see this mock and env."""
    return fresh_import(module_name)


@pytest.fixture
def authorizer_handler(authorizer_env: dict[str, str], clock: FakeClock) -> Any:
    module = load_handler("authorizer.handler")
    module.AUTHORIZER = build_authorizer(AuthorizerSettings.from_env(), clock)
    return module


@pytest.fixture
def ingest_handler(ingest_env: dict[str, str], clock: FakeClock) -> Any:
    module = load_handler("ingest.handler")
    module.SERVICE = build_ingest(IngestSettings.from_env(), clock)
    return module


@pytest.fixture
def api(authorizer_handler: ModuleType, ingest_handler: ModuleType) -> ApiGateway:
    return ApiGateway(authorizer=authorizer_handler, ingest=ingest_handler)


@pytest.fixture
def tenant_table_adapter(tenants_table: str) -> Any:
    from breakwater.aws.tenants import TenantTable

    return TenantTable(tenants_table)


def receive_all(queue_url: str) -> list[Any]:
    """Every message currently visible on a queue (bodies parsed), with its MessageGroupId."""
    sqs = boto3.client("sqs")
    messages: list[Any] = []
    while True:
        batch = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, MessageSystemAttributeNames=["MessageGroupId"]
        ).get("Messages", [])
        if not batch:
            return messages
        messages.extend(batch)
