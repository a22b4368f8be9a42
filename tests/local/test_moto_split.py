"""DynamoDB in a moto process of its own: the same tables, reached from every endpoint.

The embedded AWS runs two moto servers: the main one, and one that serves DynamoDB. These tests
drive both through boto3 and check what a function, a tool and the deployment rely on:

* a client built from :meth:`EmbeddedAws.environment` (what every function gets) reaches the
  DynamoDB process for DynamoDB and the main server for the rest;
* a tool given only ``AWS_ENDPOINT_URL`` sees the same tables: the main server forwards DynamoDB
  requests, answers and errors alike, and keeps the others;
* ``create_stack`` creates the template in both processes with the tables under the same names, and
  refuses a deployment whose names differ.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest

from local.emulator.assembly import CloudAssembly
from local.emulator.deploy import DeployError, create_stack
from local.emulator.embedded_aws import EmbeddedAws

KEY = {"AttributeName": "pk", "KeyType": "HASH"}
ATTRIBUTE = {"AttributeName": "pk", "AttributeType": "S"}


def _direct(endpoint: str, service: str) -> Any:
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1")  # type: ignore[call-overload]


def _assembly(directory: Path, stack_name: str) -> CloudAssembly:
    """A template with two tables CloudFormation names (and a queue, which stays in the main process)."""
    table = {
        "Type": "AWS::DynamoDB::Table",
        "Properties": {
            "KeySchema": [KEY],
            "AttributeDefinitions": [ATTRIBUTE],
            "BillingMode": "PAY_PER_REQUEST",
        },
    }
    template = {
        "Resources": {"First": table, "Second": table, "Work": {"Type": "AWS::SQS::Queue", "Properties": {}}}
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{stack_name}.template.json").write_text(json.dumps(template), encoding="utf-8")
    (directory / f"{stack_name}.assets.json").write_text(json.dumps({"files": {}}), encoding="utf-8")
    return CloudAssembly(directory=directory, stack_name=stack_name, template=template)


@pytest.fixture
def table(aws: EmbeddedAws, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"split-{request.node.name}"[:200]
    client = aws.client("dynamodb")
    client.create_table(
        TableName=name, KeySchema=[KEY], AttributeDefinitions=[ATTRIBUTE], BillingMode="PAY_PER_REQUEST"
    )
    yield name
    client.delete_table(TableName=name)


def test_a_function_environment_reaches_the_dynamodb_process(
    aws: EmbeddedAws,
    table: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert aws.dynamodb is not None
    environment = aws.environment()
    assert environment["AWS_ENDPOINT_URL_DYNAMODB"] == aws.dynamodb.endpoint != aws.endpoint
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    session = boto3.session.Session()  # as a handler makes its clients: no endpoint_url given
    session.client("dynamodb").put_item(TableName=table, Item={"pk": {"S": "from-a-function"}})
    queue_url = session.client("sqs").create_queue(QueueName="split-from-a-function")["QueueUrl"]

    in_dynamodb_process = _direct(aws.dynamodb.endpoint, "dynamodb")
    assert in_dynamodb_process.get_item(TableName=table, Key={"pk": {"S": "from-a-function"}})["Item"]
    assert queue_url in _direct(aws.endpoint, "sqs").list_queues().get("QueueUrls", [])
    assert not _direct(aws.dynamodb.endpoint, "sqs").list_queues().get("QueueUrls")


def test_the_main_endpoint_forwards_dynamodb_answers_and_errors(aws: EmbeddedAws, table: str) -> None:
    assert aws.dynamodb is not None
    through_main = _direct(aws.endpoint, "dynamodb")
    direct = _direct(aws.dynamodb.endpoint, "dynamodb")
    through_main.put_item(TableName=table, Item={"pk": {"S": "one"}, "n": {"N": "1"}})
    through_main.update_item(
        TableName=table,
        Key={"pk": {"S": "one"}},
        UpdateExpression="SET n = n + :d",
        ConditionExpression="n < :limit",
        ExpressionAttributeValues={":d": {"N": "2"}, ":limit": {"N": "5"}},
    )
    assert direct.get_item(TableName=table, Key={"pk": {"S": "one"}})["Item"]["n"] == {"N": "3"}
    assert through_main.scan(TableName=table)["Items"] == direct.scan(TableName=table)["Items"]

    errors = []
    for client in (through_main, direct):
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            client.update_item(
                TableName=table,
                Key={"pk": {"S": "one"}},
                UpdateExpression="SET n = :z",
                ConditionExpression="n > :limit",
                ExpressionAttributeValues={":z": {"N": "0"}, ":limit": {"N": "5"}},
            )
        answer = refused.value.response
        errors.append((answer["Error"]["Code"], answer["ResponseMetadata"]["HTTPStatusCode"]))
    assert errors[0] == errors[1] == ("ConditionalCheckFailedException", 400)
    with pytest.raises(through_main.exceptions.ResourceNotFoundException):
        through_main.describe_table(TableName="split-no-such-table")


def test_the_stack_has_its_tables_under_the_same_names_in_both_processes(
    aws: EmbeddedAws,
    tmp_path: Path,
) -> None:
    assert aws.dynamodb is not None
    deployment = create_stack(aws, _assembly(tmp_path, "SplitNames"))
    names = {deployment.physical_ids["First"], deployment.physical_ids["Second"]}
    assert len(names) == 2 and all(name.startswith("SplitNames-") for name in names)
    assert names <= set(_direct(aws.dynamodb.endpoint, "dynamodb").list_tables()["TableNames"])
    assert names <= set(_direct(aws.endpoint, "dynamodb").list_tables()["TableNames"])  # forwarded


def test_a_deployment_whose_table_names_differ_is_refused(
    aws: EmbeddedAws,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert aws.dynamodb is not None
    other_seed = aws.dynamodb.seed_random
    monkeypatch.setattr(aws.dynamodb, "seed_random", lambda value: other_seed(value + 1))
    with pytest.raises(DeployError, match="not named as the main process's") as refused:
        create_stack(aws, _assembly(tmp_path, "SplitApart"))
    assert "First" in str(refused.value) and "Second" in str(refused.value)
