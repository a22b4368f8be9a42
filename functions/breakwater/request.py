"""What the API handlers read from API Gateway's (REST) proxy event."""

from __future__ import annotations

import base64

from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent


def request_body(event: APIGatewayProxyEvent) -> bytes | None:
    """The request's body as bytes (decoded where API Gateway base64-encoded it); None if it has none."""
    if event.body is None:
        return None
    if event.is_base64_encoded:
        return base64.b64decode(event.body)
    return event.body.encode()
