"""The Lambda patch: Invoke reaches the dispatcher the emulator routes (its containers), not Docker."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from local.emulator import moto_patches
from local.emulator.moto_patches import lambda_ as lambda_patches


@pytest.fixture
def lambda_client() -> Iterator[Any]:
    with moto_patches.installed(names={"lambda.route_invocations"}), mock_aws():
        iam = boto3.client("iam", region_name="us-east-1")
        role = iam.create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        client = boto3.client("lambda", region_name="us-east-1")
        client.create_function(
            FunctionName="archiver",
            Runtime="python3.12",
            Role=role,
            Handler="h.h",
            Code={"ZipFile": b"PK\x05\x06" + b"\0" * 18},
        )
        yield client


def test_invoke_reaches_the_routed_dispatcher(lambda_client: Any) -> None:
    received: list[tuple[str, dict[str, Any], str]] = []

    def dispatch(function_name: str, payload: bytes, invocation_type: str) -> bytes:
        received.append((function_name, json.loads(payload), invocation_type))
        return b"" if invocation_type == "Event" else json.dumps({"ok": True}).encode()

    previous = lambda_patches.route_invocations(dispatch)
    try:
        answer = lambda_client.invoke(FunctionName="archiver", Payload=b'{"n": 1}')
        assert json.loads(answer["Payload"].read()) == {"ok": True}
        started = lambda_client.invoke(FunctionName="archiver", InvocationType="Event", Payload=b'{"n": 2}')
        assert started["StatusCode"] == 202
        arn = lambda_client.get_function(FunctionName="archiver")["Configuration"]["FunctionArn"]
        lambda_client.invoke(FunctionName=arn, Payload=b'{"n": 3}')  # by ARN: the function's name
        with pytest.raises(ClientError, match="ResourceNotFoundException"):
            lambda_client.invoke(FunctionName="nothing-here", Payload=b"{}")  # moto's own error
    finally:
        lambda_patches.route_invocations(previous)
    assert received == [
        ("archiver", {"n": 1}, "RequestResponse"),
        ("archiver", {"n": 2}, "Event"),
        ("archiver", {"n": 3}, "RequestResponse"),
    ]
