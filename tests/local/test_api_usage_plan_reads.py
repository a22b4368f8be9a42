"""UsagePlanThrottles on moto's API Gateway, in process: a failed read of the plans is not an answer."""

from __future__ import annotations

import threading
import time
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


def test_requests_that_arrive_while_the_first_read_runs_find_the_key_that_read_found(
    enrolled: tuple[Any, str, str],
) -> None:
    # The first request of a tenant reads the plans; others of that tenant arriving meanwhile wait for the
    # read lock and must take the key from that read, not be refused as a key missing a moment ago.
    client, api, value = enrolled
    reading, release = threading.Event(), threading.Event()

    def slow(**_: Any) -> None:
        if not reading.is_set():
            reading.set()
            release.wait(5)

    client.meta.events.register("before-call.api-gateway.GetApiKeys", slow)
    plans = UsagePlanThrottles(client, api, STAGE)
    answers: list[bool | None] = []
    first = threading.Thread(target=lambda: answers.append(plans.admit(value)))
    first.start()
    assert reading.wait(5)
    others = [threading.Thread(target=lambda: answers.append(plans.admit(value))) for _ in range(3)]
    for thread in others:
        thread.start()
    time.sleep(0.2)  # they arrived after the read began, and wait for it
    release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert answers == [True, True, True, True]
