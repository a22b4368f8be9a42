"""The idempotency keys' claims (``breakwater.request_keys``) in the idempotency table.

One item per ``(tenant, key)``, its ``id`` a hash of both under its own prefix (the processing
records' prefix is ``breakwater.process``), expiring by the table's TTL attribute at the end of the
key's window. Every write is conditional, so two containers racing for one key agree on one claim.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from breakwater.aws.counters import condition_held
from breakwater.errors import UnavailableError
from breakwater.request_keys import Claim, ClaimState

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

KEY_PREFIX = "breakwater.request"
ID, EXPIRY = "id", "expiration"  # Powertools' attribute names: the table's key and TTL attribute


def claim_id(tenant: str, key: str) -> str:
    digest = hashlib.sha256(json.dumps([tenant, key]).encode()).hexdigest()
    return f"{KEY_PREFIX}#{digest}"


def _failed_condition(exc: ClientError) -> bool:
    return exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException"


def _claim_of(item: dict[str, Any]) -> Claim:
    return Claim(
        message_id=item["message_id"]["S"],
        fingerprint=item["fingerprint"]["S"],
        state=ClaimState(item["state"]["S"]),
        pending_until_ms=int(item["pending_until"]["N"]),
        queue=int(item["queue"]["N"]) if "queue" in item else None,
    )


class DynamoClaimStore:
    def __init__(self, client: DynamoDBClient, table_name: str) -> None:
        self.client = client
        self.table = table_name

    def claim(self, tenant: str, key: str, claim: Claim, expires_at_s: int, now_s: int) -> Claim | None:
        try:
            return self._claim(tenant, key, claim, expires_at_s, now_s)
        except (ClientError, BotoCoreError) as exc:  # before anything is sent: the client retries the key
            raise UnavailableError(f"the message was not stored, please retry: {exc}") from exc

    def _claim(self, tenant: str, key: str, claim: Claim, expires_at_s: int, now_s: int) -> Claim | None:
        item_id = claim_id(tenant, key)
        try:
            self.client.put_item(
                TableName=self.table,
                Item={
                    ID: {"S": item_id},
                    EXPIRY: {"N": str(expires_at_s)},
                    "tenant": {"S": tenant},
                    "key": {"S": key},
                    "message_id": {"S": claim.message_id},
                    "fingerprint": {"S": claim.fingerprint},
                    "state": {"S": claim.state.value},
                    "pending_until": {"N": str(claim.pending_until_ms)},
                },
                # A claim past its window counts as gone, whether or not TTL has deleted it yet.
                ConditionExpression="attribute_not_exists(#id) OR #exp < :now",
                ExpressionAttributeNames={"#id": ID, "#exp": EXPIRY},
                ExpressionAttributeValues={":now": {"N": str(now_s)}},
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if not _failed_condition(exc):
                raise
            # The item that failed the condition, where DynamoDB returns it; else read it.
            item: Any = dict(exc.response).get("Item")
            if not item:
                item = self.client.get_item(
                    TableName=self.table, Key={ID: {"S": item_id}}, ConsistentRead=True
                ).get("Item")
            if not item:  # deleted between the two calls (released): claim it again
                return self._claim(tenant, key, claim, expires_at_s, now_s)
            return _claim_of(dict(item))
        return None

    def take_over(self, tenant: str, key: str, stale: Claim, pending_until_ms: int) -> bool:
        try:
            return condition_held(
                lambda: self.client.update_item(
                    TableName=self.table,
                    Key={ID: {"S": claim_id(tenant, key)}},
                    UpdateExpression="SET pending_until = :until",
                    ConditionExpression="#state = :pending AND message_id = :id AND pending_until = :stale",
                    ExpressionAttributeNames={"#state": "state"},
                    ExpressionAttributeValues={
                        ":until": {"N": str(pending_until_ms)},
                        ":pending": {"S": ClaimState.PENDING.value},
                        ":id": {"S": stale.message_id},
                        ":stale": {"N": str(stale.pending_until_ms)},
                    },
                )
            )
        except (ClientError, BotoCoreError) as exc:
            raise UnavailableError(f"the message was not stored, please retry: {exc}") from exc

    def accepted(self, tenant: str, key: str, message_id: str, queue: int) -> None:
        condition_held(
            lambda: self.client.update_item(
                TableName=self.table,
                Key={ID: {"S": claim_id(tenant, key)}},
                UpdateExpression="SET #state = :accepted, queue = :queue",
                ConditionExpression="message_id = :id",
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues={
                    ":accepted": {"S": ClaimState.ACCEPTED.value},
                    ":queue": {"N": str(queue)},
                    ":id": {"S": message_id},
                },
            )
        )

    def held(self, tenant: str, key: str, now_s: int) -> Claim | None:
        item = self.client.get_item(
            TableName=self.table, Key={ID: {"S": claim_id(tenant, key)}}, ConsistentRead=True
        ).get("Item")
        if not item or int(item[EXPIRY]["N"]) < now_s:  # past its window: gone, whether or not TTL ran
            return None
        return _claim_of(dict(item))

    def release(self, tenant: str, key: str, message_id: str) -> None:
        condition_held(
            lambda: self.client.delete_item(
                TableName=self.table,
                Key={ID: {"S": claim_id(tenant, key)}},
                ConditionExpression="message_id = :id AND #state = :pending",
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues={
                    ":id": {"S": message_id},
                    ":pending": {"S": ClaimState.PENDING.value},
                },
            )
        )
