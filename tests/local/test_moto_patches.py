"""The SQS hot-path patch keeps moto's answers: one scripted session gives the same results patched or not.

And moto's DynamoDB under ThreadedMotoServer, serialized, loses nothing to concurrent transactions."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import botocore.config
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.server import ThreadedMotoServer

from local.emulator import moto_patches

COUNTS = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesDelayed",
    "ApproximateNumberOfMessagesNotVisible",
)
VOLATILE = {"CreatedTimestamp", "LastModifiedTimestamp", "QueueArn", "Policy", "RedrivePolicy"}


@pytest.fixture
def restore_patches() -> Iterator[None]:
    was_applied = moto_patches.is_applied()
    yield
    (moto_patches.apply if was_applied else moto_patches.revert)()


def counts(sqs: Any, url: str) -> tuple[int, int, int]:
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=list(COUNTS))["Attributes"]
    return tuple(int(attrs[name]) for name in COUNTS)  # type: ignore[return-value]


def session() -> dict[str, Any]:
    """Sends, receives, deletes, visibility expiry, delays, a DLQ and FIFO dedup; what was observed."""
    seen: dict[str, Any] = {}
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        dlq = sqs.create_queue(QueueName="q-dlq")["QueueUrl"]
        dlq_attrs = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"]
        dlq_arn = dlq_attrs["QueueArn"]
        url = sqs.create_queue(
            QueueName="q",
            Attributes={
                "VisibilityTimeout": "1",
                "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 2}),
                "KmsMasterKeyId": "alias/aws/sqs",
            },
        )["QueueUrl"]
        fifo = sqs.create_queue(
            QueueName="f.fifo", Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
        )["QueueUrl"]

        for n in range(4):
            sqs.send_message(QueueUrl=url, MessageBody=f"m{n}")
        sqs.send_message(QueueUrl=url, MessageBody="late", DelaySeconds=1)
        seen["after_send"] = counts(sqs, url)

        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=3)["Messages"]
        seen["received"] = sorted(m["Body"] for m in got)
        seen["after_receive"] = counts(sqs, url)
        sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])
        sqs.delete_message(QueueUrl=url, ReceiptHandle=got[0]["ReceiptHandle"])  # again: still succeeds
        seen["after_delete"] = counts(sqs, url)
        try:
            sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-handle")
            seen["bad_handle"] = "accepted"
        except ClientError as exc:
            seen["bad_handle"] = exc.response["Error"]["Code"]

        time.sleep(1.2)  # the two undeleted receipts time out and the delayed message arrives
        seen["after_expiry"] = counts(sqs, url)
        again = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
        seen["redelivered"] = sorted(m["Body"] for m in again)
        stale = next(m for m in got[1:] if m["Body"] in seen["redelivered"])["ReceiptHandle"]
        sqs.delete_message(QueueUrl=url, ReceiptHandle=stale)  # an earlier handle of a redelivered message
        seen["after_stale_delete"] = counts(sqs, url)

        time.sleep(1.2)
        third = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        # The other twice-received message went to the DLQ (maxReceiveCount 2); the others come back.
        seen["third_receive"] = sorted(m["Body"] for m in third)
        seen["dlq"] = counts(sqs, dlq)
        stale_body = next(m["Body"] for m in got if m["ReceiptHandle"] == stale)
        moved = next(m for m in again if m["Body"] in {g["Body"] for g in got[1:]} - {stale_body})
        try:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=moved["ReceiptHandle"])
            seen["moved_delete"] = "accepted"
        except ClientError as exc:
            seen["moved_delete"] = exc.response["Error"]["Code"]
        seen["after_dlq"] = counts(sqs, url)

        sqs.send_message(QueueUrl=fifo, MessageBody="same", MessageGroupId="g")
        sqs.send_message(QueueUrl=fifo, MessageBody="same", MessageGroupId="g")
        seen["fifo_dedup"] = counts(sqs, fifo)

        attrs = {}
        for name, queue_url in (("q", url), ("dlq", dlq), ("fifo", fifo)):
            every = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])["Attributes"]
            attrs[name] = {k: v for k, v in every.items() if k not in VOLATILE}
            attrs[name]["keys"] = sorted(every)
        seen["attributes"] = attrs
        redrive = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])["Attributes"]
        seen["redrive"] = json.loads(redrive["RedrivePolicy"])["maxReceiveCount"]
    return seen


@pytest.mark.slow
def test_patched_session_matches_unpatched(restore_patches: None) -> None:
    moto_patches.revert()
    unpatched = session()
    moto_patches.apply()
    patched = session()
    assert patched == unpatched
    # And the answers are the right ones, not merely the same ones.
    assert patched["after_send"] == (4, 1, 0)
    assert patched["after_receive"] == (1, 1, 3)
    assert patched["after_delete"] == (1, 1, 2)
    assert patched["bad_handle"] == "ReceiptHandleIsInvalid"
    assert patched["after_expiry"] == (4, 0, 0)
    assert len(patched["redelivered"]) == 4
    assert patched["after_stale_delete"] == (0, 0, 3)
    assert patched["third_receive"] == ["late", "m3"]
    assert patched["dlq"] == (1, 0, 0)
    assert patched["moved_delete"] == "ReceiptHandleIsInvalid"
    assert patched["after_dlq"] == (0, 0, 2)
    assert patched["fifo_dedup"] == (1, 0, 0)
    assert patched["redrive"] == 2
    assert "KmsMasterKeyId" in patched["attributes"]["q"]["keys"]
    assert patched["attributes"]["fifo"]["ContentBasedDeduplication"] == "true"


def test_attributes_are_a_mapping_with_mottos_keys(restore_patches: None) -> None:
    moto_patches.apply()
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        sqs.create_queue(QueueName="plain")
        from moto.sqs.models import sqs_backends

        queue = sqs_backends["123456789012"]["us-east-1"].queues["plain"]
        attributes = queue.attributes
        assert list(attributes) == queue.BASE_ATTRIBUTES
        assert attributes["SqsManagedSseEnabled"] == "true"
        assert attributes.get("FifoQueue") is None  # not a FIFO queue: the key is absent, as before
        # Re-creating with identical attributes is still idempotent (moto compares the mappings).
        sqs.create_queue(QueueName="plain", Attributes={"VisibilityTimeout": "30"})
        with pytest.raises(ClientError):
            sqs.create_queue(QueueName="plain", Attributes={"VisibilityTimeout": "31"})


def test_inline_delivery_is_disabled(restore_patches: None) -> None:
    """moto would invoke the function inside SendMessage; the local runtime polls instead."""
    moto_patches.apply()
    moto_patches.disable_inline_event_source_delivery()
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        lam = boto3.client("lambda", region_name="us-east-1")
        iam = boto3.client("iam", region_name="us-east-1")
        role = iam.create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        url = sqs.create_queue(QueueName="src")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        empty_zip = b"PK\x05\x06" + b"\0" * 18
        lam.create_function(
            FunctionName="f", Runtime="python3.12", Role=role, Handler="h.h", Code={"ZipFile": empty_zip}
        )
        mapping = lam.create_event_source_mapping(EventSourceArn=arn, FunctionName="f", BatchSize=5)
        sqs.send_message(QueueUrl=url, MessageBody="stays")
        assert counts(sqs, url) == (1, 0, 0)
        assert lam.get_event_source_mapping(UUID=mapping["UUID"])["BatchSize"] == 5


DYNAMODB_THREADS = 8
DYNAMODB_ROUNDS = 40


@pytest.fixture
def dynamodb_server() -> Iterator[str]:
    was_applied = "dynamodb_lock" in moto_patches._applied
    backups_applied = "transaction_backups" in moto_patches._applied
    moto_patches.serialize_dynamodb_writes()
    moto_patches.back_up_transaction_items()  # as the runtime's moto process runs it
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()
    if not was_applied:
        moto_patches.unserialize_dynamodb_writes()
    if not backups_applied:
        moto_patches.restore_transaction_copies()


def dynamodb_client(url: str) -> Any:
    return boto3.client(
        "dynamodb",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=botocore.config.Config(retries={"max_attempts": 1}, max_pool_connections=DYNAMODB_THREADS),
    )


def test_concurrent_transactions_and_updates_keep_every_write(dynamodb_server: str) -> None:
    dynamodb = dynamodb_client(dynamodb_server)
    dynamodb.create_table(
        TableName="t",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    errors: list[str] = []

    def add(key: str) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": "t",
                "Key": {"pk": {"S": key}},
                "UpdateExpression": "ADD n :one",
                "ExpressionAttributeValues": {":one": {"N": "1"}},
            }
        }

    def work(worker: int) -> None:
        own = dynamodb_client(dynamodb_server)
        try:
            for n in range(DYNAMODB_ROUNDS):
                # A transaction on a shared counter and a fresh item (the table grows meanwhile),
                # an update, and a batch of puts: every kind of write racing the others' deepcopy.
                own.transact_write_items(TransactItems=[add("shared"), add(f"t-{worker}-{n}")])
                own.update_item(
                    TableName="t",
                    Key={"pk": {"S": f"u-{worker}"}},
                    UpdateExpression="ADD n :one",
                    ExpressionAttributeValues={":one": {"N": "1"}},
                )
                own.batch_write_item(
                    RequestItems={"t": [{"PutRequest": {"Item": {"pk": {"S": f"b-{worker}-{n}"}}}}]}
                )
        except ClientError as error:
            errors.append(str(error))

    threads = [threading.Thread(target=work, args=(w,)) for w in range(DYNAMODB_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)

    assert errors == []
    item = dynamodb.get_item(TableName="t", Key={"pk": {"S": "shared"}})["Item"]
    assert int(item["n"]["N"]) == DYNAMODB_THREADS * DYNAMODB_ROUNDS
    for worker in range(DYNAMODB_THREADS):
        item = dynamodb.get_item(TableName="t", Key={"pk": {"S": f"u-{worker}"}})["Item"]
        assert int(item["n"]["N"]) == DYNAMODB_ROUNDS
    items = sum(page["Count"] for page in dynamodb.get_paginator("scan").paginate(TableName="t"))
    assert items == 1 + DYNAMODB_THREADS + 2 * DYNAMODB_THREADS * DYNAMODB_ROUNDS


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


def transaction_session() -> list[Any]:
    """Transactions that succeed, fail on a condition, and fail on a duplicate key, on two tables."""
    dynamodb = boto3.client("dynamodb", region_name="us-east-1")
    dynamodb.create_table(
        TableName="plain",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    create_ranged_table(dynamodb, "ranged", sort_key_type="S")
    for n in range(50):  # bystanders: never touched, never lost
        dynamodb.put_item(TableName="plain", Item={"pk": {"S": f"other-{n}"}, "n": {"N": str(n)}})
    dynamodb.put_item(TableName="plain", Item={"pk": {"S": "a"}, "n": {"N": "1"}})
    dynamodb.put_item(TableName="ranged", Item={"pk": {"S": "a"}, "sk": {"S": "1"}, "n": {"N": "1"}})
    add = {"UpdateExpression": "ADD n :one", "ExpressionAttributeValues": {":one": {"N": "1"}}}
    transactions: list[list[Any]] = [
        [  # succeeds
            {"Update": {"TableName": "plain", "Key": {"pk": {"S": "a"}}, **add}},
            {"Put": {"TableName": "ranged", "Item": {"pk": {"S": "a"}, "sk": {"S": "2"}}}},
        ],
        [  # the last entry's condition fails: the update, put and delete before it are undone
            {"Update": {"TableName": "plain", "Key": {"pk": {"S": "a"}}, **add}},
            {"Put": {"TableName": "plain", "Item": {"pk": {"S": "new"}}}},
            {"Put": {"TableName": "ranged", "Item": {"pk": {"S": "b"}, "sk": {"S": "1"}}}},
            {"Delete": {"TableName": "ranged", "Key": {"pk": {"S": "a"}, "sk": {"S": "1"}}}},
            {
                "ConditionCheck": {
                    "TableName": "plain",
                    "Key": {"pk": {"S": "other-1"}},
                    "ConditionExpression": "n = :zero",
                    "ExpressionAttributeValues": {":zero": {"N": "0"}},
                }
            },
        ],
        [  # the same item twice: a validation error, nothing applied
            {"Update": {"TableName": "plain", "Key": {"pk": {"S": "a"}}, **add}},
            {"Update": {"TableName": "plain", "Key": {"pk": {"S": "a"}}, **add}},
        ],
    ]
    outcome: list[Any] = []
    for entries in transactions:
        try:
            dynamodb.transact_write_items(TransactItems=entries)
            outcome.append("ok")
        except ClientError as error:
            reasons = error.response.get("CancellationReasons", [])
            outcome.append((error.response["Error"]["Code"], [r.get("Code") for r in reasons]))
    for table in ("plain", "ranged"):
        items = dynamodb.scan(TableName=table)["Items"]
        outcome.append(sorted(json.dumps(item, sort_keys=True) for item in items))
    return outcome


def answers_kept(
    name: str, revert: Callable[[], None], apply: Callable[[], None], session: Callable[[], list[Any]]
) -> list[Any]:
    """``session`` on moto without the patch ``name``, then with it twice (the second from its caches):
    all three must give the same answers, which are returned.

    The patch is left as it was found (the suite's other tests may run with the patches applied).
    """
    was_applied = name in moto_patches._applied
    revert()
    try:
        with mock_aws():
            unpatched = session()
        apply()
        with mock_aws():
            patched = session()
        with mock_aws():
            again = session()
    finally:
        (apply if was_applied else revert)()
    assert patched == unpatched
    assert again == unpatched
    return unpatched


def test_transaction_rollback_from_item_backups_matches_table_copies() -> None:
    patched = answers_kept(
        "transaction_backups",
        moto_patches.restore_transaction_copies,
        moto_patches.back_up_transaction_items,
        transaction_session,
    )
    assert patched[:3] == [
        "ok",
        ("TransactionCanceledException", ["None", "None", "None", "None", "ConditionalCheckFailed"]),
        ("ValidationException", []),
    ]
    # Nothing of the failed ones stayed: the 50 bystanders and "a", updated once; two ranged items.
    assert len(patched[3]) == 51 and '{"n": {"N": "2"}, "pk": {"S": "a"}}' in patched[3]
    assert len(patched[4]) == 2


def update_session() -> list[Any]:
    """UpdateItem with the expressions the runtime sends and moto's error cases, each text more than once."""
    dynamodb = boto3.client("dynamodb", region_name="us-east-1")
    create_ranged_table(dynamodb, "t", sort_key_type="S")
    key = {"pk": {"S": "tenant-01"}, "sk": {"S": "ingest"}}
    lease = "SET tokens = :tokens, updated_at = :updated, version = :next"
    calls: list[dict[str, Any]] = []
    for version in range(3):  # a token lease as ingest takes it, then a lost race (stale version)
        for expected in (version, version - 1):
            values = {
                ":tokens": {"N": f"{version}.5"},
                ":updated": {"N": "17.25"},
                ":next": {"N": str(version + 1)},
            }
            condition = "attribute_not_exists(version)"
            if expected > 0:
                condition, values[":version"] = "version = :version", {"N": str(expected)}
            calls.append(
                {
                    "UpdateExpression": lease,
                    "ConditionExpression": condition,
                    "ExpressionAttributeValues": values,
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            )
    more: list[tuple[str, dict[str, Any]]] = [
        ("SET #n = if_not_exists(#n, :zero) + :one", {"#n": "n"}),
        ("SET #n = if_not_exists(#n, :zero) + :one", {"#n": "n"}),
        ("SET l = list_append(if_not_exists(l, :empty), :items), m.a = :one", {}),
        ("SET l = list_append(if_not_exists(l, :empty), :items), m.a = :one", {}),  # m missing: error
        ("SET m = :map", {}),
        ("SET m.a = :one, l[0] = :zero REMOVE tokens ADD s :set", {}),
        ("SET m.a = :one, l[0] = :zero REMOVE tokens ADD s :set", {}),
        ("DELETE s :set", {}),
        ("SET sk = :one", {}),  # a key attribute: error
        ("SET size = :one", {}),  # a reserved word: error
        ("SET a = :undefined", {}),  # an undefined value: error
        ("SET a = :one, a = :zero", {}),  # the same path twice: error
        ("SET = :one", {}),  # a syntax error
        ("SET = :one", {}),
    ]
    shared = {
        ":zero": {"N": "0"},
        ":one": {"N": "1"},
        ":empty": {"L": []},
        ":items": {"L": [{"S": "x"}]},
        ":map": {"M": {"b": {"S": "y"}}},
        ":set": {"SS": ["p", "q"]},
    }
    for expression, names in more:
        used = {name: value for name, value in shared.items() if name in expression}
        call: dict[str, Any] = {"UpdateExpression": expression}
        if used:
            call["ExpressionAttributeValues"] = used
        if names:
            call["ExpressionAttributeNames"] = names
        calls.append(call)
    outcome: list[Any] = []
    for call in calls:
        try:
            outcome.append(
                dynamodb.update_item(TableName="t", Key=key, ReturnValues="ALL_NEW", **call)["Attributes"]
            )
        except ClientError as error:
            outcome.append(
                (
                    error.response["Error"]["Code"],
                    error.response["Error"]["Message"],
                    error.response.get("Item"),
                )
            )
    transaction = {"Update": {"TableName": "t", "Key": key, "UpdateExpression": lease, **calls[0]}}
    transaction["Update"]["ExpressionAttributeValues"] = {
        ":tokens": {"N": "9"},
        ":updated": {"N": "1"},
        ":next": {"N": "1"},
    }
    transaction["Update"].pop("ReturnValuesOnConditionCheckFailure")
    try:
        dynamodb.transact_write_items(TransactItems=[transaction])
        outcome.append("ok")
    except ClientError as error:
        outcome.append(error.response["Error"]["Code"])
    outcome.append(dynamodb.scan(TableName="t")["Items"])
    return outcome


def test_update_expressions_parsed_once_match_parsed_each_time() -> None:
    unpatched = answers_kept(  # the second patched run: every text cached by then
        "update_expressions",
        moto_patches.parse_update_expressions_each_time,
        moto_patches.cache_update_expressions,
        update_session,
    )
    errors = [entry[0] for entry in unpatched if isinstance(entry, tuple)]
    assert errors.count("ConditionalCheckFailedException") == 3
    assert errors.count("ValidationException") >= 6
    assert unpatched[-2] == "TransactionCanceledException"  # attribute_not_exists(version) on a leased bucket


def condition_session() -> list[Any]:
    """Conditions and filters of every shape moto parses, each text twice or more with other values."""
    dynamodb = boto3.client("dynamodb", region_name="us-east-1")
    create_ranged_table(dynamodb, "c", sort_key_type="S")
    outcome: list[Any] = []

    def attempt(action: Callable[..., Any], **kwargs: Any) -> None:
        try:
            response = action(**kwargs)
            outcome.append(("ok", response.get("Items"), response.get("Count")))
        except ClientError as error:
            outcome.append((error.response["Error"]["Code"], error.response["Error"]["Message"]))
        except Exception as error:  # moto's own failures (a server would answer 500): the same either way
            outcome.append(("raised", type(error).__name__, str(error)))

    for n in range(4):  # the same insert-once condition: the first wins, the rest fail
        attempt(
            dynamodb.put_item,
            TableName="c",
            Item={"pk": {"S": "p"}, "sk": {"S": f"s{n % 2}"}, "v": {"N": str(n)}, "tag": {"S": f"t-{n}"}},
            ConditionExpression="attribute_not_exists(pk)",
        )
    key = {"pk": {"S": "p"}, "sk": {"S": "s0"}}
    conditions: list[tuple[str, dict[str, Any], dict[str, str]]] = [
        ("v = :v", {":v": {"N": "0"}}, {}),
        ("v = :v", {":v": {"N": "7"}}, {}),  # the same text, another value: fails
        ("#v < :hi AND #v >= :lo", {":hi": {"N": "5"}, ":lo": {"N": "0"}}, {"#v": "v"}),
        ("#v < :hi AND #v >= :lo", {":hi": {"N": "0"}, ":lo": {"N": "0"}}, {"#v": "v"}),
        ("#v < :hi AND #v >= :lo", {":hi": {"N": "5"}, ":lo": {"N": "0"}}, {"#v": "hits"}),  # other names
        ("v BETWEEN :lo AND :hi", {":lo": {"N": "-1"}, ":hi": {"N": "1"}}, {}),
        ("v BETWEEN :lo AND :hi", {":lo": {"N": "2"}, ":hi": {"N": "3"}}, {}),
        ("v IN (:a, :b, :c)", {":a": {"N": "9"}, ":b": {"N": "0"}, ":c": {"N": "8"}}, {}),
        ("v IN (:a, :b, :c)", {":a": {"N": "9"}, ":b": {"N": "7"}, ":c": {"N": "8"}}, {}),
        ("begins_with(tag, :p) OR contains(tag, :q)", {":p": {"S": "t-"}, ":q": {"S": "zz"}}, {}),
        ("begins_with(tag, :p) OR contains(tag, :q)", {":p": {"S": "x"}, ":q": {"S": "zz"}}, {}),
        ("NOT (size(tag) > :n) AND attribute_type(v, :t)", {":n": {"N": "2"}, ":t": {"S": "N"}}, {}),
        ("NOT (size(tag) > :n) AND attribute_type(v, :t)", {":n": {"N": "9"}, ":t": {"S": "N"}}, {}),
        ("v = :v", {":v": {"N": "0"}, ":unused": {"N": "1"}}, {}),  # an unused value: error
        ("v = :missing", {":v": {"N": "0"}}, {}),  # an undefined value: error
        ("v = :missing", {":v": {"N": "0"}}, {}),
        ("#missing = :v", {":v": {"N": "0"}}, {}),  # an undefined name: error
        ("v = = :v", {":v": {"N": "0"}}, {}),  # a syntax error
        ("v = = :v", {":v": {"N": "0"}}, {}),
        ("((v = :v))", {":v": {"N": "0"}}, {}),  # redundant parentheses: error
    ]
    for condition, values, names in conditions:
        extra: dict[str, Any] = {"ExpressionAttributeNames": names} if names else {}
        attempt(
            dynamodb.update_item,
            TableName="c",
            Key=key,
            UpdateExpression="SET hits = if_not_exists(hits, :zero) + :one",
            ConditionExpression=condition,
            ExpressionAttributeValues={**values, ":zero": {"N": "0"}, ":one": {"N": "1"}},
            **extra,
        )
        if " BETWEEN " in condition or (condition == "v = :v" and ":unused" not in values):
            # on a missing item; moto 5.2.5 raises (HTTP 500) on size() of one and on bad texts here
            attempt(
                dynamodb.delete_item,
                TableName="c",
                Key={"pk": {"S": "none"}, "sk": {"S": "x"}},
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
                **extra,
            )
    for low in ("0", "1", "0"):  # a filter text again with other values
        attempt(
            dynamodb.scan,
            TableName="c",
            FilterExpression="v >= :low AND begins_with(tag, :p)",
            ExpressionAttributeValues={":low": {"N": low}, ":p": {"S": "t-"}},
        )
        attempt(
            dynamodb.query,
            TableName="c",
            KeyConditionExpression="pk = :pk",
            FilterExpression="v >= :low",
            ExpressionAttributeValues={":pk": {"S": "p"}, ":low": {"N": low}},
        )
    for version in ("0", "5"):  # a transaction's condition check, passing then failing
        attempt(
            dynamodb.transact_write_items,
            TransactItems=[
                {
                    "ConditionCheck": {
                        "TableName": "c",
                        "Key": key,
                        "ConditionExpression": "v = :v",
                        "ExpressionAttributeValues": {":v": {"N": version}},
                    }
                },
                {"Put": {"TableName": "c", "Item": {"pk": {"S": "q"}, "sk": {"S": version}}}},
            ],
        )
    outcome.append(sorted(json.dumps(item, sort_keys=True) for item in dynamodb.scan(TableName="c")["Items"]))
    return outcome


def test_conditions_parsed_once_match_parsed_each_time() -> None:
    unpatched = answers_kept(  # the second patched run: every text cached by then
        "condition_expressions",
        moto_patches.parse_condition_expressions_each_time,
        moto_patches.cache_condition_expressions,
        condition_session,
    )
    codes = [entry[0] for entry in unpatched if isinstance(entry, tuple)]
    assert codes.count("ok") == 16  # the same texts pass and fail by their values, not by the cache
    assert codes.count("ConditionalCheckFailedException") == 12
    assert codes.count("TransactionCanceledException") == 1
    errors = [entry[1:] for entry in unpatched if isinstance(entry, tuple) and entry[0] != "ok"]
    assert ("KeyError", "':missing'") in errors  # moto's own failure for an undefined value, each time
    assert ("ValueError", "Bad comparison v = =") in errors
    assert any("unused in expressions" in str(error) for error in errors)
    assert any("redundant parentheses" in str(error) for error in errors)


@pytest.fixture
def keep_alive_server() -> Iterator[tuple[str, int]]:
    was_applied = "keep_alive" in moto_patches._applied
    moto_patches.keep_alive_connections()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield host, port
    server.stop()
    if not was_applied:
        moto_patches.close_connections()


SQS_HEADERS = {
    "Content-Type": "application/x-amz-json-1.0",
    "Authorization": "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/sqs/aws4_request, "
    "SignedHeaders=host, Signature=0",
}


def sqs_call(connection: http.client.HTTPConnection, action: str, body: dict[str, Any]) -> tuple[Any, Any]:
    connection.request("POST", "/", json.dumps(body), {**SQS_HEADERS, "X-Amz-Target": f"AmazonSQS.{action}"})
    response = connection.getresponse()
    data = response.read()
    return response, json.loads(data) if response.status == 200 else data


def test_a_connection_serves_several_requests(keep_alive_server: tuple[str, int]) -> None:
    connection = http.client.HTTPConnection(*keep_alive_server, timeout=10)
    response, created = sqs_call(connection, "CreateQueue", {"QueueName": "kept"})
    assert response.status == 200 and response.getheader("Connection") is None
    sock = connection.sock
    # A failing request's body (an unknown action) is consumed with it, not taken for the next request.
    response, _ = sqs_call(connection, "NoSuchAction", {"padding": "x" * 100_000})
    assert response.status >= 400
    for n in range(3):
        response, _ = sqs_call(
            connection, "SendMessage", {"QueueUrl": created["QueueUrl"], "MessageBody": str(n)}
        )
        assert response.status == 200
    response, received = sqs_call(
        connection, "ReceiveMessage", {"QueueUrl": created["QueueUrl"], "MaxNumberOfMessages": 10}
    )
    assert sorted(m["Body"] for m in received["Messages"]) == ["0", "1", "2"]
    assert connection.sock is sock  # one TCP connection throughout
    connection.close()


def test_a_chunked_request_still_closes_its_connection(keep_alive_server: tuple[str, int]) -> None:
    connection = http.client.HTTPConnection(*keep_alive_server, timeout=10)
    body = json.dumps({"QueueName": "chunked"}).encode()
    connection.request(
        "POST",
        "/",
        iter([body]),
        {**SQS_HEADERS, "X-Amz-Target": "AmazonSQS.CreateQueue", "Transfer-Encoding": "chunked"},
        encode_chunked=True,
    )
    response = connection.getresponse()
    assert response.status == 200 and json.loads(response.read())["QueueUrl"].endswith("/chunked")
    assert response.getheader("Connection") == "close"
    connection.close()


def response_session() -> list[Any]:
    """Responses built from dicts (DynamoDB items of every type, tables) and from moto's objects (SQS)."""
    dynamodb = boto3.client("dynamodb", region_name="us-east-1")
    sqs = boto3.client("sqs", region_name="us-east-1")
    create_ranged_table(dynamodb, "t", sort_key_type="N")
    item = {
        "pk": {"S": "a"},
        "sk": {"N": "1"},
        "b": {"B": b"\x00\x01bytes"},
        "ss": {"SS": ["x", "y"]},
        "ns": {"NS": ["1", "2.5"]},
        "bs": {"BS": [b"\x02", b"\x03"]},
        "m": {"M": {"inner": {"L": [{"S": "s"}, {"NULL": True}, {"BOOL": False}, {"M": {}}]}}},
        "flag": {"BOOL": True},
    }
    outcome: list[Any] = []
    for n in range(3):
        dynamodb.put_item(TableName="t", Item={**item, "sk": {"N": str(n)}})
    outcome.append(dynamodb.get_item(TableName="t", Key={"pk": {"S": "a"}, "sk": {"N": "1"}})["Item"])
    query = dynamodb.query(
        TableName="t",
        KeyConditionExpression="pk = :pk",
        ExpressionAttributeValues={":pk": {"S": "a"}},
        Limit=2,
    )
    outcome.append({key: query[key] for key in ("Items", "Count", "ScannedCount", "LastEvaluatedKey")})
    batch = dynamodb.batch_get_item(
        RequestItems={"t": {"Keys": [{"pk": {"S": "a"}, "sk": {"N": str(n)}} for n in range(3)]}}
    )
    outcome.append(sorted(json.dumps(i, sort_keys=True, default=str) for i in batch["Responses"]["t"]))
    updated = dynamodb.update_item(
        TableName="t",
        Key={"pk": {"S": "a"}, "sk": {"N": "0"}},
        UpdateExpression="SET n = :n REMOVE b",
        ExpressionAttributeValues={":n": {"N": "7"}},
        ReturnValues="ALL_NEW",
    )
    outcome.append(updated["Attributes"])
    table = dynamodb.describe_table(TableName="t")["Table"]
    outcome.append(
        {key: table[key] for key in ("KeySchema", "AttributeDefinitions", "TableStatus", "ItemCount")}
    )
    url = sqs.create_queue(QueueName="q")["QueueUrl"]
    sqs.send_message(
        QueueUrl=url,
        MessageBody="body",
        MessageAttributes={"kind": {"DataType": "String", "StringValue": "k"}},
    )
    received = sqs.receive_message(
        QueueUrl=url, AttributeNames=["ApproximateReceiveCount"], MessageAttributeNames=["All"]
    )["Messages"]
    outcome.append([(m["Body"], m["Attributes"], m["MessageAttributes"], m["MD5OfBody"]) for m in received])
    return outcome


def test_response_keys_looked_up_once_give_the_same_responses() -> None:
    unpatched = answers_kept(  # the second patched run: from the cache throughout
        "response_keys",
        moto_patches.look_up_response_keys_each_time,
        moto_patches.cache_response_keys,
        response_session,
    )
    assert unpatched[0]["bs"] == {"BS": [b"\x02", b"\x03"]} and unpatched[0]["m"]["M"]["inner"]["L"][1] == {
        "NULL": True
    }


class _ChangedWhileIterated(set):  # type: ignore[type-arg]
    """A pending set that another request changes while Python code iterates it."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        values = iter(set.copy(self))
        first = next(values, None)
        if first is not None:
            self.add(_Grouped("added-meanwhile"))
            yield first
        yield from values
        raise RuntimeError("Set changed size during iteration")


class _Grouped:
    def __init__(self, group_id: str | None) -> None:
        self.group_id = group_id


def test_pending_message_groups_read_a_snapshot_of_the_pending_set(restore_patches: None) -> None:
    from moto.sqs import models as sqs_models

    def queue() -> object:
        pending = _ChangedWhileIterated({_Grouped("tenant-a"), _Grouped("tenant-b"), _Grouped(None)})
        return type("Queue", (), {"_pending_messages": pending})()

    moto_patches.revert()
    with pytest.raises(RuntimeError, match="changed size"):
        sqs_models.Queue.pending_message_groups.fget(queue())  # moto's own: iterates the live set
    moto_patches.apply()
    assert sqs_models.Queue.pending_message_groups.fget(queue()) == {"tenant-a", "tenant-b"}


class _SteppingClock:
    """``unix_time_millis`` that moves ``step`` ms on with every reading: a slow server, made exact."""

    def __init__(self, step: float) -> None:
        self.now = time.time() * 1000
        self.step = step

    def __call__(self, *args: Any) -> float:
        self.now += self.step
        return self.now


def _depth_readings(monkeypatch: pytest.MonkeyPatch, sqs: Any, url: str) -> list[int]:
    """The sum of the three counts, read while a clock that jumps with every reading passes the delay."""
    from moto.sqs import models as sqs_models

    clock = _SteppingClock(step=7)
    monkeypatch.setattr(sqs_models, "unix_time_millis", clock)
    monkeypatch.setattr(moto_patches, "unix_time_millis", clock)
    sqs.send_message(QueueUrl=url, MessageBody="late", DelaySeconds=1)
    sqs.send_message(QueueUrl=url, MessageBody="now")
    sqs.receive_message(QueueUrl=url, VisibilityTimeout=1)  # "now" in flight for 1 s
    readings = [sum(counts(sqs, url)) for _ in range(300)]  # the clock passes 1 s within these
    monkeypatch.undo()
    return readings


def test_the_counts_of_one_response_are_taken_at_one_instant(
    restore_patches: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A message is visible, delayed or in flight: at any one instant exactly one of them. Counted at
    # different instants, a delay or visibility timeout running out between two counts hid a message.
    with mock_aws():
        sqs = boto3.client("sqs", region_name="us-east-1")
        moto_patches.revert()
        url = sqs.create_queue(QueueName="unpatched")["QueueUrl"]
        assert min(_depth_readings(monkeypatch, sqs, url)) < 2  # moto's own counts miss one
        moto_patches.apply()
        url = sqs.create_queue(QueueName="patched")["QueueUrl"]
        assert set(_depth_readings(monkeypatch, sqs, url)) == {2}
