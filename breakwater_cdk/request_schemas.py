"""JSON schemas (draft 4) API Gateway checks request bodies against before they cost an invocation.

Each is generated from the request model the handler validates with (``breakwater.requests``), so
the two cannot drift: the same fields, the same required ones, the same length, pattern and range
limits, no other fields (the tenant never comes from the body). Where a limit comes from the config
(the longest ``ttl_seconds``, the most events per request) the schema carries it too. An optional
field may be ``null``, as the model allows.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import aws_apigateway as apigw
from pydantic import BaseModel

from breakwater.requests import EventIn, MessageRequest, OrderedMessageRequest
from breakwater_cdk.config import BlueprintConfig

_TYPES = {
    "string": apigw.JsonSchemaType.STRING,
    "integer": apigw.JsonSchemaType.INTEGER,
    "number": apigw.JsonSchemaType.NUMBER,
    "boolean": apigw.JsonSchemaType.BOOLEAN,
    "null": apigw.JsonSchemaType.NULL,
    "array": apigw.JsonSchemaType.ARRAY,
    "object": apigw.JsonSchemaType.OBJECT,
}


def message_schema(config: BlueprintConfig) -> apigw.JsonSchema:
    """The body of POST /v1/messages."""
    return _object(MessageRequest, title="Message", maxima={"ttl_seconds": config.ingest.max_ttl_seconds})


def ordered_message_schema(config: BlueprintConfig) -> apigw.JsonSchema:
    """The body of POST /v1/ordered: the ordering key is required and bounded."""
    return _object(
        OrderedMessageRequest, title="OrderedMessage", maxima={"ttl_seconds": config.ingest.max_ttl_seconds}
    )


def events_schema(config: BlueprintConfig) -> apigw.JsonSchema:
    """The body of POST /v1/events: one event or ``{"events": [...]}`` of at most the configured number.

    The payload limit per event stays with the handler, which answers it naming the event."""
    event = _object(EventIn)
    batch = apigw.JsonSchema(
        type=apigw.JsonSchemaType.OBJECT,
        required=["events"],
        additional_properties=False,
        properties={
            "events": apigw.JsonSchema(
                type=apigw.JsonSchemaType.ARRAY,
                min_items=1,
                max_items=config.streaming.max_events_per_request,
                items=event,
            )
        },
    )
    return apigw.JsonSchema(schema=apigw.JsonSchemaVersion.DRAFT4, title="Events", one_of=[event, batch])


def _object(
    model: type[BaseModel], *, title: str | None = None, maxima: dict[str, int] | None = None
) -> apigw.JsonSchema:
    generated = model.model_json_schema()
    properties = {
        name: _property(spec, (maxima or {}).get(name)) for name, spec in generated["properties"].items()
    }
    return apigw.JsonSchema(
        schema=apigw.JsonSchemaVersion.DRAFT4 if title else None,
        title=title,
        type=apigw.JsonSchemaType.OBJECT,
        required=list(generated.get("required", [])),
        additional_properties=False,
        properties=properties,
    )


def _property(spec: dict[str, Any], maximum: int | None) -> apigw.JsonSchema:
    branches = spec.get("anyOf", [spec])
    types = [branch["type"] for branch in branches if "type" in branch]
    if not types:
        return apigw.JsonSchema(description="any JSON value")
    (constraints,) = [branch for branch in branches if branch.get("type") != "null"]
    kinds = [_TYPES[kind] for kind in types]
    return apigw.JsonSchema(
        type=kinds[0] if len(kinds) == 1 else kinds,
        min_length=constraints.get("minLength"),
        max_length=constraints.get("maxLength"),
        pattern=constraints.get("pattern"),
        minimum=constraints.get("minimum"),
        maximum=maximum if maximum is not None else constraints.get("maximum"),
        description=spec.get("description"),
    )
