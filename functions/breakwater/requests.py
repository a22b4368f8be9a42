"""One request model per route and one parser that turns a bad body into a 400/413 naming the problem.

The limits mean one thing on every route:

- ``max_payload_bytes``: the size of one ``payload`` as compact JSON (what the envelope carries), per
  message on ``/v1/messages`` and ``/v1/ordered`` and per event on ``/v1/events``;
- ``max_ttl_seconds``: the largest ``ttl_seconds`` a message may ask for;
- ``max_events``: the most events one ``/v1/events`` request may hold.

A body far larger than those limits allow is refused before it is parsed. A body is read only as
JSON (RFC 8259) and only when the request declares it JSON: UTF-8, no ``NaN`` or ``Infinity``, no
field twice in one object, arrays and objects nested at most ``MAX_JSON_DEPTH`` deep, every string
valid Unicode. API Gateway's body validation does not stand in for these checks: it applies only
when the Content-Type selects the route's model, and its JSON reader is not Python's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from annotated_types import MaxLen, MinLen
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError
from pydantic_core import ErrorDetails

from breakwater.envelope import payload_size
from breakwater.errors import BadRequestError, PayloadTooLargeError, UnsupportedMediaTypeError

MAX_KEY_LENGTH = 128
MAX_TENANT_LENGTH = 64  # as in the envelope
GROUP_SEPARATOR = ":"
MAX_SQS_ID_LENGTH = 128  # MessageGroupId and MessageDeduplicationId
MAX_ORDERING_KEY_LENGTH = MAX_SQS_ID_LENGTH - MAX_TENANT_LENGTH - len(GROUP_SEPARATOR)
# SQS accepts alphanumerics and punctuation (!"#$%&'()*+,-./:;<=>?@[\]^_`{|}~) in both ids.
SQS_ID_PATTERN = r"^[!-~]+$"
MAX_EVENTS_PER_REQUEST = 500  # also PutRecords' limit
BODY_OVERHEAD_BYTES = 4096  # room for the fields around the payloads before a body is refused unread
JSON_MEDIA_TYPE = "application/json"
# How deep arrays and objects may nest in a body (the body itself is level 1). A payload travels in an
# envelope that pydantic writes and the worker reads back, and both stop a few hundred levels deep: a
# deeper payload would fail on its way to the queue (a 5xx) or be unreadable for the worker (poison).
MAX_JSON_DEPTH = 64
# SQS refuses a message body holding either of these (its characters stop at U+FFFD in that plane),
# and the envelope carries non-ASCII characters as they are: such a message could never be stored.
SQS_REFUSED_CHARACTERS = ("\ufffe", "\uffff")


class MessageRequest(BaseModel):
    """The body of ``POST /v1/messages``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str = Field(min_length=1, max_length=MAX_KEY_LENGTH)
    payload: Any = None
    dedup_key: str | None = Field(default=None, min_length=1, max_length=MAX_KEY_LENGTH)
    ordering_key: str | None = Field(default=None, min_length=1, max_length=MAX_KEY_LENGTH)
    ttl_seconds: StrictInt | None = Field(default=None, ge=1)


class OrderedMessageRequest(BaseModel):
    """The body of ``POST /v1/ordered``: like a message, but the ordering key is required.

    The ordering key is bounded so that ``tenant:ordering_key`` always fits SQS's 128 characters.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str = Field(min_length=1, max_length=MAX_KEY_LENGTH)
    payload: Any = None
    ordering_key: str = Field(min_length=1, max_length=MAX_ORDERING_KEY_LENGTH, pattern=SQS_ID_PATTERN)
    dedup_key: str | None = Field(
        default=None, min_length=1, max_length=MAX_SQS_ID_LENGTH, pattern=SQS_ID_PATTERN
    )
    ttl_seconds: StrictInt | None = Field(default=None, ge=1)


class EventIn(BaseModel):
    """One event of ``POST /v1/events``. ``value`` is what the consumer sums (1 when absent: a count)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str = Field(min_length=1, max_length=MAX_KEY_LENGTH)
    key: str | None = Field(default=None, min_length=1, max_length=MAX_KEY_LENGTH)
    value: float = Field(default=1.0, allow_inf_nan=False)
    payload: Any = None
    occurred_at: StrictInt | None = Field(default=None, ge=0, description="epoch ms, the client's clock")


class EventsBatch(BaseModel):
    """The batch form of ``POST /v1/events``: ``{"events": [...]}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    events: list[EventIn] = Field(min_length=1)


@dataclass(frozen=True)
class RequestLimits:
    max_payload_bytes: int
    max_ttl_seconds: int = 0  # 0: the route takes no ttl_seconds
    max_events: int = 1

    @property
    def max_body_bytes(self) -> int:
        """A body larger than this cannot hold valid payloads: refused before it is parsed."""
        return self.max_events * (self.max_payload_bytes + BODY_OVERHEAD_BYTES)


Model = TypeVar("Model", bound=BaseModel)


def parse_message(model: type[Model], raw_body: bytes | None, limits: RequestLimits) -> Model:
    """A ``/v1/messages`` or ``/v1/ordered`` body as ``model``, or the 400/413 that names the problem."""
    body = _json_object(raw_body, limits, refused_characters=SQS_REFUSED_CHARACTERS)
    request = _validate(model, body, limits)
    ttl = getattr(request, "ttl_seconds", None)
    if ttl is not None and ttl > limits.max_ttl_seconds:
        raise BadRequestError(_ttl_message(limits, ttl), code="invalid_field")
    _check_payload(getattr(request, "payload", None), "payload", limits)
    return request


def parse_events(raw_body: bytes | None, limits: RequestLimits) -> list[EventIn]:
    """One event (an object with ``type``) or a batch ``{"events": [...]}`` of at most ``max_events``."""
    body = _json_object(raw_body, limits)
    if "events" in body:
        events = body["events"]
        if isinstance(events, list) and len(events) > limits.max_events:
            raise BadRequestError(
                f"at most {limits.max_events} events per request, got {len(events)}", code="too_many_events"
            )
        parsed = list(_validate(EventsBatch, body, limits).events)
        for index, event in enumerate(parsed):
            _check_payload(event.payload, f"events[{index}].payload", limits)
        return parsed
    event = _validate(EventIn, body, limits)
    _check_payload(event.payload, "payload", limits)
    return [event]


def require_json(headers: Mapping[str, str] | None) -> None:
    """A 415 naming what was sent unless the request declares its body ``application/json`` (UTF-8).

    A body of another declared type is not checked against the route's JSON model by API Gateway,
    and is never parsed as JSON on a guess here.
    """
    declared = next(
        (value for name, value in (headers or {}).items() if name.lower() == "content-type"), None
    )
    if declared is None:
        raise UnsupportedMediaTypeError(f"Content-Type header is missing; send {JSON_MEDIA_TYPE}")
    media_type, *parameters = declared.split(";")
    if media_type.strip().lower() != JSON_MEDIA_TYPE:
        raise UnsupportedMediaTypeError(
            f"Content-Type is {json.dumps(declared[:100])}; send {JSON_MEDIA_TYPE}"
        )
    for parameter in parameters:
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            raise UnsupportedMediaTypeError(
                f"charset is {json.dumps(value.strip()[:40])}; JSON bodies are UTF-8 ({JSON_MEDIA_TYPE})"
            )


def json_type(value: Any) -> str:
    """The JSON name of a value's type, for messages that say what the client sent."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _json_object(
    raw_body: bytes | None, limits: RequestLimits, *, refused_characters: tuple[str, ...] = ()
) -> dict[str, Any]:
    if not raw_body:
        raise BadRequestError(
            "request body is empty; expected a JSON object with at least 'type'", code="invalid_json"
        )
    if len(raw_body) > limits.max_body_bytes:
        raise PayloadTooLargeError(
            f"request body is {len(raw_body)} bytes; no valid request is larger than "
            f"{limits.max_body_bytes} bytes (payloads are limited to {limits.max_payload_bytes} bytes)"
        )
    body = _parse_json(raw_body, refused_characters)
    if not isinstance(body, dict):
        raise BadRequestError(
            f"request body must be a JSON object, got {json_type(body)}", code="invalid_json"
        )
    if "tenant" in body:
        raise BadRequestError(
            "field 'tenant' is not allowed: the tenant comes from your API key, never from the body",
            code="tenant_in_body",
        )
    return body


class _NotJsonError(ValueError):
    """Raised from inside the JSON reader: a body it could read, but that is not JSON as RFC 8259 has it."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


def _parse_json(raw_body: bytes, refused_characters: tuple[str, ...]) -> Any:
    """The body as JSON, or the 400 that says which rule it breaks (see the module's docstring)."""
    try:
        text = raw_body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequestError(
            f"request body is not valid JSON: not UTF-8 "
            f"(byte {raw_body[exc.start]:#04x} at offset {exc.start})",
            code="invalid_json",
        ) from None
    try:
        body = json.loads(text, object_pairs_hook=_without_duplicates, parse_constant=_no_constants)
    except _NotJsonError as exc:
        raise BadRequestError(str(exc), code=exc.code) from None
    except RecursionError:  # nested far deeper than MAX_JSON_DEPTH
        raise BadRequestError(_too_deep(), code="too_deep") from None
    except json.JSONDecodeError as exc:
        raise BadRequestError(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    except ValueError:  # an integer longer than Python reads (sys.get_int_max_str_digits)
        raise BadRequestError(
            "request body is not valid JSON: a number with too many digits", code="invalid_json"
        ) from None
    _check_depth(body)
    try:
        # A \ud800-\udfff escape outside a surrogate pair reads as a string no UTF-8 writer can write.
        text = json.dumps(body, ensure_ascii=False)
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequestError(
            "request body holds a string that is not valid Unicode (a \\u escape of half a surrogate pair)",
            code="invalid_json",
        ) from None
    for character in refused_characters:
        if character in text:
            raise BadRequestError(
                f"request body holds U+{ord(character):04X}, a character SQS cannot carry in a message",
                code="unsupported_character",
            )
    return body


def _without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """One JSON object; a field given twice is refused: readers disagree on which value wins."""
    fields = dict(pairs)
    if len(fields) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise _NotJsonError(
                    f"field {json.dumps(name)[:64]} appears more than once in one object", "duplicate_field"
                )
            seen.add(name)
    return fields


def _no_constants(name: str) -> Any:
    raise _NotJsonError(f"request body is not valid JSON: {name} is not a JSON number", "invalid_json")


def _check_depth(body: Any) -> None:
    """Arrays and objects at most MAX_JSON_DEPTH deep, walked level by level (no recursion)."""
    level = [body] if isinstance(body, dict | list) else []
    depth = 0
    while level:
        depth += 1
        if depth > MAX_JSON_DEPTH:
            raise BadRequestError(_too_deep(), code="too_deep")
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, dict | list)
        ]


def _too_deep() -> str:
    return f"request body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep"


def _check_payload(payload: Any, name: str, limits: RequestLimits) -> None:
    size = payload_size(payload)
    if size > limits.max_payload_bytes:
        raise PayloadTooLargeError(
            f"field '{name}' is {size} bytes as compact JSON; the limit is {limits.max_payload_bytes} bytes"
        )


def _validate(model: type[Model], body: dict[str, Any], limits: RequestLimits) -> Model:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        code = "unknown_field" if first["type"] == "extra_forbidden" else "invalid_field"
        raise BadRequestError(_describe(model, first, limits), code=code) from None


def _describe(model: type[BaseModel], error: ErrorDetails, limits: RequestLimits) -> str:
    """One pydantic error in the client's terms: the field's path, what it must be, what it got."""
    loc = error["loc"]
    path = _path(loc)
    kind, value = error["type"], error.get("input")
    if kind == "missing":
        return f"field '{path}' is required"
    if kind == "extra_forbidden":
        owner = _model_at(model, loc[:-1])
        return f"unknown field '{path}'; allowed fields: {', '.join(owner.model_fields)}"
    if kind == "string_type":
        return f"field '{path}' must be a string, got {json_type(value)}"
    if kind in ("string_too_short", "string_too_long"):
        low, high = _length_bounds(_model_at(model, loc[:-1]), str(loc[-1]))
        return f"field '{path}' must be {low} to {high} characters, got {len(str(value))}"
    if kind == "string_pattern_mismatch":
        return f"field '{path}' must be printable ASCII without spaces, got {json.dumps(value)}"
    if loc and loc[-1] == "ttl_seconds":
        return _ttl_message(limits, value)
    return f"field '{path}': {error['msg']}, got {json.dumps(value)[:64]}"


def _path(loc: Sequence[int | str]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(body)"


def _model_at(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel]:
    """The model that owns the field at ``loc`` (``events[2].type`` is owned by :class:`EventIn`)."""
    current = model
    for part in loc:
        if isinstance(part, int):
            continue
        annotation = current.model_fields[part].annotation
        inner = getattr(annotation, "__args__", (annotation,))[0]
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            current = inner
    return current


def _length_bounds(model: type[BaseModel], field: str) -> tuple[int, int]:
    low, high = 0, 0
    for meta in model.model_fields[field].metadata:
        if isinstance(meta, MinLen):
            low = meta.min_length
        if isinstance(meta, MaxLen):
            high = meta.max_length
    return low, high


def _ttl_message(limits: RequestLimits, ttl: Any) -> str:
    return f"field 'ttl_seconds' must be an integer from 1 to {limits.max_ttl_seconds}, got {json.dumps(ttl)}"
