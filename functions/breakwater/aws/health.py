"""Queue health: the oldest age workers observed per queue role (``queue#<role>``/``health``) and depths.

SQS has no age-of-oldest-message attribute through its API, so every worker batch reports the oldest
age it saw. The write is conditional: it replaces the stored value only when it is larger or the
stored one is older than the window, so the item holds the maximum observed in the last window
across its containers; a container skips the reports that would add nothing (``breakwater.age_reports``).

Every container of the fleet writes there, so one item per role would be one partition's write limit
at a few thousand containers. The reports are spread over ``shards`` items instead
(``queue#<role>``/``health#<n>``, ``n`` fixed per container by its holder id); with one shard the
item keeps its original key ``health``. The controller reads every shard of a role in one
BatchGetItem and takes the largest age still in its window (:func:`read_oldest_age`).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from breakwater.age_reports import WINDOW_MS, LastReport, ThrottledAgeReports, resume_offset_ms
from breakwater.aws.counters import batch_get, condition_held, plain

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.literals import QueueAttributeFilterType

HEALTH_SK = "health"
MAX_HEALTH_SHARDS = 100  # every shard of a role in one BatchGetItem


def queue_pk(role: str) -> str:
    return f"queue#{role}"


def _checked_shards(shards: int) -> int:
    if not 1 <= shards <= MAX_HEALTH_SHARDS:
        raise ValueError(f"health report shards must be 1..{MAX_HEALTH_SHARDS}, got {shards}")
    return shards


def health_shard(holder: str, shards: int) -> int:
    """The shard a container writes: stable across processes (not Python's salted ``hash``)."""
    return zlib.crc32(holder.encode()) % _checked_shards(shards)


def health_sk(shard: int, shards: int) -> str:
    """The sort key of a role's health shard; a single shard keeps the original key."""
    if _checked_shards(shards) == 1:
        return HEALTH_SK
    if not 0 <= shard < shards:
        raise ValueError(f"health shard {shard} is not in 0..{shards - 1}")
    return f"{HEALTH_SK}#{shard}"


def raise_oldest_age(
    client: DynamoDBClient,
    table_name: str,
    role: str,
    oldest_age_ms: int,
    now_ms: int,
    *,
    sk: str = HEALTH_SK,
) -> LastReport:
    """Raise the window's maximum to ``oldest_age_ms`` (or open a window) on the role's health item
    ``sk``; the report the item stands on after it: this one if written, else the larger one within
    its window (returned by the failed write at no extra cost)."""
    try:
        client.update_item(
            TableName=table_name,
            Key={"pk": {"S": queue_pk(role)}, "sk": {"S": sk}},
            UpdateExpression="SET oldest_age_ms = :age, observed_at = :now",
            ConditionExpression=(
                "attribute_not_exists(oldest_age_ms) OR observed_at < :window OR oldest_age_ms <= :age"
            ),
            ExpressionAttributeValues={
                ":age": {"N": str(oldest_age_ms)},
                ":now": {"N": str(now_ms)},
                ":window": {"N": str(now_ms - WINDOW_MS)},
            },
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
            raise
        stood = plain(exc.response.get("Item") or {})  # type: ignore[arg-type]
        return LastReport(int(stood.get("oldest_age_ms", 0)), int(stood.get("observed_at", 0)))
    return LastReport(oldest_age_ms, now_ms)


DEPENDENCY_PK = "dependency"


def record_dependency_down(client: DynamoDBClient, table_name: str, until_ms: int) -> bool:
    """Raise the time until which a worker's breaker holds the processor's dependency for down.

    Conditional, so the item keeps the latest end any container reported; False if a later one stands.
    """
    return condition_held(
        lambda: client.update_item(
            TableName=table_name,
            Key={"pk": {"S": DEPENDENCY_PK}, "sk": {"S": HEALTH_SK}},
            UpdateExpression="SET down_until = :until",
            ConditionExpression="attribute_not_exists(down_until) OR down_until < :until",
            ExpressionAttributeValues={":until": {"N": str(until_ms)}},
        )
    )


def read_dependency_down_until(client: DynamoDBClient, table_name: str) -> int | None:
    """Until when (epoch ms) the workers last reported the dependency down; None if they never did."""
    response = client.get_item(
        TableName=table_name, Key={"pk": {"S": DEPENDENCY_PK}, "sk": {"S": HEALTH_SK}}, ConsistentRead=True
    )
    item = plain(response.get("Item") or {})
    return int(item["down_until"]) if "down_until" in item else None


def throttled_age_reports(
    client: DynamoDBClient, table_name: str, *, holder: str = "", shards: int = 1
) -> ThrottledAgeReports:
    """A container's age reports: :func:`raise_oldest_age` on its own shard (of ``shards``, chosen
    by ``holder``, the container's id) when ``breakwater.age_reports`` says so."""
    sk = health_sk(health_shard(holder, shards), shards)
    return ThrottledAgeReports(
        lambda role, age_ms, now_ms: raise_oldest_age(client, table_name, role, age_ms, now_ms, sk=sk),
        offset_ms=resume_offset_ms(holder),
    )


def oldest_in_window(
    reports: Iterable[Mapping[str, object]], now_ms: int | None
) -> tuple[int | None, int | None]:
    """The largest ``oldest_age_ms`` of the shards' reports observed within the window before
    ``now_ms``, with its ``observed_at``; none in the window: the newest report, which the caller
    judges stale; no report: (None, None). ``now_ms`` None: the newest report's time stands for now.

    A shard no container writes any more keeps its last age for good: outside the window it no
    longer counts, as it would no longer stop a write to its item.
    """
    seen = [
        (int(str(item["oldest_age_ms"])), int(str(item["observed_at"])))
        for item in reports
        if "oldest_age_ms" in item and "observed_at" in item
    ]
    if not seen:
        return None, None
    newest = max(at for _, at in seen)
    start = (newest if now_ms is None else now_ms) - WINDOW_MS
    in_window = [(age, at) for age, at in seen if at >= start]
    if not in_window:
        return next((age, at) for age, at in seen if at == newest)
    return max(in_window)


def read_oldest_age(
    client: DynamoDBClient, table_name: str, role: str, *, shards: int = 1, now_ms: int | None = None
) -> tuple[int | None, int | None]:
    """(oldest_age_ms, observed_at epoch ms) of the role over its ``shards`` health items (one
    BatchGetItem, strongly consistent), as :func:`oldest_in_window` picks it; (None, None) if never
    reported."""
    keys = [(queue_pk(role), health_sk(shard, shards)) for shard in range(_checked_shards(shards))]
    items = batch_get(client, table_name, keys, consistent=True)
    return oldest_in_window(items.values(), now_ms)


def _attribute_total(client: SQSClient, queue_url: str, names: Sequence[QueueAttributeFilterType]) -> int:
    """The sum of the queue's numeric attributes ``names`` (one GetQueueAttributes)."""
    attributes = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
    return sum(int(value) for value in attributes.values())


def queue_depth(client: SQSClient, queue_urls: Iterable[str]) -> int:
    """Visible plus in-flight messages over the queues (GetQueueAttributes, one call per queue)."""
    names: list[QueueAttributeFilterType] = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
    ]
    return sum(_attribute_total(client, url, names) for url in queue_urls)


def observed_depth(client: SQSClient, queue_urls: Iterable[str]) -> int:
    """Every message the queues hold: visible, in flight and delayed (what the estimates must add up to)."""
    names: list[QueueAttributeFilterType] = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    return sum(_attribute_total(client, url, names) for url in queue_urls)


def waiting_messages(client: SQSClient, queue_url: str) -> int:
    """Visible plus delayed: what waits to be worked (in-flight messages are being worked or archived).

    Delayed ones (a sideline drainer's deferrals) count: they are backlog too. The archiver waits for
    them to come due (``ArchiverSettings.wait_for_delayed_seconds``) rather than leave them behind.
    """
    return _attribute_total(
        client, queue_url, ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesDelayed"]
    )
