"""The embedded AWS with limits: its moto processes (DynamoDB apart) enforce them from the
environment the runtime gives them, and report what they refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import botocore.config
import pytest
from botocore.exceptions import ClientError

from local.aws_limits import AwsLimits
from local.emulator.embedded_aws import EmbeddedAws

# A partition's 1,000 WCU/s divided by 10,000: after one write, an item waits ten seconds for the
# next, so two writes in a row are one too many however slow the machine.
SCALE = 10_000


@pytest.fixture(scope="module")
def limited() -> Iterator[EmbeddedAws]:
    embedded = EmbeddedAws(limits=AwsLimits(scale=SCALE)).start()
    yield embedded
    embedded.stop()


def ddb(aws: EmbeddedAws, endpoint: str) -> Any:
    """A client that tries once (botocore retries a throttle) at ``endpoint``."""
    return aws._session.client(  # the embedded AWS's own fake credentials
        "dynamodb", endpoint_url=endpoint, config=botocore.config.Config(retries={"total_max_attempts": 1})
    )


def test_the_dynamodb_process_throttles_a_hot_item_and_reports_it(limited: EmbeddedAws) -> None:
    client = ddb(limited, limited.endpoint_for("dynamodb"))
    client.create_table(
        TableName="Stack-TablesState-X",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    item = {"pk": {"S": "pool#concurrency"}, "sk": {"S": "burst"}}
    client.put_item(TableName="Stack-TablesState-X", Item=item)
    # the DynamoDB process, and the main one that forwards a tool's DynamoDB requests to it
    for each in (client, ddb(limited, limited.endpoint)):
        with pytest.raises(ClientError) as caught:
            each.put_item(TableName="Stack-TablesState-X", Item=item)
        assert caught.value.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    report = limited.limits_report()
    assert report["scale"] == SCALE
    assert report["dynamodb_throttles"] == {"burst_pool": 2}
    assert report["hottest_items"][0]["item"] == "Stack-TablesState-X/pool#concurrency/burst"


def test_sqs_limits_hold_in_the_main_process(limited: EmbeddedAws) -> None:
    sqs = limited.client("sqs")
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    entries = [{"Id": str(i), "ReceiptHandle": f"h{i}", "VisibilityTimeout": 0} for i in range(11)]
    with pytest.raises(ClientError) as caught:
        sqs.change_message_visibility_batch(QueueUrl=url, Entries=entries)
    assert caught.value.response["Error"]["Code"] == "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
    assert limited.limits_report()["refused"]["TooManyEntriesInBatchRequest"] == 1
