"""DynamoDB patches: under ThreadedMotoServer, serialized, moto loses nothing to concurrent transactions;
rollbacks from item backups, and expressions parsed once, give moto's own answers."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import botocore.config
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws
from moto.server import ThreadedMotoServer

from local.emulator import moto_patches
from tests.local.helpers import answers_kept, create_ranged_table

DYNAMODB_THREADS = 8
DYNAMODB_ROUNDS = 40
GROWING_ITEM_ENTRIES = 300
GROWING_ITEM_ROUNDS = 6
GROWING_ITEM_THREADS = 4


@pytest.fixture
def dynamodb_server() -> Iterator[str]:
    # as the emulator's moto process runs them
    patches = {"dynamodb.serialized_item_operations", "dynamodb.transaction_item_backups"}
    with moto_patches.installed(names=patches):
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
        server.stop()


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


def test_concurrent_answers_about_one_growing_item_never_fail() -> None:
    # moto's answers (an update's old and new item, a get, a query) copy and serialize the stored
    # item itself: done while another request adds to that item's map, they raise "dictionary
    # changed size during iteration" unless answered under the lock of the item operations. In
    # process, as the tests' containers call moto, the window is widest.
    with mock_aws(), moto_patches.installed(names={"dynamodb.serialized_item_operations"}):
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        create_ranged_table(dynamodb, "t", sort_key_type="S")
        key = {"pk": {"S": "tenant#a"}, "sk": {"S": "counters"}}
        others = {f"other-{n}": {"M": {"n": {"N": "1"}}} for n in range(GROWING_ITEM_ENTRIES)}
        dynamodb.put_item(TableName="t", Item={**key, "leases": {"M": others}})
        errors: list[str] = []

        def work(worker: int) -> None:
            try:
                for n in range(GROWING_ITEM_ROUNDS):
                    holder = {"#h": f"c{worker}-{n}"}
                    dynamodb.update_item(
                        TableName="t",
                        Key=key,
                        UpdateExpression="SET leases.#h = :lease",
                        ExpressionAttributeNames=holder,
                        ExpressionAttributeValues={":lease": {"M": {"exp": {"N": str(n)}}}},
                        ReturnValues="ALL_NEW",
                    )
                    dynamodb.get_item(TableName="t", Key=key)
                    dynamodb.query(
                        TableName="t",
                        KeyConditionExpression="pk = :pk",
                        ExpressionAttributeValues={":pk": key["pk"]},
                    )
                    dynamodb.update_item(
                        TableName="t",
                        Key=key,
                        UpdateExpression="REMOVE leases.#h",
                        ExpressionAttributeNames=holder,
                    )
            except Exception as error:  # moto's in-process answer raises what it met
                errors.append(repr(error))

        threads = [threading.Thread(target=work, args=(w,)) for w in range(GROWING_ITEM_THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)

        assert errors == []
        assert dynamodb.get_item(TableName="t", Key=key)["Item"]["leases"] == {"M": others}


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


def test_transaction_rollback_from_item_backups_matches_table_copies() -> None:
    patched = answers_kept("dynamodb.transaction_item_backups", transaction_session)
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
    # the second patched run: every text cached by then
    unpatched = answers_kept("dynamodb.update_expressions_parsed_once", update_session)
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
    # the second patched run: every text cached by then
    unpatched = answers_kept("dynamodb.conditions_parsed_once", condition_session)
    codes = [entry[0] for entry in unpatched if isinstance(entry, tuple)]
    assert codes.count("ok") == 16  # the same texts pass and fail by their values, not by the cache
    assert codes.count("ConditionalCheckFailedException") == 12
    assert codes.count("TransactionCanceledException") == 1
    errors = [entry[1:] for entry in unpatched if isinstance(entry, tuple) and entry[0] != "ok"]
    assert ("KeyError", "':missing'") in errors  # moto's own failure for an undefined value, each time
    assert ("ValueError", "Bad comparison v = =") in errors
    assert any("unused in expressions" in str(error) for error in errors)
    assert any("redundant parentheses" in str(error) for error in errors)
