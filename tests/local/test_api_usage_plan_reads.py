"""UsagePlanThrottles on moto's API Gateway, in process: a failed read of the plans is not an answer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import EndpointConnectionError
from moto import mock_aws

from local.emulator.api_throttles import UsagePlanThrottles

STAGE = "dev"


@pytest.fixture
def enrolled() -> Iterator[tuple[Any, str, str]]:
    """A client of moto's API Gateway, an API with a stage, and a key in a plan of that stage."""
    with mock_aws():
        client = boto3.client("apigateway", region_name="us-east-1")
        api = client.create_rest_api(name="breakwater")["id"]
        root = client.get_resources(restApiId=api)["items"][0]["id"]
        client.put_method(restApiId=api, resourceId=root, httpMethod="GET", authorizationType="NONE")
        client.put_integration(restApiId=api, resourceId=root, httpMethod="GET", type="MOCK")
        client.create_deployment(restApiId=api, stageName=STAGE)
        plan = client.create_usage_plan(
            name="standard",
            apiStages=[{"apiId": api, "stage": STAGE}],
            throttle={"rateLimit": 10.0, "burstLimit": 20},
        )["id"]
        key = client.create_api_key(name="tenant-01", enabled=True, value="tenant-01-key-value-0001")
        client.create_usage_plan_key(usagePlanId=plan, keyId=key["id"], keyType="API_KEY")
        yield client, api, str(key["value"])


def test_a_key_in_a_plan_is_admitted_and_an_unknown_one_is_not(enrolled: tuple[Any, str, str]) -> None:
    client, api, value = enrolled
    plans = UsagePlanThrottles(client, api, STAGE)
    assert plans.admit(value) is True
    assert plans.admit("no-such-key-value-000000") is None


def test_a_read_that_fails_is_read_again_before_a_known_key_is_refused(
    enrolled: tuple[Any, str, str],
) -> None:
    client, api, value = enrolled
    failures = {"left": 2}

    def unreachable(**_: Any) -> None:
        if failures["left"]:
            failures["left"] -= 1
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1")

    client.meta.events.register("before-call.api-gateway.GetApiKeys", unreachable)
    plans = UsagePlanThrottles(client, api, STAGE)

    assert plans.admit(value) is True
    assert failures["left"] == 0
