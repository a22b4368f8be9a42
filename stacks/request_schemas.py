"""JSON schemas (draft 4) API Gateway checks request bodies against before they cost an invocation.

Each mirrors its request model in ``functions/breakwater/requests.py`` (``extra="forbid"``: the tenant
never comes from the body); the handler still validates, so a schema may be looser than its model but
never stricter.
"""

from __future__ import annotations

from aws_cdk import aws_apigateway as apigw

from stacks.config import BlueprintConfig

_STRING = apigw.JsonSchemaType.STRING
_INTEGER = apigw.JsonSchemaType.INTEGER
_OBJECT = apigw.JsonSchemaType.OBJECT
# SQS MessageGroupId / MessageDeduplicationId characters (functions/breakwater/requests.py SQS_ID_PATTERN).
_SQS_ID_PATTERN = "^[!-~]+$"
_MAX_ORDERING_KEY = 63  # so that tenant (<= 64) + ":" + key fits SQS's 128 (MAX_ORDERING_KEY_LENGTH)
_MAX_SQS_ID = 128


def message_schema(config: BlueprintConfig) -> apigw.JsonSchema:
    """The body of POST /v1/messages (``MessageRequest``)."""
    return apigw.JsonSchema(
        schema=apigw.JsonSchemaVersion.DRAFT4,
        title="Message",
        type=_OBJECT,
        required=["type"],
        additional_properties=False,
        properties={
            "type": apigw.JsonSchema(type=_STRING),
            "payload": apigw.JsonSchema(description="any JSON value"),
            "dedup_key": apigw.JsonSchema(type=_STRING),
            "ordering_key": apigw.JsonSchema(type=_STRING),
            "ttl_seconds": _ttl(config),
        },
    )


def ordered_message_schema(config: BlueprintConfig) -> apigw.JsonSchema:
    """The body of POST /v1/ordered (``OrderedMessageRequest``): the ordering key is required and bounded."""
    return apigw.JsonSchema(
        schema=apigw.JsonSchemaVersion.DRAFT4,
        title="OrderedMessage",
        type=_OBJECT,
        required=["type", "ordering_key"],
        additional_properties=False,
        properties={
            "type": apigw.JsonSchema(type=_STRING, min_length=1, max_length=128),
            "payload": apigw.JsonSchema(description="any JSON value"),
            "ordering_key": apigw.JsonSchema(
                type=_STRING, min_length=1, max_length=_MAX_ORDERING_KEY, pattern=_SQS_ID_PATTERN
            ),
            "dedup_key": apigw.JsonSchema(
                type=_STRING, min_length=1, max_length=_MAX_SQS_ID, pattern=_SQS_ID_PATTERN
            ),
            "ttl_seconds": _ttl(config),
        },
    )


def events_schema(config: BlueprintConfig) -> apigw.JsonSchema:
    """The body of POST /v1/events: one event (``EventIn``) or ``{"events": [...]}`` of at most the configured
    number. Per-event byte limits stay with the handler, which answers them per event."""
    event = apigw.JsonSchema(
        type=_OBJECT,
        required=["type"],
        additional_properties=False,
        properties={
            "type": apigw.JsonSchema(type=_STRING, min_length=1, max_length=128),
            "key": apigw.JsonSchema(type=_STRING, min_length=1, max_length=128),
            "value": apigw.JsonSchema(type=apigw.JsonSchemaType.NUMBER),
            "payload": apigw.JsonSchema(description="any JSON value"),
            "occurred_at": apigw.JsonSchema(type=_INTEGER, minimum=0, description="epoch ms"),
        },
    )
    batch = apigw.JsonSchema(
        type=_OBJECT,
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


def _ttl(config: BlueprintConfig) -> apigw.JsonSchema:
    return apigw.JsonSchema(type=_INTEGER, minimum=1, maximum=config.ingest.max_ttl_seconds)
