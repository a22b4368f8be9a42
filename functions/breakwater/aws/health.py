"""Queue health: the oldest age workers observed per queue role (``queue#<role>``/``health``) and depths.

SQS has no age-of-oldest-message attribute through its API, so every worker batch reports the oldest
age it saw. The write is conditional: it replaces the stored value only when it is larger or the
stored one is older than the window, so the item holds the maximum observed in the last window
across all containers; a container skips the reports that would add nothing (``breakwater.age_reports``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from breakwater.age_reports import ThrottledAgeReports
from breakwater.aws.counters import condition_held, plain

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.literals import QueueAttributeFilterType

HEALTH_SK = "health"
WINDOW_MS = 60_000


def queue_pk(role: str) -> str:
    return f"queue#{role}"


def record_oldest_age(
    client: DynamoDBClient, table_name: str, role: str, oldest_age_ms: int, now_ms: int
) -> bool:
    """Raise the window's maximum to ``oldest_age_ms`` (or open a window); False if a larger one stands."""
    return condition_held(
        lambda: client.update_item(
            TableName=table_name,
            Key={"pk": {"S": queue_pk(role)}, "sk": {"S": HEALTH_SK}},
            UpdateExpression="SET oldest_age_ms = :age, observed_at = :now",
            ConditionExpression=(
                "attribute_not_exists(oldest_age_ms) OR observed_at < :window OR oldest_age_ms <= :age"
            ),
            ExpressionAttributeValues={
                ":age": {"N": str(oldest_age_ms)},
                ":now": {"N": str(now_ms)},
                ":window": {"N": str(now_ms - WINDOW_MS)},
            },
        )
    )


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


def throttled_age_reports(client: DynamoDBClient, table_name: str) -> ThrottledAgeReports:
    """A container's age reports: :func:`record_oldest_age` when ``breakwater.age_reports`` says so."""
    return ThrottledAgeReports(
        lambda role, age_ms, now_ms: record_oldest_age(client, table_name, role, age_ms, now_ms)
    )


def read_oldest_age(client: DynamoDBClient, table_name: str, role: str) -> tuple[int | None, int | None]:
    """(oldest_age_ms, observed_at epoch ms) of the role, or (None, None) if never reported."""
    response = client.get_item(
        TableName=table_name, Key={"pk": {"S": queue_pk(role)}, "sk": {"S": HEALTH_SK}}, ConsistentRead=True
    )
    item = plain(response.get("Item") or {})
    if "oldest_age_ms" not in item:
        return None, None
    return int(item["oldest_age_ms"]), int(item["observed_at"])


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
