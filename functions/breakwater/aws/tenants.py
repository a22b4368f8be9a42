"""The tenants table (``TENANTS_TABLE_NAME``): read by the authorizer, written by the operator CLI.

Items hold the SHA-256 of the API key, never the key (docs/architecture.md, "Tables").
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from breakwater.auth import (
    LIMIT_NAMES,
    TenantRecord,
    TenantStatus,
    generate_api_key,
    hash_key,
    record_from_item,
    validate_tenant_id,
)
from breakwater.aws import clients

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

_deserializer = TypeDeserializer()
_serializer = TypeSerializer()


class TenantExistsError(RuntimeError):
    pass


class TenantNotFoundError(RuntimeError):
    pass


def _plain(item: Mapping[str, Any]) -> dict[str, Any]:
    return {name: _deserializer.deserialize(value) for name, value in item.items()}


def _number(value: float) -> dict[str, str]:
    return {"N": str(Decimal(str(value)))}


class TenantTable:
    """Reads and writes tenant records with the low-level client (cheaper per call than the resource API)."""

    def __init__(self, table_name: str, *, client: DynamoDBClient | None = None) -> None:
        self.table_name = table_name
        self._client: DynamoDBClient = client or clients.client("dynamodb")

    def get(self, tenant_id: str) -> TenantRecord | None:
        response = self._client.get_item(TableName=self.table_name, Key={"tenant_id": {"S": tenant_id}})
        item = response.get("Item")
        return record_from_item(_plain(item)) if item else None

    def get_item(self, tenant_id: str) -> dict[str, Any] | None:
        response = self._client.get_item(
            TableName=self.table_name, Key={"tenant_id": {"S": tenant_id}}, ConsistentRead=True
        )
        item = response.get("Item")
        return _plain(item) if item else None

    def create(self, tenant_id: str, tier: str, *, now: float | None = None) -> str:
        """Adds an active tenant and returns its new API key (shown once, never stored)."""
        validate_tenant_id(tenant_id)
        key = generate_api_key(tenant_id)
        stamp = int(time.time() if now is None else now)
        try:
            self._client.put_item(
                TableName=self.table_name,
                Item={
                    "tenant_id": {"S": tenant_id},
                    "key_sha256": {"S": hash_key(key)},
                    "tier": {"S": tier},
                    "status": {"S": TenantStatus.ACTIVE.value},
                    "limits": {"M": {}},
                    "created_at": {"N": str(stamp)},
                    "updated_at": {"N": str(stamp)},
                },
                ConditionExpression="attribute_not_exists(tenant_id)",
            )
        except self._client.exceptions.ConditionalCheckFailedException as exc:
            raise TenantExistsError(f"tenant {tenant_id!r} already exists") from exc
        return key

    def rotate(self, tenant_id: str, overlap_seconds: float, *, now: float | None = None) -> str:
        """A new key; the current one stays valid for ``overlap_seconds`` (0 revokes it at once)."""
        current = self.get_item(tenant_id)
        if current is None:
            raise TenantNotFoundError(f"tenant {tenant_id!r} does not exist")
        key = generate_api_key(tenant_id)
        stamp = time.time() if now is None else now
        try:
            self._client.update_item(
                TableName=self.table_name,
                Key={"tenant_id": {"S": tenant_id}},
                UpdateExpression=(
                    "SET key_sha256 = :new, previous_key_sha256 = :old, "
                    "previous_key_valid_until = :until, updated_at = :now"
                ),
                # Guard against a concurrent rotation: the hash we demote must still be the current one.
                ConditionExpression="key_sha256 = :old",
                ExpressionAttributeValues={
                    ":new": {"S": hash_key(key)},
                    ":old": {"S": str(current["key_sha256"])},
                    ":until": {"N": str(int(stamp + overlap_seconds))},
                    ":now": {"N": str(int(stamp))},
                },
            )
        except self._client.exceptions.ConditionalCheckFailedException as exc:
            raise RuntimeError(f"tenant {tenant_id!r} was rotated concurrently; try again") from exc
        return key

    def set_status(self, tenant_id: str, status: TenantStatus, *, now: float | None = None) -> None:
        self._update(tenant_id, "SET #status = :status", {":status": {"S": status.value}}, now=now)

    def set_limits(
        self, tenant_id: str, limits: Mapping[str, float | None], *, now: float | None = None
    ) -> None:
        """Sets (a number) or clears (``None``) per-tenant overrides of the tier's limits."""
        unknown = sorted(set(limits) - set(LIMIT_NAMES))
        if unknown:
            raise ValueError(f"unknown limit(s) {unknown}; allowed: {list(LIMIT_NAMES)}")
        item = self.get_item(tenant_id)
        if item is None:
            raise TenantNotFoundError(f"tenant {tenant_id!r} does not exist")
        merged = {name: value for name, value in (item.get("limits") or {}).items() if name in LIMIT_NAMES}
        for name, value in limits.items():
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = value
        self._update(
            tenant_id,
            "SET limits = :limits",
            {":limits": {"M": {name: _number(float(value)) for name, value in merged.items()}}},
            now=now,
        )

    def scan(self) -> Iterator[dict[str, Any]]:
        paginator = self._client.get_paginator("scan")
        for page in paginator.paginate(TableName=self.table_name):
            for item in page.get("Items", []):
                yield _plain(item)

    def _update(
        self, tenant_id: str, expression: str, values: dict[str, Any], *, now: float | None = None
    ) -> None:
        stamp = int(time.time() if now is None else now)
        names = {"#status": "status"} if "#status" in expression else None
        kwargs: dict[str, Any] = {
            "TableName": self.table_name,
            "Key": {"tenant_id": {"S": tenant_id}},
            "UpdateExpression": f"{expression}, updated_at = :now",
            "ConditionExpression": "attribute_exists(tenant_id)",
            "ExpressionAttributeValues": {**values, ":now": {"N": str(stamp)}},
        }
        if names:
            kwargs["ExpressionAttributeNames"] = names
        try:
            self._client.update_item(**kwargs)
        except self._client.exceptions.ConditionalCheckFailedException as exc:
            raise TenantNotFoundError(f"tenant {tenant_id!r} does not exist") from exc
