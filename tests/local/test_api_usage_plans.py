"""The emulated REST API's usage plans: a key the authorizer names is throttled by its plan, before
the integration runs; a key in no plan of the stage is refused (403), as API Gateway does.

The plans and keys live in the embedded API Gateway (moto's server), written through its API as the
stack and onboarding write them. The functions are stand-ins that count their invocations: what is
under test is the gateway's order of checks, not the handlers.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from local.emulator.api import LocalApi
from local.emulator.discovery import ApiSpec, AuthorizerSpec, RouteSpec
from local.emulator.embedded_aws import EmbeddedAws
from local.emulator.functions import Invocation
from tests.local.helpers import wait_for


class CountingFunction:
    """A function's containers, reduced to an answer and a count of invocations."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.invocations = 0
        self._lock = threading.Lock()

    def invoke(self, event: Any, **_: Any) -> Invocation:
        with self._lock:
            self.invocations += 1
        result = self.answer(event) if callable(self.answer) else self.answer
        return Invocation(function="f", request_id="r", result=result)


def _policy(event: dict[str, Any]) -> dict[str, Any]:
    tenant = event["headers"]["Authorization"].removeprefix("Bearer ")
    return {
        "principalId": tenant,
        "policyDocument": {
            "Version": "2012-10-17",
            "Statement": [{"Action": "execute-api:Invoke", "Effect": "Allow", "Resource": "*"}],
        },
        "context": {"tenant": tenant},
        "usageIdentifierKey": f"usage-key-of-tenant-{tenant}",
    }


@pytest.fixture
def gateway(aws: EmbeddedAws) -> Any:
    client = aws.client("apigateway", counted=False)
    api_id = client.create_rest_api(name="usage-plans-test")["id"]
    plan = client.create_usage_plan(
        name="tier-standard",
        apiStages=[{"apiId": api_id, "stage": "prod"}],
        throttle={"rateLimit": 0.001, "burstLimit": 2},  # a burst of 2, then (nearly) nothing
    )["id"]
    authorizer, ingest = CountingFunction(_policy), CountingFunction({"statusCode": 202, "body": "{}"})
    spec = ApiSpec(
        rest_api_id=api_id,
        stage="prod",
        routes=[
            RouteSpec(
                "POST",
                "/v1/messages",
                "Ingest",
                AuthorizerSpec("Authorizer", ("Authorization",), ttl_seconds=300),
                api_key_required=True,
            )
        ],
        api_key_source="AUTHORIZER",
    )
    api = LocalApi(spec, {"Authorizer": authorizer, "Ingest": ingest}, apigateway=client)  # type: ignore[dict-item]

    def enroll(tenant: str) -> None:
        key = client.create_api_key(name=tenant, value=f"usage-key-of-tenant-{tenant}", enabled=True)["id"]
        client.create_usage_plan_key(usagePlanId=plan, keyId=key, keyType="API_KEY")

    def post(tenant: str) -> tuple[int, dict[str, Any]]:
        status, _, body = api.handle(
            "POST", "/prod/v1/messages", {"Authorization": f"Bearer {tenant}"}, b'{"type": "t"}'
        )
        return status, json.loads(body)

    return post, enroll, ingest


def test_a_key_over_its_plans_throttle_is_refused_before_the_integration_runs(gateway: Any) -> None:
    post, enroll, ingest = gateway
    enroll("acme")
    assert [post("acme")[0] for _ in range(2)] == [202, 202]  # the plan's burst
    status, body = post("acme")
    assert status == 429 and body == {"message": "Too Many Requests"}
    assert ingest.invocations == 2  # the refused request cost no invocation
    enroll("globex")
    # A bucket per key: another tenant of the plan is not held back (once the plans are re-read).
    assert wait_for(lambda: post("globex")[0] == 202, timeout=5.0)
    assert post("acme")[0] == 429


def test_a_key_in_no_plan_of_the_stage_is_forbidden_until_it_is_enrolled(gateway: Any) -> None:
    post, enroll, ingest = gateway
    status, body = post("initech")
    assert status == 403 and body == {"message": "Forbidden"}
    assert ingest.invocations == 0
    enroll("initech")
    # Plans are re-read at most once a second for an unknown key: served within a second or so.
    assert wait_for(lambda: post("initech")[0] == 202, timeout=5.0)


def test_keys_enrolled_before_their_first_requests_are_all_found_when_those_arrive_at_once(
    gateway: Any,
) -> None:
    # The demo's first clump: every tenant's first request at the same instant, while the plans are
    # still being read for the first of them. None may be refused as unknown.
    post, enroll, ingest = gateway
    tenants = [f"tenant-{index:02d}" for index in range(12)]
    for tenant in tenants:
        enroll(tenant)
    start = threading.Barrier(len(tenants))
    statuses: dict[str, int] = {}

    def first_request(tenant: str) -> None:
        start.wait()
        statuses[tenant] = post(tenant)[0]

    threads = [threading.Thread(target=first_request, args=(tenant,)) for tenant in tenants]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == dict.fromkeys(tenants, 202)
    assert ingest.invocations == len(tenants)
