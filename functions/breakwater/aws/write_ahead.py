"""The write-ahead table: a conditional put keyed by (message group, deduplication id) before the side effect.

Item: ``pk`` = MessageGroupId, ``sk`` = MessageDeduplicationId; ``state`` (``in_progress`` | ``done``),
``owner`` (the delivery attempt holding the claim), ``lease_expires_at`` (epoch ms), ``completed_at``
(epoch ms) and ``ttl`` (epoch s: how long a finished message is remembered).
The key is per group because the queues deduplicate per group (high-throughput mode), and because
two tenants' ``dedup_key`` values must never collide.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from breakwater.ordered import Claim, WriteAheadRecord, WriteAheadState, judge_existing

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

_CONDITIONAL = "ConditionalCheckFailedException"
# Mirrors breakwater.ordered.judge_existing: claim a new id, or take over an abandoned attempt.
_CLAIMABLE = "attribute_not_exists(pk) OR (#state = :in_progress AND lease_expires_at <= :now)"


class DynamoWriteAheadStore:
    """:class:`breakwater.ordered.WriteAheadStore` on DynamoDB."""

    def __init__(
        self, client: DynamoDBClient, table_name: str, *, lease_seconds: int, retention_seconds: int
    ) -> None:
        self._client = client
        self._table = table_name
        self._lease_ms = lease_seconds * 1000
        self._retention_s = retention_seconds

    def claim(self, group_id: str, dedup_id: str, owner: str, now_ms: int) -> Claim:
        """One conditional put: no record yet, or an in-progress one whose lease ran out (a dead attempt)."""
        try:
            self._client.put_item(
                TableName=self._table,
                Item={
                    "pk": {"S": group_id},
                    "sk": {"S": dedup_id},
                    "state": {"S": WriteAheadState.IN_PROGRESS.value},
                    "owner": {"S": owner},
                    "lease_expires_at": {"N": str(now_ms + self._lease_ms)},
                    "ttl": {"N": str(now_ms // 1000 + self._retention_s)},
                },
                ConditionExpression=_CLAIMABLE,
                ExpressionAttributeNames={"#state": "state"},
                ExpressionAttributeValues={
                    ":in_progress": {"S": WriteAheadState.IN_PROGRESS.value},
                    ":now": {"N": str(now_ms)},
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != _CONDITIONAL:
                raise
            item: dict[str, Any] = exc.response.get("Item", {})  # type: ignore[assignment]
            claim = judge_existing(_record(item), now_ms)
            # The condition refused, so the record exists and is done or leased: never PROCEED here.
            return Claim.BUSY if claim is Claim.PROCEED else claim
        return Claim.PROCEED

    def complete(self, group_id: str, dedup_id: str, owner: str, now_ms: int) -> None:
        """Mark done, only while this attempt holds the claim (never overwrite a taken-over lease)."""
        self._client.update_item(TableName=self._table, **self._completion(group_id, dedup_id, owner, now_ms))

    def complete_with_effects(
        self, group_id: str, dedup_id: str, owner: str, now_ms: int, effects: Sequence[dict[str, Any]]
    ) -> None:
        """:meth:`complete` in one transaction with the side effect's writes (the inbox pattern).

        Refused when another attempt took the claim over (it writes its own effects, or did) or an
        effect's own condition fails: then nothing is written, this attempt's claim is given back
        and the message fails, to be delivered again.
        """
        completion = {
            "Update": {"TableName": self._table, **self._completion(group_id, dedup_id, owner, now_ms)}
        }
        try:
            self._client.transact_write_items(TransactItems=[*effects, completion])  # type: ignore[list-item]
        except ClientError:
            self.release(group_id, dedup_id, owner)
            raise

    def _completion(self, group_id: str, dedup_id: str, owner: str, now_ms: int) -> dict[str, Any]:
        return {
            "Key": {"pk": {"S": group_id}, "sk": {"S": dedup_id}},
            "UpdateExpression": "SET #state = :done, completed_at = :now, #ttl = :ttl",
            "ConditionExpression": "#owner = :owner",
            "ExpressionAttributeNames": {"#state": "state", "#owner": "owner", "#ttl": "ttl"},
            "ExpressionAttributeValues": {
                ":done": {"S": WriteAheadState.DONE.value},
                ":now": {"N": str(now_ms)},
                ":ttl": {"N": str(now_ms // 1000 + self._retention_s)},
                ":owner": {"S": owner},
            },
        }

    def release(self, group_id: str, dedup_id: str, owner: str) -> None:
        """Drop this attempt's claim after a failed side effect, so the redelivery can proceed at once."""
        try:
            self._client.delete_item(
                TableName=self._table,
                Key={"pk": {"S": group_id}, "sk": {"S": dedup_id}},
                ConditionExpression="#owner = :owner AND #state = :in_progress",
                ExpressionAttributeNames={"#owner": "owner", "#state": "state"},
                ExpressionAttributeValues={
                    ":owner": {"S": owner},
                    ":in_progress": {"S": WriteAheadState.IN_PROGRESS.value},
                },
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] != _CONDITIONAL:
                raise

    def read(self, group_id: str, dedup_id: str) -> WriteAheadRecord | None:
        response = self._client.get_item(
            TableName=self._table, Key={"pk": {"S": group_id}, "sk": {"S": dedup_id}}, ConsistentRead=True
        )
        return _record(response.get("Item", {}))


def _record(item: dict[str, Any]) -> WriteAheadRecord | None:
    if not item:
        return None
    return WriteAheadRecord(
        state=WriteAheadState(item["state"]["S"]),
        lease_expires_at=int(item.get("lease_expires_at", {}).get("N", "0")),
    )
