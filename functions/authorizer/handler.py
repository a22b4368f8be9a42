"""REQUEST authorizer: ``Authorization: Bearer <tenant_id>.<secret>`` -> the tenant, its tier and its limits.

Unknown or malformed keys answer 401 (API Gateway requires the exact ``Unauthorized`` error);
disabled tenants get an explicit Deny (403). An Allow covers the whole API so API Gateway's own
authorizer cache applies to every route. An Allow also names the tenant's API Gateway API key
(``usageIdentifierKey``), whose usage plan throttles the tenant at the edge, before ingest runs.
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.data_classes import event_source
from aws_lambda_powertools.utilities.data_classes.api_gateway_authorizer_event import (
    APIGatewayAuthorizerRequestEvent,
    APIGatewayAuthorizerResponse,
)
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.auth import Verdict, rest_api_id_of, usage_identifier_key
from breakwater.aws.clients import DEADLINE
from breakwater.aws.front_door import build_authorizer
from breakwater.observability import logger
from breakwater.settings import AuthorizerSettings

AUTHORIZER = build_authorizer(AuthorizerSettings.from_env())


@logger.inject_lambda_context(clear_state=True)
@event_source(data_class=APIGatewayAuthorizerRequestEvent)
@DEADLINE.bounded  # every AWS call of an invocation ends before its timeout
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
