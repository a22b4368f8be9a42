"""What every API route reads from the event: the trace id and the tenant."""

from __future__ import annotations

import pytest
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent

from breakwater.api import tenant_of, trace_id
from breakwater.errors import UnauthenticatedError


def _event(headers: dict[str, str], authorizer: dict[str, str] | None = None) -> APIGatewayProxyEvent:
    return APIGatewayProxyEvent(
        {
            "headers": headers,
            "body": None,
            "requestContext": {"requestId": "r", "authorizer": authorizer or {}},
        }
    )


def test_the_trace_id_is_the_root_of_api_gateways_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("_X_AMZN_TRACE_ID", raising=False)
    header = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    assert trace_id(_event({"X-Amzn-Trace-Id": header})) == "1-5759e988-bd862e3fe1be46a994272793"
    assert trace_id(_event({})) is None
    monkeypatch.setenv("_X_AMZN_TRACE_ID", "Root=1-abc;Sampled=0")
    assert trace_id(_event({})) == "1-abc"  # Lambda's own, when API Gateway sent none


def test_the_tenant_comes_from_the_authorizer_or_the_request_is_401() -> None:
    context = {"tenant": "acme", "tier": "standard", "rate": "5", "burst": "10"}
    assert tenant_of(_event({}, context)).tenant == "acme"
    with pytest.raises(UnauthenticatedError):
        tenant_of(_event({}))
