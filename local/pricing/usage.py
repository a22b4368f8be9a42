"""What AWS bills for each API request, counted at the botocore level: :class:`UsageMeter`.

Each request is priced the way its service bills it, not as one request: SQS per 64 KB chunk of the
request's payload (a batch of ten small messages is one), DynamoDB in read and write request units
from the size of each item read or written (twice for a transaction), Kinesis in PUT payload units
(25 KB) and ingested kilobytes, S3 in its PUT and GET classes, CloudWatch per metrics API request.
The units are keys of ``prices.json`` beside this file; :mod:`local.pricing.cost` prices them.

DynamoDB returns ``ConsumedCapacity`` when asked; moto answers it with a constant per operation (1
for any PutItem, 0.5 for any GetItem, nothing for UpdateItem or TransactWriteItems), so the units
come from the item sizes by DynamoDB's own rules (:func:`item_size`), and ``reported_capacity=True``
(against AWS itself) asks for the totals and takes them instead. An UpdateItem's units come from its
key and new values (AWS bills the larger of the item before and after: a large item updated in a
small way is undercounted). Writes to a global secondary index are not counted.

A request botocore gives up on (throttled, or failed with a 5xx) costs nothing; one AWS refused for
a failed condition still consumes its write units. Retries inside botocore are not counted apart.

The meter also times the calls a function's main thread makes (``measured.aws_call_ms``, and
``measured.aws_calls.<service>`` counts them): the emulator's round trips are not AWS's, and the
function pools bill Lambda duration with AWS's latencies in their place
(:func:`modelled_duration_ms`). ``measured.*`` units are reported, never priced.

Only the standard library: the function containers load this file by its path (their ``sys.path``
holds the function's code, not this repository).
"""

from __future__ import annotations

import base64
import json
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

SQS_CHUNK_BYTES = 64 * 1024
KINESIS_PUT_UNIT_BYTES = 25 * 1024
WRITE_UNIT_BYTES = 1024
READ_UNIT_BYTES = 4096
# Lambda writes START, END and REPORT lines to the function's log group for every invocation.
LAMBDA_PLATFORM_LOG_BYTES = 280

S3_PUT_CLASS = frozenset(
    {
        "PutObject",
        "CopyObject",
        "PostObject",
        "ListObjects",
        "ListObjectsV2",
        "ListObjectVersions",
        "ListBuckets",
        "ListMultipartUploads",
        "CreateMultipartUpload",
        "UploadPart",
        "UploadPartCopy",
        "CompleteMultipartUpload",
        "PutObjectTagging",
    }
)
S3_FREE = frozenset({"DeleteObject", "DeleteObjects", "AbortMultipartUpload"})
CLOUDWATCH_METRIC_CALLS = frozenset({"PutMetricData", "GetMetricData", "GetMetricStatistics", "ListMetrics"})
DYNAMODB_READS = frozenset({"GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems"})
DYNAMODB_WRITES = frozenset(
    {"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems", "ExecuteStatement"}
)
# AWS consumes the units of a write refused by its condition (and of a cancelled transaction).
JSON_SERVICES = frozenset({"sqs", "dynamodb", "kinesis"})  # whose requests and answers are read here
CHARGED_ERRORS = frozenset({"ConditionalCheckFailedException", "TransactionCanceledException"})


def add_to(total: dict[str, float], usage: dict[str, float]) -> None:
    """Add ``usage`` into ``total``, unit by unit."""
    for unit, quantity in usage.items():
        total[unit] = total.get(unit, 0.0) + quantity


def less(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """What was counted between two snapshots (units that did not grow are left out)."""
    return {unit: q - before.get(unit, 0.0) for unit, q in after.items() if q - before.get(unit, 0.0) > 0}


def sqs_chunks(payload_bytes: int) -> int:
    """SQS requests billed for one API request carrying ``payload_bytes``: one per 64 KB, at least one."""
    return max(1, math.ceil(payload_bytes / SQS_CHUNK_BYTES))


def write_units(item_bytes: int, *, transactional: bool = False) -> int:
    """DynamoDB write request units for one item: 1 per KB (rounded up), 2 per KB in a transaction."""
    units = max(1, math.ceil(item_bytes / WRITE_UNIT_BYTES))
    return 2 * units if transactional else units


def read_units(item_bytes: int, *, consistent: bool = False, transactional: bool = False) -> float:
    """DynamoDB read request units for ``item_bytes`` read at once: per 4 KB (rounded up), 1 strongly
    consistent, 0.5 eventually consistent, 2 in a transaction."""
    units = max(1, math.ceil(item_bytes / READ_UNIT_BYTES))
    if transactional:
        return 2.0 * units
    return float(units) if consistent else units / 2


def kinesis_put_units(record_bytes: int) -> int:
    """Kinesis PUT payload units of one record (data and partition key): one per 25 KB, at least one."""
    return max(1, math.ceil(record_bytes / KINESIS_PUT_UNIT_BYTES))


def gb_seconds(duration_ms: float, memory_mb: int) -> float:
    """Lambda duration billed: rounded up to the millisecond, at the configured memory."""
    return math.ceil(max(0.0, duration_ms)) / 1000 * memory_mb / 1024


def _number_size(text: str) -> int:
    digits = text.lstrip("-").replace(".", "").lstrip("0").rstrip("0") or "0"
    return (len(digits) + 1) // 2 + 1


def value_size(value: dict[str, Any]) -> int:
    """The size DynamoDB counts for one attribute value in its wire form (``{"S": "..."}``)."""
    if not isinstance(value, dict) or len(value) != 1:
        return 0
    ((kind, inner),) = value.items()
    if kind == "S":
        return len(str(inner).encode("utf-8"))
    if kind == "N":
        return _number_size(str(inner))
    if kind == "B":
        return _binary_size(inner)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(str(s).encode("utf-8")) for s in inner)
    if kind == "NS":
        return sum(_number_size(str(n)) for n in inner)
    if kind == "BS":
        return sum(_binary_size(b) for b in inner)
    if kind == "M":
        return 3 + sum(len(k.encode("utf-8")) + 1 + value_size(v) for k, v in inner.items())
    if kind == "L":
        return 3 + sum(1 + value_size(v) for v in inner)
    return 0


def _binary_size(inner: Any) -> int:
    if isinstance(inner, bytes | bytearray):
        return len(inner)
    try:
        return len(base64.b64decode(str(inner), validate=False))
    except ValueError:
        return len(str(inner))


def item_size(item: dict[str, Any] | None) -> int:
    """An item's size as DynamoDB bills it: each attribute's name (UTF-8) plus its value."""
    return sum(len(name.encode("utf-8")) + value_size(value) for name, value in (item or {}).items())


def update_size(request: dict[str, Any]) -> int:
    """What an UpdateItem writes, as far as the request shows it: its key and the values it sets."""
    names = request.get("ExpressionAttributeNames") or {}
    values = request.get("ExpressionAttributeValues") or {}
    return (
        item_size(request.get("Key"))
        + sum(value_size(v) for v in values.values())
        + sum(len(str(n).encode("utf-8")) for n in names.values())
    )


def _json(data: Any) -> dict[str, Any]:
    if isinstance(data, bytes | bytearray):
        data = data.decode("utf-8", errors="replace")
    if not isinstance(data, str) or not data:
        return {}
    try:
        loaded = json.loads(data)
    except ValueError:
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _sqs_message_bytes(message: dict[str, Any]) -> int:
    size = len(str(message.get("MessageBody", message.get("Body", ""))).encode("utf-8"))
    for name, attribute in (message.get("MessageAttributes") or {}).items():
        size += len(name.encode("utf-8")) + len(str(attribute.get("DataType", "")).encode("utf-8"))
        size += len(str(attribute.get("StringValue", "")).encode("utf-8"))
        size += _binary_size(attribute["BinaryValue"]) if "BinaryValue" in attribute else 0
    return size


def sqs_usage(operation: str, request: dict[str, Any], response: dict[str, Any]) -> dict[str, float]:
    """The SQS requests billed for one call: its payload (sent, or received) in 64 KB chunks."""
    if operation == "SendMessage":
        payload = _sqs_message_bytes(request)
    elif operation == "SendMessageBatch":
        payload = sum(_sqs_message_bytes(entry) for entry in request.get("Entries") or [])
    elif operation == "ReceiveMessage":
        payload = sum(_sqs_message_bytes(message) for message in response.get("Messages") or [])
    else:
        payload = 0
    queue = str(request.get("QueueUrl", ""))
    kind = "sqs.fifo_requests" if queue.endswith(".fifo") else "sqs.standard_requests"
    return {kind: sqs_chunks(payload)}


def _read_usage(operation: str, request: dict[str, Any], response: dict[str, Any]) -> float:
    consistent = bool(request.get("ConsistentRead"))
    if operation == "GetItem":
        return read_units(item_size(response.get("Item")), consistent=consistent)
    if operation in ("Query", "Scan"):
        items = response.get("Items") or []
        total = sum(item_size(item) for item in items)
        scanned, count = int(response.get("ScannedCount", len(items))), len(items)
        if count and scanned > count:  # a filter reads what it discards
            total = total * scanned // count
        return read_units(total, consistent=consistent)
    if operation == "BatchGetItem":
        units = 0.0
        for table, items in (response.get("Responses") or {}).items():
            table_consistent = bool(
                ((request.get("RequestItems") or {}).get(table) or {}).get("ConsistentRead")
            )
            units += sum(read_units(item_size(item), consistent=table_consistent) for item in items)
        return units
    if operation == "TransactGetItems":
        return sum(
            read_units(item_size(answer.get("Item")), transactional=True)
            for answer in response.get("Responses") or [{}] * len(request.get("TransactItems") or [])
        )
    return 0.0


def _write_usage(operation: str, request: dict[str, Any], response: dict[str, Any]) -> float:
    if operation == "PutItem":
        return write_units(item_size(request.get("Item")))
    if operation == "UpdateItem":
        after = item_size(response.get("Attributes")) if response.get("Attributes") else 0
        return write_units(max(update_size(request), after))
    if operation == "DeleteItem":
        return write_units(item_size(response.get("Attributes")) if response.get("Attributes") else 0)
    if operation == "BatchWriteItem":
        unprocessed = sum(len(v) for v in (response.get("UnprocessedItems") or {}).values())
        each = [
            write_units(item_size((entry.get("PutRequest") or {}).get("Item")))
            for entries in (request.get("RequestItems") or {}).values()
            for entry in entries
        ]
        return sum(each) - min(unprocessed, len(each))
    if operation == "TransactWriteItems":
        units = 0
        for action in request.get("TransactItems") or []:
            if "Put" in action:
                units += write_units(item_size(action["Put"].get("Item")), transactional=True)
            elif "Update" in action:
                units += write_units(update_size(action["Update"]), transactional=True)
            else:  # Delete, ConditionCheck: the key's item
                units += write_units(0, transactional=True)
        return units
    return write_units(0)  # ExecuteStatement: at least one unit


def dynamodb_usage(operation: str, request: dict[str, Any], response: dict[str, Any]) -> dict[str, float]:
    """The read and write request units one DynamoDB call consumes (control-plane calls: none)."""
    if operation in DYNAMODB_READS:
        return {"dynamodb.read_request_units": _read_usage(operation, request, response)}
    if operation in DYNAMODB_WRITES:
        return {"dynamodb.write_request_units": _write_usage(operation, request, response)}
    return {}


def reported_capacity(response: dict[str, Any]) -> float:
    """The capacity units a DynamoDB answer reports (``ConsumedCapacity``, one entry or a list)."""
    consumed = response.get("ConsumedCapacity")
    entries = consumed if isinstance(consumed, list) else [consumed] if isinstance(consumed, dict) else []
    return sum(float(entry.get("CapacityUnits", 0.0)) for entry in entries)


def kinesis_usage(operation: str, request: dict[str, Any], response: dict[str, Any]) -> dict[str, float]:
    """PUT payload units (provisioned streams) and kilobytes in (on demand) of the records written."""
    if operation == "PutRecord":
        records = [request]
    elif operation == "PutRecords":
        failed = {i for i, r in enumerate(response.get("Records") or []) if r.get("ErrorCode")}
        records = [r for i, r in enumerate(request.get("Records") or []) if i not in failed]
    else:
        return {}
    sizes = [_binary_size(r.get("Data", "")) + len(str(r.get("PartitionKey", "")).encode()) for r in records]
    return {
        "kinesis.put_payload_units": sum(kinesis_put_units(size) for size in sizes),
        "kinesis.ingested_kb": sum(max(1, math.ceil(size / 1024)) for size in sizes),
    }


def s3_usage(operation: str) -> dict[str, float]:
    if operation in S3_FREE:
        return {}
    return {"s3.put_requests" if operation in S3_PUT_CLASS else "s3.get_requests": 1}


class UsageMeter:
    """botocore handlers that add up the billed units of every request a session's clients make.

    :meth:`attach` registers them on an event emitter (a session's, which its clients copy, or one
    client's); :meth:`take` and :meth:`snapshot` read the totals (keys of ``prices.json``, plus
    ``dynamodb.reported_capacity_units``, what DynamoDB's answers said they consumed, unpriced).
    """

    def __init__(self, *, reported_capacity: bool = False) -> None:
        self.reported_capacity = reported_capacity
        self._lock = threading.Lock()
        self.counts: dict[str, float] = {}

    def attach(self, events: Any) -> None:
        events.register("before-call.*.*", self._before_call)
        events.register("after-call.*.*", self._after_call)
        events.register("after-call-error.*.*", self._after_call_error)
        if self.reported_capacity:
            events.register("before-parameter-build.dynamodb.*", self._ask_capacity)

    def _ask_capacity(self, params: Any = None, model: Any = None, **_: Any) -> None:
        if isinstance(params, dict) and model is not None:
            members = getattr(model.input_shape, "members", {}) or {}
            if "ReturnConsumedCapacity" in members:
                params.setdefault("ReturnConsumedCapacity", "TOTAL")

    def _before_call(self, model: Any = None, params: Any = None, context: Any = None, **_: Any) -> None:
        if model is None or not isinstance(context, dict) or not isinstance(params, dict):
            return
        if threading.current_thread() is threading.main_thread():  # the invocation's own wait
            context["breakwater_call_began"] = time.perf_counter()
        if model.service_model.service_name in JSON_SERVICES:
            context["breakwater_usage_request"] = params.get("body", b"")

    def _after_call(
        self, http_response: Any = None, model: Any = None, context: Any = None, **_: Any
    ) -> None:
        if model is None:
            return
        service = model.service_model.service_name
        self._timed(service, context)
        status = int(getattr(http_response, "status_code", 200) or 200)
        # Only the JSON protocols' answers, which botocore has read already: a streamed body (an S3
        # object) read here would be gone for the caller.
        response = (
            _json(getattr(http_response, "content", b""))
            if http_response is not None and service in JSON_SERVICES
            else {}
        )
        if status >= 500 or (
            status >= 300 and str(response.get("__type", "")).split("#")[-1] not in CHARGED_ERRORS
        ):
            return  # throttled or failed: not billed
        request_body = context.get("breakwater_usage_request", b"") if isinstance(context, dict) else b""
        usage = self.usage_of(service, model.name, _json(request_body), response)
        with self._lock:
            add_to(self.counts, usage)

    def _after_call_error(self, model: Any = None, context: Any = None, **_: Any) -> None:
        if model is not None:  # no answer (a connection error): the wait still counts
            self._timed(model.service_model.service_name, context)

    def _timed(self, service: str, context: Any) -> None:
        began = context.pop("breakwater_call_began", None) if isinstance(context, dict) else None
        if began is None:
            return
        with self._lock:
            add_to(
                self.counts,
                {
                    "measured.aws_call_ms": (time.perf_counter() - began) * 1000,
                    f"measured.aws_calls.{service}": 1,
                },
            )

    def usage_of(
        self, service: str, operation: str, request: dict[str, Any], response: dict[str, Any]
    ) -> dict[str, float]:
        """The billed units of one call, from its request and response in their wire (JSON) form."""
        if service == "sqs":
            return sqs_usage(operation, request, response)
        if service == "dynamodb":
            usage = dynamodb_usage(operation, request, response)
            reported = reported_capacity(response)
            if reported:
                usage["dynamodb.reported_capacity_units"] = reported
                if self.reported_capacity:  # AWS's own figure, split as the operation is
                    usage = {
                        key: reported if key in _DYNAMODB_PRICED else value for key, value in usage.items()
                    }
            return usage
        if service == "kinesis":
            return kinesis_usage(operation, request, response)
        if service == "s3":
            return s3_usage(operation)
        if service in ("cloudwatch", "monitoring") and operation in CLOUDWATCH_METRIC_CALLS:
            return {"cloudwatch.api_requests": 1}
        return {}

    def take(self) -> dict[str, float]:
        """The totals since the last take, and start again from zero."""
        with self._lock:
            taken = dict(self.counts)
            self.counts.clear()
        return taken

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self.counts)


_DYNAMODB_PRICED = ("dynamodb.read_request_units", "dynamodb.write_request_units")


def modelled_duration_ms(
    measured_ms: float, usage: Mapping[str, float], latency_ms: Mapping[str, float]
) -> float:
    """An invocation's duration with AWS's latencies in place of the emulator's round trips.

    ``usage``: the invocation's metered usage (its ``measured.aws_call_ms`` and
    ``measured.aws_calls.<service>``); ``latency_ms``: a round trip per service, ``default`` for
    the others. What the handler did besides waiting for AWS (its own work, a processor's) stays
    as measured.
    """
    waited = float(usage.get("measured.aws_call_ms", 0.0))
    calls = {
        unit.removeprefix("measured.aws_calls."): count
        for unit, count in usage.items()
        if unit.startswith("measured.aws_calls.")
    }
    at_aws = sum(
        count * float(latency_ms.get(service, latency_ms["default"])) for service, count in calls.items()
    )
    return max(0.0, measured_ms - waited) + at_aws
