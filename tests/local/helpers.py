"""Helpers of the emulator's tests: polling for a condition, and moto with a patch against moto without."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

from moto import mock_aws

from local.emulator import moto_patches
from tests.polling import wait_for as wait_for  # the emulator's tests import it from here

COUNTS = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesDelayed",
    "ApproximateNumberOfMessagesNotVisible",
)


def patch_names(service: str) -> tuple[str, ...]:
    """The names of the patches of ``service`` (``sqs``, ``dynamodb``, ...), in their declared order."""
    return tuple(patch.name for patch in moto_patches.declared() if patch.name.startswith(f"{service}."))


def queue_counts(sqs: Any, url: str) -> tuple[int, int, int]:
    """(visible, delayed, in flight) of the queue at ``url``."""
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=list(COUNTS))["Attributes"]
    return tuple(int(attrs[name]) for name in COUNTS)  # type: ignore[return-value]


def create_ranged_table(dynamodb: Any, name: str, *, sort_key_type: str) -> None:
    """An on-demand table keyed by a string ``pk`` and an ``sk`` of ``sort_key_type``."""
    dynamodb.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": sort_key_type},
        ],
        BillingMode="PAY_PER_REQUEST",
    )


def answers_kept(name: str, session: Callable[[], list[Any]]) -> list[Any]:
    """``session`` on moto without the patch ``name``, then with it twice (the second from its caches):
    all three must give the same answers, which are returned. The patch is left as it was found."""
    with moto_patches.removed(names={name}), mock_aws():
        unpatched = session()
    with moto_patches.installed(names={name}):
        with mock_aws():
            patched = session()
        with mock_aws():
            again = session()
    assert patched == unpatched
    assert again == unpatched
    return unpatched


def queue_gauges(cloudwatch: Any, queue: str, names: Sequence[str]) -> dict[str, list[float]]:
    """The queue's AWS/SQS gauges ``names`` in the embedded CloudWatch (each its values, newest first),
    in one GetMetricData as the local alarms read them."""
    now = datetime.datetime.now(datetime.UTC)
    answer = cloudwatch.get_metric_data(
        MetricDataQueries=[
            {
                "Id": f"m{i}",
                "MetricStat": {
                    "Metric": {
                        "Namespace": "AWS/SQS",
                        "MetricName": name,
                        "Dimensions": [{"Name": "QueueName", "Value": queue}],
                    },
                    "Period": 60,
                    "Stat": "Maximum",
                },
            }
            for i, name in enumerate(names)
        ],
        StartTime=now - datetime.timedelta(seconds=60),
        EndTime=now + datetime.timedelta(seconds=60),
    )
    return {names[int(r["Id"][1:])]: r["Values"] for r in answer["MetricDataResults"]}
