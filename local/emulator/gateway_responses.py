"""The gateway's own answers: the response types API Gateway refuses a request with, their default
status and message, and the rendering of the template's gateway responses for them.

The stack's gateway responses (``breakwater_cdk/ingress.py``) answer every type with a problem details object
and a fixed status; the emulator substitutes the template's ``$context`` variables as API Gateway does
and sends the headers the response maps. A type with no response of its own takes its family's
(``DEFAULT_4XX``, ``DEFAULT_5XX``); a template without any is answered as API Gateway's default.
"""

from __future__ import annotations

import json
from typing import Any

DEFAULT_STATUS = {
    "UNAUTHORIZED": 401,
    "ACCESS_DENIED": 403,
    "MISSING_AUTHENTICATION_TOKEN": 403,
    "THROTTLED": 429,
    "INVALID_API_KEY": 403,
    "BAD_REQUEST_BODY": 400,
    "REQUEST_TOO_LARGE": 413,
    "AUTHORIZER_FAILURE": 500,
    "AUTHORIZER_CONFIGURATION_ERROR": 500,
    "INTEGRATION_FAILURE": 504,
    "INTEGRATION_TIMEOUT": 504,
}
# API Gateway bills every request it receives except those it refuses for their authorization or API
# key, or throttles (a 429 from the integration is billed: the integration ran).
UNBILLED_RESPONSES = frozenset(
    {"UNAUTHORIZED", "ACCESS_DENIED", "INVALID_API_KEY", "MISSING_AUTHENTICATION_TOKEN", "THROTTLED"}
)
DEFAULT_MESSAGE = {
    "UNAUTHORIZED": "Unauthorized",
    "ACCESS_DENIED": "User is not authorized to access this resource with an explicit deny",
    "MISSING_AUTHENTICATION_TOKEN": "Missing Authentication Token",
    "THROTTLED": "Too Many Requests",
    "INVALID_API_KEY": "Forbidden",
    "BAD_REQUEST_BODY": "Invalid request body",
    "REQUEST_TOO_LARGE": "Request Too Long",
    "AUTHORIZER_FAILURE": "Internal server error",
    "AUTHORIZER_CONFIGURATION_ERROR": "Internal server error",
    "INTEGRATION_FAILURE": "Internal server error",
}


class GatewayError(Exception):
    """An answer of the gateway itself; ``status``: the answer's status where the template's gateway
    response sets none (a protocol error's own, else the response type's default)."""

    def __init__(
        self,
        response_type: str,
        message: str | None = None,
        validation: str = "",
        *,
        status: int | None = None,
    ) -> None:
        super().__init__(response_type)
        self.response_type = response_type
        self.message = message or DEFAULT_MESSAGE.get(response_type, "Error")
        self.validation = validation
        self.status = status


def bad_request(message: str, status: int = 400) -> GatewayError:
    """A request API Gateway cannot read (its framing or its headers): DEFAULT_4XX's body."""
    return GatewayError("DEFAULT_4XX", message, status=status)


def render_gateway_response(
    responses: dict[str, dict[str, Any]], error: GatewayError, request_id: str
) -> tuple[int, dict[str, str], bytes]:
    """The answer of the template's gateway response for ``error`` (its type's, else its family's)."""
    default_status = error.status or DEFAULT_STATUS.get(error.response_type, 500)
    family = "DEFAULT_5XX" if default_status >= 500 else "DEFAULT_4XX"
    configured = responses.get(error.response_type) or responses.get(family) or {}
    status = configured.get("status") or default_status
    template = configured.get("template")
    if template:
        body = (
            template.replace("$context.error.messageString", json.dumps(error.message))
            .replace("$context.error.message", error.message)
            # Escaped as a JSON string's content (API Gateway escapes its quotes): the validator's
            # messages quote what the client sent, backslashes and control characters included.
            .replace("$context.error.validationErrorString", json.dumps(error.validation)[1:-1])
            .replace("$context.error.responseType", error.response_type)
            .replace("$context.requestId", request_id)
        )
    else:
        body = json.dumps({"message": error.message})
    headers = {"Content-Type": "application/json", "x-amzn-ErrorType": error.response_type}
    for name, value in (configured.get("headers") or {}).items():
        if name.startswith("gatewayresponse.header."):
            headers[name.removeprefix("gatewayresponse.header.")] = str(value).strip("'")
    return int(status), headers, body.encode()
