"""DynamoDB's limits in the embedded AWS, against AWS's documented behaviour: a hot item is throttled
with the on-demand hot-key answer and recovers when its rate falls; batches return what was throttled;
a transaction holds its items; sizes as AWS counts them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import boto3
import botocore.config
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from local.aws_limits import AwsLimits
from local.emulator.moto_patches.dynamodb_limits import CONFLICT_MESSAGE, THROTTLED_MESSAGE
from local.emulator.moto_patches.limits import Enforcement, limits_enforced

SCALE = 100  # a partition's 1,000 WCU/s become 10, its 3,000 RCU/s 30
TABLE = "state"


class Clock:
    """Seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Hold:
    """A transaction's hold that lasts until the test releases it (no wall-clock sleeps)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, _seconds: float) -> None:
        self.entered.set()
        assert self.release.wait(10)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def enforced(clock: Clock) -> Iterator[Enforcement]:
    with (
        mock_aws(),
        limits_enforced(AwsLimits(scale=SCALE), clock=clock, sleep=lambda _s: None) as enforcement,
    ):
        yield enforcement


def client() -> Any:
    return boto3.client(
        "dynamodb",
        region_name="us-east-1",
        config=botocore.config.Config(retries={"total_max_attempts": 1}),  # botocore would retry a throttle
    )


@pytest.fixture
def ddb(enforced: Enforcement) -> Any:
    dynamodb = client()
    dynamodb.create_table(
        TableName=TABLE,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    return dynamodb


def key(pk: str, sk: str = "counters") -> dict[str, Any]:
    return {"pk": {"S": pk}, "sk": {"S": sk}}


def add(ddb: Any, pk: str, sk: str = "counters") -> None:
    ddb.update_item(
        TableName=TABLE,
        Key=key(pk, sk),
        UpdateExpression="ADD n :one",
        ExpressionAttributeValues={":one": {"N": "1"}},
    )


def error_of(call: Any) -> dict[str, Any]:
    with pytest.raises(ClientError) as caught:
        call()
    return dict(caught.value.response)


def test_a_hot_item_is_throttled_as_an_on_demand_table_throttles_a_hot_key(
    ddb: Any, clock: Clock, enforced: Enforcement
) -> None:
    for _ in range(10):  # one second's budget of one-unit writes
        add(ddb, "tenant#hot")
    response = error_of(lambda: add(ddb, "tenant#hot"))
    assert response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    assert response["Error"]["Message"] == THROTTLED_MESSAGE
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 400
    table_arn = ddb.describe_table(TableName=TABLE)["Table"]["TableArn"]
    assert response["ThrottlingReasons"] == [
        {"reason": "TableWriteKeyRangeThroughputExceeded", "resource": table_arn}
    ]
    add(ddb, "tenant#cold")  # another item has its own budget
    # at half the limit the item is served again, every time
    for _ in range(20):
        clock.now += 0.2
        add(ddb, "tenant#hot")
    assert ddb.get_item(TableName=TABLE, Key=key("tenant#hot"), ConsistentRead=True)["Item"]["n"] == {
        "N": "30"
    }
    report = enforced.report()
    assert report["dynamodb_throttles"] == {"counters": 1}
    assert report["hottest_items"][0]["item"] == f"{TABLE}/tenant#hot/counters"
    # the second's budget and the refill within the same whole second
    assert report["hottest_items"][0]["peak_wcu_per_s"] == 14


def test_units_are_billed_units_large_items_cost_more_and_eventual_reads_half(ddb: Any) -> None:
    big = {**key("tenant#big"), "blob": {"S": "x" * 3000}}  # 3 KB: three write units
    for _ in range(3):
        ddb.put_item(TableName=TABLE, Item=big)
    assert error_of(lambda: ddb.put_item(TableName=TABLE, Item=big))["Error"]["Code"] == (
        "ProvisionedThroughputExceededException"
    )
    ddb.put_item(TableName=TABLE, Item={**key("tenant#read"), "blob": {"S": "x" * 3000}})
    # the put took 3 of 10 WCU/s, leaving 21 of 30 RCU; an eventually consistent read of a 3 KB item
    # is half a unit, a strongly consistent one a whole unit
    for _ in range(41):
        ddb.get_item(TableName=TABLE, Key=key("tenant#read"))
    response = error_of(lambda: ddb.get_item(TableName=TABLE, Key=key("tenant#read"), ConsistentRead=True))
    assert response["ThrottlingReasons"][0]["reason"] == "TableReadKeyRangeThroughputExceeded"


def test_a_failed_condition_still_consumes_and_a_throttled_call_takes_nothing(ddb: Any, clock: Clock) -> None:
    for _ in range(10):
        code = error_of(
            lambda: ddb.put_item(
                TableName=TABLE, Item=key("tenant#c"), ConditionExpression="attribute_exists(pk)"
            )
        )["Error"]["Code"]
        assert code == "ConditionalCheckFailedException"
    for _ in range(5):  # refused, taking nothing
        assert (
            error_of(lambda: add(ddb, "tenant#c"))["Error"]["Code"]
            == "ProvisionedThroughputExceededException"
        )
    clock.now += 0.1  # a tenth of a second refills one unit: enough, as the refusals took none
    add(ddb, "tenant#c")


def test_batch_write_returns_throttled_entries_unprocessed_and_refuses_only_when_none_passes(
    ddb: Any, clock: Clock
) -> None:
    for _ in range(10):
        add(ddb, "tenant#hot")
    entries = [{"PutRequest": {"Item": key("tenant#hot")}}, {"PutRequest": {"Item": key("tenant#other")}}]
    answer = ddb.batch_write_item(RequestItems={TABLE: entries})
    assert answer["UnprocessedItems"] == {TABLE: [entries[0]]}
    assert "Item" in ddb.get_item(TableName=TABLE, Key=key("tenant#other"))
    response = error_of(lambda: ddb.batch_write_item(RequestItems={TABLE: entries[:1]}))
    assert response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    clock.now += 1
    assert ddb.batch_write_item(RequestItems={TABLE: entries[:1]})["UnprocessedItems"] == {}


def test_batch_get_returns_throttled_keys_unprocessed(ddb: Any, clock: Clock) -> None:
    add(ddb, "tenant#other")
    for _ in range(10):  # the second's budget, reads and writes together
        add(ddb, "tenant#hot")
    answer = ddb.batch_get_item(RequestItems={TABLE: {"Keys": [key("tenant#hot"), key("tenant#other")]}})
    assert [item["pk"]["S"] for item in answer["Responses"][TABLE]] == ["tenant#other"]
    assert answer["UnprocessedKeys"][TABLE]["Keys"] == [key("tenant#hot")]
    response = error_of(lambda: ddb.batch_get_item(RequestItems={TABLE: {"Keys": [key("tenant#hot")]}}))
    assert response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    clock.now += 1
    assert ddb.batch_get_item(RequestItems={TABLE: {"Keys": [key("tenant#hot")]}})["UnprocessedKeys"] == {}


def test_transactions_cost_twice_and_a_throttled_entry_cancels_with_throttling_error(ddb: Any) -> None:
    update = {
        "Update": {
            "TableName": TABLE,
            "Key": key("tenant#tx"),
            "UpdateExpression": "ADD n :one",
            "ExpressionAttributeValues": {":one": {"N": "1"}},
        }
    }
    other = {"Put": {"TableName": TABLE, "Item": key("tenant#other")}}
    for _ in range(5):  # two units each
        ddb.transact_write_items(TransactItems=[update])
    response = error_of(lambda: ddb.transact_write_items(TransactItems=[other, update]))
    assert response["Error"]["Code"] == "TransactionCanceledException"
    assert [reason["Code"] for reason in response["CancellationReasons"]] == ["None", "ThrottlingError"]
    assert response["CancellationReasons"][1]["Message"] == THROTTLED_MESSAGE
    assert "Item" not in ddb.get_item(TableName=TABLE, Key=key("tenant#other"))  # all or nothing


def test_query_on_an_index_is_metered_on_the_index_partition(enforced: Enforcement, clock: Clock) -> None:
    ddb = client()
    ddb.create_table(
        TableName=TABLE,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
            {"AttributeName": "dirty_shard", "AttributeType": "S"},
        ],
        GlobalSecondaryIndexes=[
            {
                "IndexName": "dirty",
                "KeySchema": [
                    {"AttributeName": "dirty_shard", "KeyType": "HASH"},
                    {"AttributeName": "pk", "KeyType": "RANGE"},
                ],
                "Projection": {"ProjectionType": "KEYS_ONLY"},
            }
        ],
        BillingMode="PAY_PER_REQUEST",
    )
    ddb.put_item(TableName=TABLE, Item={**key("tenant#a"), "dirty_shard": {"S": "3"}})

    def query() -> Any:
        return ddb.query(
            TableName=TABLE,
            IndexName="dirty",
            KeyConditionExpression="dirty_shard = :shard",
            ExpressionAttributeValues={":shard": {"S": "3"}},
        )

    served = 0
    response: dict[str, Any] = {}
    while served < 100:
        try:
            query()
        except ClientError as error:
            response = dict(error.response)
            break
        served += 1
    # the put wrote the index partition (1 WCU, a tenth of its second): 27 RCU left, 0.5 a query
    assert 53 <= served <= 54
    assert response["ThrottlingReasons"][0]["reason"] == "IndexReadKeyRangeThroughputExceeded"
    assert response["ThrottlingReasons"][0]["resource"].endswith("/index/dirty")
    assert enforced.report()["dynamodb_throttles"] == {"dirty_shard": 1}
    clock.now += 1
    assert query()["Count"] == 1


def test_items_up_to_400_kb_are_accepted_and_larger_refused(ddb: Any) -> None:
    ddb.put_item(TableName=TABLE, Item={**key("tenant#size"), "v": {"S": "x" * (399 * 1024)}})
    response = error_of(
        lambda: ddb.put_item(TableName=TABLE, Item={**key("tenant#size2"), "v": {"S": "x" * (401 * 1024)}})
    )
    assert (response["Error"]["Code"], response["Error"]["Message"]) == (
        "ValidationException",
        "Item size has exceeded the maximum allowed size",
    )


def test_a_transaction_over_4_mb_or_100_items_is_refused(ddb: Any, enforced: Enforcement) -> None:
    entries = [
        {"Put": {"TableName": TABLE, "Item": {**key(f"tenant#{i}"), "v": {"S": "x" * (390 * 1024)}}}}
        for i in range(11)
    ]
    response = error_of(lambda: ddb.transact_write_items(TransactItems=entries))
    assert response["Error"]["Code"] == "ValidationException"
    assert "4 MB" in response["Error"]["Message"]
    many = [{"Put": {"TableName": TABLE, "Item": key(f"tenant#{i}")}} for i in range(101)]
    response = error_of(lambda: ddb.transact_write_items(TransactItems=many))
    assert response["Error"]["Code"] == "ValidationException"
    assert "less than or equal to 100" in response["Error"]["Message"]


def test_a_transaction_holds_its_items_for_its_duration(clock: Clock) -> None:
    hold = Hold()
    with mock_aws(), limits_enforced(AwsLimits(), clock=clock, sleep=hold) as enforcement:
        ddb = client()
        ddb.create_table(
            TableName=TABLE,
            KeySchema=[
                {"AttributeName": "pk", "KeyType": "HASH"},
                {"AttributeName": "sk", "KeyType": "RANGE"},
            ],
            AttributeDefinitions=[
                {"AttributeName": "pk", "AttributeType": "S"},
                {"AttributeName": "sk", "AttributeType": "S"},
            ],
            BillingMode="PAY_PER_REQUEST",
        )
        held = {"Put": {"TableName": TABLE, "Item": key("pool#concurrency", "burst")}}
        done: list[Any] = []
        first = threading.Thread(target=lambda: done.append(ddb.transact_write_items(TransactItems=[held])))
        first.start()
        assert hold.entered.wait(10)
        # a plain write of the held item conflicts
        response = error_of(lambda: add(ddb, "pool#concurrency", "burst"))
        assert (response["Error"]["Code"], response["Error"]["Message"]) == (
            "TransactionConflictException",
            CONFLICT_MESSAGE,
        )
        # another transaction touching it is cancelled, with the reason in that entry's place
        free = {"Put": {"TableName": TABLE, "Item": key("tenant#free")}}
        response = error_of(lambda: ddb.transact_write_items(TransactItems=[free, held]))
        assert response["Error"]["Code"] == "TransactionCanceledException"
        assert response["Error"]["Message"] == (
            "Transaction cancelled, please refer cancellation reasons for specific reasons "
            "[None, TransactionConflict]"
        )
        assert response["CancellationReasons"] == [
            {"Code": "None"},
            {"Code": "TransactionConflict", "Message": CONFLICT_MESSAGE},
        ]
        add(ddb, "tenant#free")  # other items are served meanwhile
        hold.release.set()
        first.join(10)
        assert done, "the transaction returned after its hold"
        add(ddb, "pool#concurrency", "burst")  # the hold ended: served again
        assert enforcement.report()["transaction_conflicts"] == {"burst_pool": 2}


def test_a_stored_item_is_sized_as_its_wire_form(ddb: Any) -> None:
    from moto.dynamodb.models import dynamodb_backends
    from moto.dynamodb.models.dynamo_type import DynamoType

    from local.emulator.moto_patches.dynamodb_metering import stored_item_size
    from local.pricing.usage import item_size

    item = {
        **key("tenant#sized"),
        "leases": {"M": {"h1": {"M": {"exp": {"N": "1700000000123"}, "burst": {"BOOL": True}}}}},
        "names": {"L": [{"S": "é"}, {"N": "-12.50"}, {"NULL": True}]},
        "tags": {"SS": ["a", "bc"]},
        "blob": {"B": b"\x00\x01\x02"},
    }
    ddb.put_item(TableName=TABLE, Item=item)
    table = dynamodb_backends["123456789012"]["us-east-1"].get_table(TABLE)
    stored = table.get_item(DynamoType({"S": "tenant#sized"}), DynamoType({"S": "counters"}))
    assert stored_item_size(stored) == item_size(
        ddb.get_item(TableName=TABLE, Key=key("tenant#sized"))["Item"]
    )
