"""REQUEST authorizer: ``Authorization: Bearer <tenant_id>.<secret>`` -> the tenant, its tier and its limits.

Unknown or malformed keys answer 401 (API Gateway requires the exact ``Unauthorized`` error);
disabled tenants get an explicit Deny (403). An Allow covers the whole API so API Gateway's own
authorizer cache applies to every route. An Allow also names the tenant's API Gateway API key
(``usageIdentifierKey``), whose usage plan throttles the tenant at the edge, before ingest runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aws_lambda_powertools.utilities.data_classes import event_source
from aws_lambda_powertools.utilities.data_classes.api_gateway_authorizer_event import (
    APIGatewayAuthorizerRequestEvent,
    APIGatewayAuthorizerResponse,
)
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.auth import Authorizer, TenantCache, Verdict, rest_api_id_of, usage_identifier_key
from breakwater.aws.tenants import TenantTable
from breakwater.observability import logger
from breakwater.settings import AuthorizerSettings

NEGATIVE_CACHE_SECONDS = 5.0


def build_authorizer(settings: AuthorizerSettings, clock: Callable[[], float] = time.time) -> Authorizer:
    """Wires the tenants table to the policy; tests pass their own clock."""
    table = TenantTable(settings.tenants_table_name)
    cache = TenantCache(
        table.get,
        clock,
        ttl_seconds=settings.cache_seconds,
        negative_ttl_seconds=NEGATIVE_CACHE_SECONDS,
        recheck_seconds=NEGATIVE_CACHE_SECONDS,
    )
    return Authorizer(cache, settings, clock)


SETTINGS = AuthorizerSettings.from_env()
AUTHORIZER = build_authorizer(SETTINGS)


@logger.inject_lambda_context(clear_state=True)
@event_source(data_class=APIGatewayAuthorizerRequestEvent)
def handler(event: APIGatewayAuthorizerRequestEvent, context: LambdaContext) -> dict[str, Any]:
    decision = AUTHORIZER.authorize(event.headers.get("Authorization"))
    logger.append_keys(tenant=decision.tenant_id, request_id=event.request_context.request_id)
    if decision.verdict == Verdict.UNAUTHORIZED:
        logger.info("unauthorized", extra={"reason": decision.reason})
        raise Exception("Unauthorized")  # the exact message API Gateway turns into a 401
    assert decision.tenant_id is not None
    policy = APIGatewayAuthorizerResponse.from_route_arn(
        event.method_arn,
        principal_id=decision.tenant_id,
        context=decision.context() or None,
        usage_identifier_key=usage_identifier_key(rest_api_id_of(event.method_arn), decision.tenant_id),
    )
    if decision.verdict == Verdict.DENY:
        logger.info("denied", extra={"reason": decision.reason})
        policy.deny_all_routes()
    else:
        policy.allow_all_routes()
    return policy.asdict()
