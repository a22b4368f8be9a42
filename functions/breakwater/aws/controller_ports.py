"""The controller's real ports: tenants and state tables, queues, sideline mappings, the archiver."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config

from breakwater.archive_budget import ArchiveDue, SidelineObservation
from breakwater.auth import effective_limits, record_from_item
from breakwater.aws.counters import COUNTERS_SK, batch_get, plain, set_bookmark, tenant_pk
from breakwater.aws.health import queue_depth, read_oldest_age, waiting_messages
from breakwater.aws.mappings import set_mappings_enabled
from breakwater.aws.tenants import TenantTable
from breakwater.controller import ControllerPorts, TenantSnapshot
from breakwater.settings import ControllerSettings

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_lambda import LambdaClient
    from mypy_boto3_sqs import SQSClient

INGEST_BUCKET_SK = "bucket#ingest"


def set_multiplier(client: DynamoDBClient, table_name: str, tenant: str, multiplier: float) -> None:
    """SET only ``multiplier`` on the tenant's ingest bucket; ingest owns every other attribute."""
    client.update_item(
        TableName=table_name,
        Key={"pk": {"S": tenant_pk(tenant)}, "sk": {"S": INGEST_BUCKET_SK}},
        UpdateExpression="SET multiplier = :m",
        ExpressionAttributeValues={":m": {"N": str(Decimal(str(multiplier)))}},
    )


def sideline_observations(
    ddb: DynamoDBClient, sqs: SQSClient, settings: ControllerSettings
) -> list[SidelineObservation]:
    """Each sideline queue's depth and, when its role is known, the oldest age its workers reported."""
    roles = dict(zip(settings.sideline_queue_urls, settings.sideline_queue_roles, strict=False))
    observations = []
    for url in settings.sideline_queue_urls:
        role = roles.get(url)
        age_ms, observed_at = (
            read_oldest_age(ddb, settings.state_table_name, role) if role is not None else (None, None)
        )
        depth = waiting_messages(sqs, url)
        observations.append(SidelineObservation(role or url, url, depth, age_ms, observed_at))
    return observations


def start_archiver(client: LambdaClient, function_name: str, due: ArchiveDue) -> None:
    """Invoke the archiver asynchronously (InvocationType=Event) for one queue: the run outlives ours."""
    client.invoke(
        FunctionName=function_name,
        InvocationType="Event",
        Payload=json.dumps({"queue_url": due.queue_url, "reason": due.reason.value}).encode(),
    )


def _archiver_starter(client: LambdaClient, function_name: str | None) -> Callable[[ArchiveDue], None] | None:
    if function_name is None:
        return None
    return lambda due: start_archiver(client, function_name, due)


def _tenant_ids_from_counters(client: DynamoDBClient, table_name: str) -> list[str]:
    """Without a tenants table: every tenant that has counters (a filtered scan; small tables only)."""
    tenants = []
    paginator = client.get_paginator("scan")
    for page in paginator.paginate(
        TableName=table_name,
        FilterExpression="sk = :sk",
        ExpressionAttributeValues={":sk": {"S": COUNTERS_SK}},
        ProjectionExpression="pk",
    ):
        for item in page.get("Items", []):
            tenants.append(str(plain(item)["pk"]).removeprefix("tenant#"))
    return sorted(tenants)


def build_controller_ports(
    settings: ControllerSettings,
    *,
    dynamodb: DynamoDBClient | None = None,
    sqs: SQSClient | None = None,
    lambda_client: LambdaClient | None = None,
) -> ControllerPorts:
    config = Config(retries={"mode": "standard", "max_attempts": 3})
    ddb: DynamoDBClient = dynamodb or boto3.client("dynamodb", config=config)
    queues: SQSClient = sqs or boto3.client("sqs", config=config)
    functions: LambdaClient = lambda_client or boto3.client("lambda", config=config)
    table = settings.state_table_name

    def snapshots() -> Sequence[TenantSnapshot]:
        limits = {}
        if settings.tenants_table_name:
            for item in TenantTable(settings.tenants_table_name, client=ddb).scan():
                record = record_from_item(item)
                if record.status.value == "active":
                    limits[record.tenant_id] = effective_limits(settings, record)
        else:
            limits = {tenant: settings.limits_for(None) for tenant in _tenant_ids_from_counters(ddb, table)}
        keys = [(tenant_pk(t), sk) for t in limits for sk in (COUNTERS_SK, INGEST_BUCKET_SK)]
        items = batch_get(ddb, table, keys)
        result = []
        for tenant, tier in sorted(limits.items()):
            bucket = items.get((tenant_pk(tenant), INGEST_BUCKET_SK), {})
            result.append(
                TenantSnapshot(
                    tenant=tenant,
                    limits=tier,
                    counters=items.get((tenant_pk(tenant), COUNTERS_SK), {}),
                    multiplier=float(bucket.get("multiplier", 1)),
                )
            )
        return result

    def bookmark(tenant: str, seen: Mapping[str, float]) -> None:
        set_bookmark(ddb, table, tenant, seen)

    return ControllerPorts(
        snapshots=snapshots,
        set_multiplier=lambda tenant, value: set_multiplier(ddb, table, tenant, value),
        set_bookmark=bookmark,
        live_depth=lambda: queue_depth(queues, settings.live_queue_urls),
        live_oldest=lambda: read_oldest_age(ddb, table, "live"),
        set_sideline_enabled=lambda enabled, held: set_mappings_enabled(
            functions, settings.sideline_mapping_uuids, enabled, held
        ),
        sideline_observations=lambda: sideline_observations(ddb, queues, settings),
        start_archiver=_archiver_starter(functions, settings.archiver_function_name),
    )
