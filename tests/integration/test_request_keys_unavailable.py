"""A keyed request whose claim cannot be written is a 503 with nothing stored, never a 5xx of another kind.

Found by the chaos run (``python -m local chaos`` with throttles and 500s answered to ingest's AWS calls):
a failed claim write escaped the handler, and API Gateway answered 502.
"""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from breakwater.aws.front_door import build_ingest
from breakwater.settings import IngestSettings
from tests.integration.apigateway import ApiGateway
from tests.integration.conftest import START
from tests.integration.test_request_keys import create_idempotency_table, stored


@pytest.fixture
def key(tenant_table_adapter: Any) -> str:
    return str(tenant_table_adapter.create("acme", "standard", now=START))


def test_a_claim_that_cannot_be_written_is_503_with_nothing_stored(
    api: ApiGateway,
    ingest_env: dict[str, str],
    clock: Any,
    monkeypatch: pytest.MonkeyPatch,
    key: str,
    live_queue_urls: list[str],
) -> None:
    monkeypatch.setenv("IDEMPOTENCY_TABLE_NAME", create_idempotency_table())
    api.ingest.SERVICE = build_ingest(IngestSettings.from_env(), clock)
    boto3.client("dynamodb").delete_table(TableName="breakwater-idempotency")  # every claim write fails

    response = api.request(key, {"type": "order", "payload": {"n": 1}}, headers={"Idempotency-Key": "o-1"})

    assert response.status == 503
    assert response.body["code"] == "enqueue_failed"
    assert response.headers["Retry-After"] == "1"
    assert stored(live_queue_urls) == []
