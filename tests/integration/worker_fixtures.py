"""moto fixtures for the worker, controller and redrive: the tables and queues of docs/architecture.md.

``WorkerWorld`` creates everything inside one ``mock_aws``, imports the handler modules after the
mock started and the environment is set, and plays the SQS event source mapping the simple faithful
way: receive real messages, build the Lambda event from them, call the handler, delete what
succeeded and (when asked) make the failures visible again as if their visibility timeout ran out.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import boto3
import pytest
from moto import mock_aws

from breakwater.envelope import Envelope, Origin, new_envelope_id
from tests.integration.handlers import load_handler

REGION = "us-east-1"
STATE_TABLE = "bw-state"
TENANTS_TABLE = "bw-tenants"
IDEMPOTENCY_TABLE = "bw-idempotency"
TIERS = {
    "standard": {"rate": 50, "burst": 100, "consumer_rate": 1000, "concurrency": 4, "concurrency_floor": 1},
    "tiny": {"rate": 1, "burst": 1, "consumer_rate": 0.001, "concurrency": 1, "concurrency_floor": 1},
    "slow": {"rate": 50, "burst": 100, "consumer_rate": 3, "concurrency": 4, "concurrency_floor": 1},
}
QUEUE_ROLES = ("live-0", "surge", "spillover", "backlog")
MAX_RECEIVE_COUNT = 2  # every queue's redrive policy, and the workers' MAX_RECEIVE_COUNT


@dataclass
class FakeLambdaContext:
    remaining_ms: int = 60_000
    function_name: str = "breakwater-worker"
    memory_limit_in_mb: int = 1024
    invoked_function_arn: str = f"arn:aws:lambda:{REGION}:123456789012:function:breakwater-worker"
    aws_request_id: str = "11111111-2222-3333-4444-555555555555"

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def now_ms() -> int:
    return int(time.time() * 1000)


def floor_slot(holder: str, expires_at_ms: int) -> dict[str, Any]:
    """A floor lease as a lease item's map holds it (under its slot's key, ``#<k>``), low-level."""
    return {"M": {"exp": {"N": str(expires_at_ms)}, "h": {"S": holder}}}


def lease_holders(leases: dict[str, Any]) -> set[str]:
    """The holders in a map of leases as read: a floor slot's, a burst lease's key."""
    return {str(value["h"]) if key.startswith("#") else key for key, value in leases.items()}


def make_envelope(tenant: str = "acme", *, age_ms: int = 0, **fields: Any) -> Envelope:
    stamp = now_ms()
    values: dict[str, Any] = {
        "id": new_envelope_id(stamp),
        "tenant": tenant,
        "type": "test",
        "payload": {},
        "request_id": "req-1",
        "trace_id": "trace-1",
        "enqueued_at": stamp - age_ms,
    }
    values.update(fields)
    return Envelope.model_validate(values)


@dataclass
class WorkerWorld:
    sqs: Any
    dynamodb: Any
    urls: dict[str, str] = field(default_factory=dict)
    dlqs: dict[str, str] = field(default_factory=dict)

    def arn(self, url: str) -> str:
        return str(
            self.sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        )

    def environment(self, mode: str = "live", **overrides: Any) -> dict[str, str]:
        env = {
            "WORKER_MODE": mode,
            "TIERS": json.dumps(TIERS),
            "DEFAULT_TIER": "standard",
            "STATE_TABLE_NAME": STATE_TABLE,
            "TENANTS_TABLE_NAME": TENANTS_TABLE,
            "IDEMPOTENCY_TABLE_NAME": IDEMPOTENCY_TABLE,
            "SPILLOVER_QUEUE_URL": self.urls["spillover"],
            "BACKLOG_QUEUE_URL": self.urls["backlog"],
            "SURGE_QUEUE_URL": self.urls["surge"],
            "SIDELINE_AGE_SECONDS": "300",
            "MAX_DEFER_SECONDS": "900",
            "DEFER_BASE_SECONDS": "2",
            "HEARTBEAT_SECONDS": "30",
            "VISIBILITY_TIMEOUT_SECONDS": "60",
            "LEASE_SECONDS": "1",
            "LEASE_MAX_FRACTION": "0.25",
            "PROCESSOR_HANDLER": "processor.sample.process",  # the example app's processor
            "SIDELINING_ENABLED": "true",
            "MAX_RECEIVE_COUNT": str(MAX_RECEIVE_COUNT),
        }
        env.update({name.upper(): str(value) for name, value in overrides.items()})
        return env

    def send(self, role: str, envelope: Envelope) -> None:
        self.sqs.send_message(QueueUrl=self.urls[role], MessageBody=envelope.to_json())

    def receive(self, url: str, count: int = 10, visibility: int | None = None) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {
            "QueueUrl": url,
            "MaxNumberOfMessages": count,
            "MessageSystemAttributeNames": ["All"],
            "MessageAttributeNames": ["All"],
            "WaitTimeSeconds": 0,
        }
        if visibility is not None:
            kwargs["VisibilityTimeout"] = visibility
        return list(self.sqs.receive_message(**kwargs).get("Messages", []))

    def event(self, url: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The Lambda SQS event for really received messages."""
        arn = self.arn(url)
        return {
            "Records": [
                {
                    "messageId": m["MessageId"],
                    "receiptHandle": m["ReceiptHandle"],
                    "body": m["Body"],
                    "attributes": {
                        "ApproximateReceiveCount": m["Attributes"]["ApproximateReceiveCount"],
                        "SentTimestamp": m["Attributes"]["SentTimestamp"],
                        "SenderId": m["Attributes"].get("SenderId", "AIDA"),
                        "ApproximateFirstReceiveTimestamp": m["Attributes"][
                            "ApproximateFirstReceiveTimestamp"
                        ],
                    },
                    "messageAttributes": {
                        name: {
                            "stringValue": value.get("StringValue"),
                            "stringListValues": [],
                            "binaryListValues": [],
                            "dataType": value["DataType"],
                        }
                        for name, value in (m.get("MessageAttributes") or {}).items()
                    },
                    "md5OfBody": m["MD5OfBody"],
                    "eventSource": "aws:sqs",
                    "eventSourceARN": arn,
                    "awsRegion": REGION,
                }
                for m in messages
            ]
        }

    def deliver(
        self,
        handler: ModuleType,
        role: str,
        *,
        context: FakeLambdaContext | None = None,
        requeue_failures: bool = False,
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """One mapping poll: receive, invoke, delete the successes; returns (response, received messages)."""
        url = self.urls[role]
        messages = self.receive(url)
        if not messages:
            return {"batchItemFailures": []}, []
        response = handler.handler(self.event(url, messages), context or FakeLambdaContext())
        failed = {item["itemIdentifier"] for item in response["batchItemFailures"]}
        for message in messages:
            if message["MessageId"] not in failed:
                self.sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
            elif requeue_failures:
                self.sqs.change_message_visibility(
                    QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
                )
        return response, messages

    def bodies(self, role: str) -> list[Envelope]:
        """Every message in the queue, delayed and in-flight ones included (read from moto's backend)."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.sqs.models import sqs_backends

        queue = sqs_backends[DEFAULT_ACCOUNT_ID][REGION].queues[self.urls[role].rsplit("/", 1)[-1]]
        return [Envelope.from_json(message.body) for message in queue._messages]

    def depth(self, role: str, *, dlq: bool = False) -> dict[str, int]:
        url = self.dlqs[role] if dlq else self.urls[role]
        attributes = self.sqs.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ],
        )["Attributes"]
        return {
            name.removeprefix("ApproximateNumberOfMessages") or "Visible": int(v)
            for name, v in attributes.items()
        }

    def item(self, pk: str, sk: str) -> dict[str, Any]:
        from breakwater.aws.counters import plain

        response = self.dynamodb.get_item(TableName=STATE_TABLE, Key={"pk": {"S": pk}, "sk": {"S": sk}})
        return plain(response.get("Item") or {})

    def put(self, item: dict[str, Any]) -> None:
        self.dynamodb.put_item(TableName=STATE_TABLE, Item=item)


def _create_tables(dynamodb: Any) -> None:
    dynamodb.create_table(
        TableName=STATE_TABLE,
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.create_table(
        TableName=TENANTS_TABLE,
        AttributeDefinitions=[{"AttributeName": "tenant_id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "tenant_id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    dynamodb.create_table(
        TableName=IDEMPOTENCY_TABLE,
        AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkerWorld]:
    with mock_aws():
        sqs = boto3.client("sqs", region_name=REGION)
        dynamodb = boto3.client("dynamodb", region_name=REGION)
        _create_tables(dynamodb)
        w = WorkerWorld(sqs=sqs, dynamodb=dynamodb)
        for role in QUEUE_ROLES:
            dlq = sqs.create_queue(QueueName=f"bw-{role}-dlq")["QueueUrl"]
            w.dlqs[role] = dlq
            w.urls[role] = sqs.create_queue(
                QueueName=f"bw-{role}",
                Attributes={
                    "VisibilityTimeout": "60",
                    "RedrivePolicy": json.dumps(
                        {"deadLetterTargetArn": w.arn(dlq), "maxReceiveCount": str(MAX_RECEIVE_COUNT)}
                    ),
                },
            )["QueueUrl"]
        yield w


load = load_handler  # the name the worker tests import


def add_tenant(tenant: str, tier: str) -> None:
    from breakwater.aws.tenants import TenantTable

    TenantTable(TENANTS_TABLE, client=boto3.client("dynamodb", region_name=REGION)).create(tenant, tier)


__all__ = ["Origin", "WorkerWorld", "add_tenant", "load", "make_envelope", "now_ms", "world"]
