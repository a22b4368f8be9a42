"""Server patches: a kept-alive connection serves several requests (a chunked one still closes it);
response keys looked up once give the same responses."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from local.emulator import moto_patches
from tests.local.helpers import answers_kept, create_ranged_table


@pytest.fixture
def keep_alive_server() -> Iterator[tuple[str, int]]:
    with moto_patches.installed(names={"server.keep_alive_connections"}):
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        yield host, port
        server.stop()


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
    # the second patched run: from the cache throughout
    unpatched = answers_kept("server.response_keys_looked_up_once", response_session)
    assert unpatched[0]["bs"] == {"BS": [b"\x02", b"\x03"]} and unpatched[0]["m"]["M"]["inner"]["L"][1] == {
        "NULL": True
    }
