"""The API's OpenAPI 3.0 document, built from what the stack itself is built from.

- The routes: ``POST /v1/messages`` always, ``POST /v1/ordered`` and ``POST /v1/events`` when the
  config enables their workloads, as ``Breakwater`` adds them.
- Each request body: the JSON schema the stack gives API Gateway as the route's model
  (``breakwater_cdk.request_schemas``, generated from the request models), under the model's name.
- The answers: the services' bodies, and every refusal or failure as one problem details object
  (RFC 9457, ``application/problem+json``, ``breakwater.errors.problem``) whether a handler or the
  gateway (the stack's gateway responses) answers it, with the ``Retry-After`` header a refusal to
  come back later carries.
- The security scheme: the tenant's API key, ``Authorization: Bearer <tenant>.<secret>``; and the
  ``Idempotency-Key`` header ``POST /v1/messages`` takes (``breakwater.request_keys``).

OpenAPI 3.0, not 3.1: API Gateway validates bodies with JSON Schema draft 4, which is how OpenAPI
3.0 schemas are read (``2.0`` is not an ``integer`` there, as it is in 3.1's dialect), and 3.0 is what
API Gateway imports and exports. A model's ``["string", "null"]`` is written ``nullable`` here.

``make openapi`` writes it for cdk.json's configuration to ``docs/openapi.json``. A test keeps that
file equal to what this module builds, its operations equal to the synthesized template's API
methods and each body schema equal to the template's model.
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_cdk import aws_apigateway as apigw

from breakwater import __version__
from breakwater.errors import (
    PROBLEM_MEDIA_TYPE,
    PROBLEM_TYPE_BASE,
    ApiError,
    BadRequestError,
    IdempotencyConflictError,
    IdempotencyKeyReusedError,
    PayloadTooLargeError,
    ThrottledError,
    UnauthenticatedError,
    UnavailableError,
    UnsupportedMediaTypeError,
)
from breakwater.request_keys import HEADER as IDEMPOTENCY_HEADER
from breakwater.requests import (
    JSON_MEDIA_TYPE,
    MAX_JSON_DEPTH,
    MAX_KEY_LENGTH,
    MAX_SQS_ID_LENGTH,
    SQS_ID_PATTERN,
)
from breakwater_cdk.config import BlueprintConfig
from breakwater_cdk.ingress import STAGE_NAME
from breakwater_cdk.request_schemas import events_schema, message_schema, ordered_message_schema

OPENAPI_VERSION = "3.0.3"
ORDERED_KEY_PARAMETER = "OrderedIdempotencyKey"
ROOT = Path(__file__).resolve().parent.parent
DOCUMENT = ROOT / "docs" / "openapi.json"
SECURITY_SCHEME = "TenantKey"

# JSON Schema keywords whose Python names are not the camelCase of the keyword.
_KEYWORDS = {"schema": "$schema", "ref": "$ref", "not_": "not"}
_SCHEMA_PROPERTIES = [name for name, value in vars(apigw.JsonSchema).items() if isinstance(value, property)]


@dataclass(frozen=True)
class Route:
    """One method of the API, as the document describes it."""

    path: str
    method: str
    operation_id: str
    summary: str
    description: str
    model_name: str  # the API Gateway model of the body, and its schema's name here
    body: apigw.JsonSchema
    responses: dict[str, Any]
    parameters: tuple[dict[str, Any], ...] = ()


def routes(config: BlueprintConfig) -> list[Route]:
    """The API's methods for ``config``, in the order the stack adds them."""
    found = [
        Route(
            path="/v1/messages",
            method="post",
            operation_id="postMessage",
            summary="Enqueue a message for the tenant's workers",
            description=(
                "Validates the message, admits it against the tenant's rate, routes it to the "
                "shortest of the tenant's shuffle-sharded queues and answers once it is stored. "
                f"`payload` is any JSON value of at most {config.ingest.max_payload_bytes} bytes as "
                "compact JSON. Strings may not hold U+FFFE or U+FFFF (SQS cannot carry them). "
                f"A request with an `{IDEMPOTENCY_HEADER}` (or a `dedup_key`, the same key) is stored "
                f"once per tenant and key for {config.ingest.idempotency_window_seconds} s: sent again, "
                "it is answered with the original id; the key with another request is a 422."
            ),
            model_name="Message",
            body=message_schema(config),
            responses={
                **_message_responses("Accepted", replays=True),
                _status(IdempotencyConflictError): _answer(
                    "A request with the same key is still being stored: send it again after Retry-After.",
                    retry_after=True,
                ),
                _status(IdempotencyKeyReusedError): _answer(
                    "The key was used for a different request within its window: use a new key."
                ),
            },
            parameters=(_ref("parameters", IDEMPOTENCY_HEADER),),
        )
    ]
    if config.ordered.enabled:
        found.append(
            Route(
                path="/v1/ordered",
                method="post",
                operation_id="postOrderedMessage",
                summary="Enqueue a message processed in order within its ordering key",
                description=(
                    "Sent to a FIFO queue in the message group `<tenant>:<ordering_key>`, deduplicated "
                    "by `dedup_key` (else the message's id). A group holding its limit of messages "
                    "accepted and not yet processed is refused with 429 `group_backlog_full`. Strings "
                    "may not hold U+FFFE or U+FFFF (SQS cannot carry them). An "
                    f"`{IDEMPOTENCY_HEADER}` is the message's `dedup_key`."
                ),
                model_name="OrderedMessage",
                body=ordered_message_schema(config),
                responses=_message_responses("AcceptedOrdered"),
                parameters=(_ref("parameters", ORDERED_KEY_PARAMETER),),
            )
        )
    if config.streaming.enabled:
        found.append(
            Route(
                path="/v1/events",
                method="post",
                operation_id="postEvents",
                summary="Write one event or a batch to the tenant's stream",
                description=(
                    'One event, or `{"events": [...]}` of at most '
                    f"{config.streaming.max_events_per_request}, admitted against the tenant's event "
                    "rate and written to the stream. 202: all written; 207: some were not (the "
                    "results say which; resend those); 429 or 503: none were."
                ),
                model_name="Events",
                body=events_schema(config),
                responses=_events_responses(),
            )
        )
    return found


def build_document(config: BlueprintConfig) -> dict[str, Any]:
    """The OpenAPI document of the API the stack builds for ``config``."""
    api_routes = routes(config)
    paths: dict[str, dict[str, Any]] = {}
    for route in api_routes:
        paths.setdefault(route.path, {})[route.method] = {
            "operationId": route.operation_id,
            "summary": route.summary,
            "description": route.description,
            **({"parameters": list(route.parameters)} if route.parameters else {}),
            "requestBody": {
                "required": True,
                "content": {JSON_MEDIA_TYPE: {"schema": _ref("schemas", route.model_name)}},
            },
            "responses": route.responses,
        }
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": f"{config.service_name} API",
            "version": __version__,
            "description": _DESCRIPTION.format(depth=MAX_JSON_DEPTH, type_base=PROBLEM_TYPE_BASE),
        },
        "servers": [
            {
                "url": "https://{restApiId}.execute-api.{region}.amazonaws.com/" + STAGE_NAME,
                "variables": {
                    "restApiId": {"default": "restApiId", "description": "the stack's REST API id"},
                    "region": {"default": "us-east-1", "description": "the stack's region"},
                },
            }
        ],
        "security": [{SECURITY_SCHEME: []}],
        "paths": paths,
        "components": {
            "securitySchemes": {
                SECURITY_SCHEME: {
                    "type": "http",
                    "scheme": "bearer",
                    "bearerFormat": "<tenant>.<secret>",
                    "description": (
                        "The tenant's API key, issued by `bin/tenants add` (or `rotate`). The tenant "
                        "comes from the key, never from the body."
                    ),
                }
            },
            "schemas": {
                **{route.model_name: openapi_schema(json_schema(route.body)) for route in api_routes},
                **_ANSWER_SCHEMAS,
            },
            "responses": _SHARED_RESPONSES,
            "parameters": {
                IDEMPOTENCY_HEADER: {
                    "name": IDEMPOTENCY_HEADER,
                    "in": "header",
                    "required": False,
                    "description": (
                        "The client's key for this request (else the body's `dedup_key`; if both, the "
                        "same): a retry with it is answered with the original id and stores nothing."
                    ),
                    "schema": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_KEY_LENGTH,
                        "pattern": "^[ -~]*[!-~][ -~]*$",  # printable ASCII, not only spaces
                    },
                },
                ORDERED_KEY_PARAMETER: {
                    "name": IDEMPOTENCY_HEADER,
                    "in": "header",
                    "required": False,
                    "description": (
                        "The message's deduplication id in its FIFO queue (else the body's `dedup_key`; "
                        "if both, the same): printable ASCII without spaces, as SQS takes it."
                    ),
                    "schema": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_SQS_ID_LENGTH,
                        "pattern": SQS_ID_PATTERN,
                    },
                },
            },
            "headers": {
                "Retry-After": {
                    "description": "whole seconds to wait before sending again",
                    "required": True,
                    "schema": {"type": "string", "pattern": "^[0-9]+$"},
                }
            },
        },
    }


def json_schema(schema: apigw.JsonSchema) -> dict[str, Any]:
    """A CDK ``JsonSchema`` as the JSON Schema object it stands for (what the template's model holds).

    ``$schema`` is left out: within the document, schemas are in OpenAPI's own dialect.
    """
    found: dict[str, Any] = {}
    for name in _SCHEMA_PROPERTIES:
        value = getattr(schema, name)
        if value is None or name == "schema":
            continue
        found[_KEYWORDS.get(name, _camel(name))] = _schema_value(value)
    return found


def openapi_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A draft 4 JSON schema in OpenAPI 3.0's words: a type list holding ``null`` becomes ``nullable``."""
    found: dict[str, Any] = {}
    for keyword, value in schema.items():
        if keyword == "type" and isinstance(value, list):
            types = [kind for kind in value if kind != "null"]
            if len(types) != 1:
                raise ValueError(f"OpenAPI 3.0 has no schema for the types {value}")
            found["type"] = types[0]
            if "null" in value:
                found["nullable"] = True
        elif keyword in ("properties", "definitions", "patternProperties"):
            found[keyword] = {name: openapi_schema(item) for name, item in value.items()}
        elif keyword in ("items", "additionalProperties", "not") and isinstance(value, dict):
            found[keyword] = openapi_schema(value)
        elif keyword in ("oneOf", "anyOf", "allOf"):
            found[keyword] = [openapi_schema(item) for item in value]
        else:
            found[keyword] = value
    return found


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``make openapi``: write the document for cdk.json's configuration."""
    parser = argparse.ArgumentParser(description="write the API's OpenAPI document")
    parser.add_argument("--out", type=Path, default=DOCUMENT, help=f"default: {DOCUMENT.relative_to(ROOT)}")
    args = parser.parse_args(argv)
    from app import cdk_json_context  # the entry point reads cdk.json as the CDK CLI passes it
    from breakwater_cdk.config import CONTEXT_KEY, load_config

    config = load_config(cdk_json_context().get(CONTEXT_KEY))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(build_document(config)), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


# -- the answers -----------------------------------------------------------------------------------

_DESCRIPTION = """\
Tenant-authenticated ingest: every request carries the tenant's API key as a bearer token and a \
JSON body (`Content-Type: application/json`, UTF-8).

Every refusal is a 4xx, every failure a 5xx, and each one, whether a handler or the gateway \
answers it, is a problem details object (RFC 9457, `Content-Type: application/problem+json`, \
schema `Problem`): `type` (`{type_base}<code>`), `title`, `status`, `detail` naming what was \
wrong, and `code`, the stable machine code to branch on. Some problems carry more members: the \
gateway's `request_id`; `group`, `limit` and `backlog` of a full message group; the per-event \
`results` of an events request none of which was written. A method or path no route has is a 403 \
`no_route` (API Gateway's status for both). A 429 or 503 carries `Retry-After`; a 503 means \
nothing was stored and the request may be sent again.

A body is JSON as RFC 8259 has it: no `NaN` or `Infinity`, no field twice in one object, arrays \
and objects nested at most {depth} levels deep, every string valid Unicode. A body of another \
Content-Type is refused with 415.
"""

_PROBLEM = {
    "type": "object",
    "description": (
        "A refusal or failure, a handler's or the gateway's (RFC 9457 problem details). Clients "
        "branch on `code`; `detail` says what was wrong with this request."
    ),
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": {
            "type": "string",
            "minLength": 1,
            "description": "a URI naming the problem type: the base followed by `code`",
            "example": PROBLEM_TYPE_BASE + "invalid_field",
        },
        "title": {"type": "string", "minLength": 1, "description": "the problem type in words"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599, "description": "the HTTP status"},
        "detail": {"type": "string", "description": "what was wrong with this request"},
        "code": {"type": "string", "minLength": 1, "example": "invalid_field"},
        "request_id": {"type": "string", "description": "the gateway's request id (its own refusals)"},
        "group": {"type": "string", "description": "`group_backlog_full`: the message group"},
        "limit": {"type": "integer", "description": "`group_backlog_full`: the group's limit"},
        "backlog": {"type": "integer", "description": "`group_backlog_full`: the group's backlog"},
    },
}
_ANSWER_SCHEMAS: dict[str, Any] = {
    "Accepted": {
        "type": "object",
        "required": ["id", "queue"],
        "properties": {
            "id": {"type": "string", "minLength": 26, "maxLength": 26, "description": "the message's id"},
            "queue": {"type": "integer", "minimum": 0, "description": "the live queue it was stored in"},
        },
    },
    "AcceptedOrdered": {
        "type": "object",
        "required": ["id", "ordering_key", "dedup_id"],
        "properties": {
            "id": {"type": "string", "minLength": 26, "maxLength": 26, "description": "the message's id"},
            "ordering_key": {"type": "string"},
            "dedup_id": {"type": "string", "description": "the MessageDeduplicationId it was sent with"},
        },
    },
    "EventsResult": {
        "type": "object",
        "required": ["written", "failed", "results"],
        "properties": {
            "written": {"type": "integer", "minimum": 0},
            "failed": {"type": "integer", "minimum": 0},
            "results": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", "id", "status"],
                    "properties": {
                        "index": {"type": "integer", "minimum": 0},
                        "id": {"type": "string"},
                        "status": {"type": "string", "enum": ["written", "throttled", "failed"]},
                        "error": {"type": "string", "description": "why it was not written"},
                    },
                },
            },
        },
    },
    "Problem": _PROBLEM,
    # An events request none of whose events was written: the problem with the per-event results.
    "EventsProblem": {
        "allOf": [{"$ref": "#/components/schemas/Problem"}, {"$ref": "#/components/schemas/EventsResult"}]
    },
}


def _ref(kind: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{kind}/{name}"}


def _answer(
    description: str, *schemas: str, problem: bool = True, retry_after: bool = False
) -> dict[str, Any]:
    """An answer whose body is one of ``schemas``: a problem (a 4xx or 5xx), else JSON."""
    refs: list[dict[str, Any]] = [_ref("schemas", name) for name in schemas or ("Problem",)]
    media_type = PROBLEM_MEDIA_TYPE if problem else JSON_MEDIA_TYPE
    answer: dict[str, Any] = {
        "description": description,
        "content": {media_type: {"schema": refs[0] if len(refs) == 1 else {"anyOf": refs}}},
    }
    if retry_after:
        answer["headers"] = {"Retry-After": _ref("headers", "Retry-After")}
    return answer


def _status(error: type[ApiError]) -> str:
    return str(error.status)


_SHARED_RESPONSES: dict[str, Any] = {
    "BadRequest": _answer(
        "The body is not JSON, not an object, or breaks the route's schema; the code and detail say how."
    ),
    "Unauthorized": _answer("No API key, a malformed one, or one that is not (or no longer) the tenant's."),
    "Forbidden": _answer(
        "The tenant is disabled (`forbidden`), its key is in no usage plan (`not_enrolled`), or no route "
        "has the method and path (`no_route`)."
    ),
    "PayloadTooLarge": _answer("The body, or a payload in it, is over its limit."),
    "UnsupportedMediaType": _answer(f"The body is not declared `{JSON_MEDIA_TYPE}` (UTF-8)."),
    "Throttled": _answer(
        "Over the tenant's rate (its edge throttle or its admission), or, on /v1/ordered, its message "
        "group's backlog limit (`group_backlog_full`): send again after Retry-After.",
        retry_after=True,
    ),
    "Unavailable": _answer(
        "The message could not be stored (`enqueue_failed`), or the tenant's key could not be checked "
        "(`unavailable`); nothing was stored: send it again after Retry-After.",
        retry_after=True,
    ),
}


def _refusals() -> dict[str, Any]:
    return {
        _status(BadRequestError): _ref("responses", "BadRequest"),
        _status(UnauthenticatedError): _ref("responses", "Unauthorized"),
        "403": _ref("responses", "Forbidden"),  # the gateway's alone
        _status(PayloadTooLargeError): _ref("responses", "PayloadTooLarge"),
        _status(UnsupportedMediaTypeError): _ref("responses", "UnsupportedMediaType"),
    }


def _message_responses(accepted: str, *, replays: bool = False) -> dict[str, Any]:
    stored = _answer("Stored: it will be processed.", accepted, problem=False)
    if replays:
        stored["headers"] = {
            "Idempotent-Replayed": {
                "description": "`true`: the original answer to an earlier request with this key; "
                "nothing was stored again",
                "schema": {"type": "string", "enum": ["true"]},
            }
        }
    return {
        "202": stored,
        **_refusals(),
        _status(ThrottledError): _ref("responses", "Throttled"),
        _status(UnavailableError): _ref("responses", "Unavailable"),
    }


def _events_responses() -> dict[str, Any]:
    return {
        "202": _answer("Every event was written.", "EventsResult", problem=False),
        "207": _answer(
            "Some events were written; the results say which were not.", "EventsResult", problem=False
        ),
        **_refusals(),
        _status(ThrottledError): _answer(
            "None written: over the tenant's event rate or the stream's throughput (`throttled`, with "
            "the per-event results), or over its edge throttle.",
            "EventsProblem",
            "Problem",
            retry_after=True,
        ),
        _status(UnavailableError): _answer(
            "None written: the stream failed (`write_failed`, with the per-event results), or the "
            "tenant's key could not be checked; send them again.",
            "EventsProblem",
            "Problem",
            retry_after=True,
        ),
    }


# -- helpers ---------------------------------------------------------------------------------------


def _schema_value(value: Any) -> Any:
    if isinstance(value, apigw.JsonSchema):
        return json_schema(value)
    if isinstance(value, enum.Enum):
        return str(value.value).lower()  # JsonSchemaType.STRING is "string" in a schema
    if isinstance(value, list):
        return [_schema_value(item) for item in value]
    if isinstance(value, dict):
        return {key: _schema_value(item) for key, item in value.items()}
    return value


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


if __name__ == "__main__":
    sys.exit(main())
