"""SQS fair queues on the embedded AWS, against AWS's documentation ("How Amazon SQS fair queues work").

Through boto3 on moto with the ``sqs.fair_queues`` patch: a noisy group (over 10% of the in-flight
messages with at least 30, or over 10% of recent processing time) does not delay a quiet group's
messages; it is quiet again once its backlog is consumed or after 5 minutes without a send; messages
without a group are their own tenants; the five fair-queue metrics; and without the patch, moto's own
order (what the patch changes). The model's clock is injected; visibility timeouts are long enough
that nothing expires on moto's clock while a test runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import pytest
from moto import mock_aws

from local.emulator import moto_patches
from local.emulator.moto_patches import sqs_fair
from local.fair_queues import (
    NOISY_IDLE_S,
    NOISY_MIN_IN_FLIGHT,
    NOISY_REFRESH_S,
    PROCESSING_WINDOW_S,
    RecentProcessingTime,
    noisy_groups,
    receive_order,
)
from tests.local.helpers import patch_names, queue_gauges

FAIR = "sqs.fair_queues"
WITH_METRICS = (*patch_names("sqs"), "sqs.cloudwatch_metrics")
WITHOUT_FAIR = tuple(name for name in WITH_METRICS if name != FAIR)
HELD = 300  # visibility timeout (s): what is received stays in flight for the whole test
NOISY_IN_FLIGHT = NOISY_MIN_IN_FLIGHT + 10


class Clock:
    """The fair-queue model's clock: moves only when the test says."""

    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@contextmanager
def embedded_sqs(*, fair: bool = True) -> Iterator[tuple[Any, Clock]]:
    clock = Clock()
    names = WITH_METRICS if fair else WITHOUT_FAIR
    with (
        mock_aws(),
        moto_patches.removed(names={FAIR}),
        moto_patches.installed(names=names),
        sqs_fair.clock(clock),
    ):
        yield boto3.client("sqs", region_name="us-east-1"), clock


def create(sqs: Any, name: str = "shared") -> str:
    return str(sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": str(HELD)})["QueueUrl"])


def send(sqs: Any, url: str, group: str | None, count: int, **kwargs: Any) -> None:
    for n in range(count):
        body = f"{group or 'none'}-{n}"
        if group is None:
            sqs.send_message(QueueUrl=url, MessageBody=body, **kwargs)
        else:
            sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=group, **kwargs)


def receive(sqs: Any, url: str, count: int = 10) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    while len(got) < count:
        batch = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=min(10, count - len(got)))
        if not batch.get("Messages"):
            break
        got.extend(batch["Messages"])
    return got


def groups(messages: list[dict[str, Any]]) -> list[str]:
    return [m["Body"].rsplit("-", 1)[0] for m in messages]


def delete(sqs: Any, url: str, messages: list[dict[str, Any]]) -> None:
    for message in messages:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


def make_noisy(sqs: Any, url: str, clock: Clock, group: str = "a", backlog: int = 20) -> list[dict[str, Any]]:
    """``group`` holds NOISY_IN_FLIGHT in flight (all of the queue's) and ``backlog`` visible: noisy."""
    send(sqs, url, group, NOISY_IN_FLIGHT)
    in_flight = receive(sqs, url, NOISY_IN_FLIGHT)
    assert len(in_flight) == NOISY_IN_FLIGHT
    send(sqs, url, group, backlog)
    return in_flight


def first_batch_behind_a_noisy_group(*, fair: bool) -> list[str]:
    with embedded_sqs(fair=fair) as (sqs, clock):
        url = create(sqs)
        make_noisy(sqs, url, clock)
        send(sqs, url, "b", 5)  # a quiet tenant, behind the noisy one's backlog
        clock.advance(NOISY_REFRESH_S)
        return groups(receive(sqs, url))


def test_a_noisy_group_does_not_delay_a_quiet_groups_messages() -> None:
    assert first_batch_behind_a_noisy_group(fair=True) == ["b"] * 5 + ["a"] * 5


def test_without_the_patch_moto_serves_the_oldest_first_and_the_quiet_group_waits() -> None:
    assert first_batch_behind_a_noisy_group(fair=False) == ["a"] * 10


def test_a_group_under_thirty_in_flight_is_not_noisy_by_its_share() -> None:
    with embedded_sqs() as (sqs, clock):
        url = create(sqs)
        send(sqs, url, "a", NOISY_MIN_IN_FLIGHT - 1)
        receive(sqs, url, NOISY_MIN_IN_FLIGHT - 1)  # all of the in-flight messages, but fewer than 30
        send(sqs, url, "a", 3)
        send(sqs, url, "b", 3)
        clock.advance(NOISY_REFRESH_S)
        assert groups(receive(sqs, url, 6)) == ["a"] * 3 + ["b"] * 3


def test_a_noisy_group_is_quiet_again_once_its_backlog_is_consumed() -> None:
    with embedded_sqs() as (sqs, clock):
        url = create(sqs)
        make_noisy(sqs, url, clock, backlog=20)
        clock.advance(NOISY_REFRESH_S)
        send(sqs, url, "b", 1)
        assert groups(receive(sqs, url, 21)) == ["b"] + ["a"] * 20  # noisy: behind b, then its backlog
        clock.advance(NOISY_REFRESH_S)
        assert queue_metrics("shared")["ApproximateNumberOfNoisyGroups"] == 0  # consumed: quiet again
        send(sqs, url, "a", 3)
        send(sqs, url, "b", 3)
        assert groups(receive(sqs, url, 6)) == ["a"] * 3 + ["b"] * 3  # no longer put behind b
        # Still holding far over 10% of the in-flight messages: detected again at the next evaluation.
        send(sqs, url, "a", 3)
        send(sqs, url, "b", 3)
        clock.advance(NOISY_REFRESH_S)
        assert groups(receive(sqs, url, 6)) == ["b"] * 3 + ["a"] * 3


def test_a_noisy_group_that_sent_nothing_for_five_minutes_is_quiet_again() -> None:
    with embedded_sqs() as (sqs, clock):
        url = create(sqs)
        make_noisy(sqs, url, clock, backlog=20)  # still holds its in-flight share throughout
        clock.advance(NOISY_REFRESH_S)
        send(sqs, url, "b", 2)
        assert groups(receive(sqs, url, 2)) == ["b", "b"]
        clock.advance(NOISY_IDLE_S)
        send(sqs, url, "b", 2)
        assert groups(receive(sqs, url, 4)) == ["a"] * 4  # its backlog, oldest first, ahead of b's


def test_a_group_over_ten_percent_of_recent_processing_time_is_noisy_with_few_in_flight() -> None:
    with embedded_sqs() as (sqs, clock):
        url = create(sqs)
        send(sqs, url, "slow", 1)
        slow = receive(sqs, url, 1)
        clock.advance(10.0)  # one message, ten seconds of a consumer: all the recent processing time
        delete(sqs, url, slow)
        send(sqs, url, "slow", 3)
        send(sqs, url, "b", 3)
        clock.advance(NOISY_REFRESH_S)
        assert groups(receive(sqs, url, 6)) == ["b"] * 3 + ["slow"] * 3


def test_of_several_noisy_groups_the_one_with_fewest_in_flight_goes_first() -> None:
    with embedded_sqs() as (sqs, clock):
        url = create(sqs)
        send(sqs, url, "many", NOISY_IN_FLIGHT + 5)
        send(sqs, url, "fewer", NOISY_IN_FLIGHT)
        receive(sqs, url, 2 * NOISY_IN_FLIGHT + 5)
        send(sqs, url, "many", 4)
        send(sqs, url, "fewer", 4)
        clock.advance(NOISY_REFRESH_S)
        assert groups(receive(sqs, url, 8)) == ["fewer"] * 4 + ["many"] * 4  # both noisy, no quiet message


def test_messages_without_a_group_are_their_own_tenants_and_never_put_behind() -> None:
    with embedded_sqs() as (sqs, clock):
        url = create(sqs)
        send(sqs, url, None, NOISY_IN_FLIGHT)
        receive(sqs, url, NOISY_IN_FLIGHT)  # many in flight, but each its own tenant: none is noisy
        make_noisy(sqs, url, clock, backlog=5)
        send(sqs, url, None, 3)
        clock.advance(NOISY_REFRESH_S)
        # "a" holds NOISY_IN_FLIGHT of twice that in flight (over 10%): noisy; the group-less go first
        assert groups(receive(sqs, url, 8)) == ["none"] * 3 + ["a"] * 5


def test_a_fifo_queue_keeps_its_order() -> None:
    with embedded_sqs() as (sqs, _clock):
        url = sqs.create_queue(
            QueueName="ordered.fifo",
            Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true", "VisibilityTimeout": "300"},
        )["QueueUrl"]
        for n in range(3):
            sqs.send_message(QueueUrl=url, MessageBody=f"a-{n}", MessageGroupId="a")
        assert groups(receive(sqs, url, 1)) == ["a"]
        assert not sqs_fair.uses_fair_queues(_queue("ordered.fifo"))


def _queue(name: str) -> Any:
    """moto's own queue object (to set up a state no API reaches, or to look at the patch's)."""
    from moto.sqs.models import sqs_backends

    return sqs_backends["123456789012"]["us-east-1"].queues[name]


FAIR_METRICS = (
    "ApproximateNumberOfNoisyGroups",
    "ApproximateNumberOfMessagesVisibleInQuietGroups",
    "ApproximateNumberOfMessagesNotVisibleInQuietGroups",
    "ApproximateNumberOfMessagesDelayedInQuietGroups",
    "ApproximateAgeOfOldestMessageInQuietGroups",
    "ApproximateAgeOfOldestMessage",
)


def queue_metrics(queue_name: str) -> dict[str, float]:
    """The queue's AWS/SQS gauges in the embedded CloudWatch, one GetMetricData as the alarms read them."""
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    values = queue_gauges(cloudwatch, queue_name, FAIR_METRICS)
    return {name: found[0] for name, found in values.items() if found}


def test_the_fair_queue_metrics_count_the_quiet_groups_only() -> None:
    with embedded_sqs() as (sqs, clock):
        url = create(sqs)
        plain = create(sqs, "no-groups")
        send(sqs, plain, None, 2)
        make_noisy(sqs, url, clock, backlog=20)  # "a": 40 in flight, 20 visible
        send(sqs, url, "b", 4)
        clock.advance(NOISY_REFRESH_S)
        assert groups(receive(sqs, url, 1)) == ["b"]  # b: 1 in flight, 3 visible
        send(sqs, url, "c", 2, DelaySeconds=600)  # c: 2 delayed
        send(sqs, url, None, 1)  # a group-less message: quiet

        for message in _queue("shared")._messages:  # the noisy group's messages sent long ago
            if message.group_id == "a":
                message.sent_timestamp -= 10 * HELD * 1000

        metrics = queue_metrics("shared")
        assert metrics["ApproximateNumberOfNoisyGroups"] == 1
        assert metrics["ApproximateNumberOfMessagesVisibleInQuietGroups"] == 3 + 1
        assert metrics["ApproximateNumberOfMessagesNotVisibleInQuietGroups"] == 1
        assert metrics["ApproximateNumberOfMessagesDelayedInQuietGroups"] == 2
        # the noisy group's messages (the oldest) are left out of the quiet groups' age
        assert metrics["ApproximateAgeOfOldestMessage"] >= 10 * HELD
        assert 0 <= metrics["ApproximateAgeOfOldestMessageInQuietGroups"] < HELD  # the noisy group's left out

        # no grouped message was ever sent to it: no fair-queue metric (AWS: "when you use fair queues")
        assert set(queue_metrics("no-groups")) == {"ApproximateAgeOfOldestMessage"}


def test_once_drained_the_noisy_groups_in_flight_messages_count_as_quiet() -> None:
    with embedded_sqs() as (sqs, clock):
        url = create(sqs)
        make_noisy(sqs, url, clock, backlog=5)
        clock.advance(NOISY_REFRESH_S)
        metrics = queue_metrics("shared")
        assert metrics["ApproximateNumberOfNoisyGroups"] == 1
        assert metrics["ApproximateNumberOfMessagesNotVisibleInQuietGroups"] == 0
        receive(sqs, url, 5)
        clock.advance(NOISY_REFRESH_S)
        metrics = queue_metrics("shared")
        assert metrics["ApproximateNumberOfNoisyGroups"] == 0
        assert metrics["ApproximateNumberOfMessagesNotVisibleInQuietGroups"] == NOISY_IN_FLIGHT + 5


# -- the shared model, without moto ----------------------------------------------------------------------


def test_the_rule_needs_both_the_share_and_thirty_in_flight_and_a_backlog_and_a_recent_send() -> None:
    def decide(in_flight: int, total: int, *, backlog: int = 1, idle_s: float = 0.0) -> set[str]:
        return noisy_groups(
            100.0 + idle_s,
            in_flight={"a": in_flight},
            total_in_flight=total,
            processing_s={},
            total_processing_s=0.0,
            previously_noisy=(),
            backlog=lambda _g: backlog,
            last_sent=lambda _g: 100.0,
        )

    assert decide(30, 299) == {"a"}
    assert decide(30, 300) == set()  # exactly 10%: not more than
    assert decide(29, 29) == set()
    assert decide(30, 30, backlog=0) == set()
    assert decide(30, 30, idle_s=NOISY_IDLE_S) == set()


def test_a_noisy_group_stays_noisy_until_drained_or_idle_whatever_its_shares() -> None:
    kept = noisy_groups(
        0.0,
        in_flight={},
        total_in_flight=0,
        processing_s={},
        total_processing_s=0.0,
        previously_noisy={"a"},
        backlog=lambda _g: 1,
        last_sent=lambda _g: 0.0,
    )
    assert kept == {"a"}


def test_the_order_puts_noisy_groups_last_the_fewest_in_flight_first() -> None:
    messages = [("a", 1), ("b", 1), (None, 1), ("c", 1), ("a", 2), ("c", 2), ("b", 2)]
    ordered = list(receive_order(messages, lambda m: m[0], {"a", "c"}, {"a": 50, "c": 40}))
    assert ordered == [("b", 1), (None, 1), ("b", 2), ("c", 1), ("c", 2), ("a", 1), ("a", 2)]


def test_recent_processing_time_halves_in_a_window_times_ln2() -> None:
    recent = RecentProcessingTime()
    recent.add("a", 10.0, now=0.0)
    recent.add(None, 10.0, now=0.0)
    by_group, total = recent.shares(now=PROCESSING_WINDOW_S * 0.6931471805599453)
    assert by_group["a"] == pytest.approx(5.0)
    assert total == pytest.approx(10.0)
    with pytest.raises(ValueError, match="negative"):
        recent.add("a", -1.0, now=1.0)
