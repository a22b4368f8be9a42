"""Narrow patches of moto's SQS hot path, applied by the local runtime before its server starts.

moto 5.2.5 computes ``Queue.attributes`` eagerly: every call builds the whole attribute dict,
including ``ApproximateNumberOfMessages``, ``...Delayed`` and ``...NotVisible``, three scans of
every message in the queue. ``SendMessage`` reads that dict once to learn one static setting
(``ContentBasedDeduplication``), and ``ReceiveMessage`` reads it three times per *returned*
message (the retention check calls ``get_queue_attributes(["MessageRetentionPeriod"])``). So a
send costs O(depth) and a receive of ten costs thirty scans: about 18 sends/s at a depth of
1,000. A backlog is what the demo is about, so the fix is here and not in a smaller scenario.

The fix keeps every value and its meaning: ``Queue.attributes`` becomes a read-only mapping with
the same keys, in the same order, that computes a value when (and each time) it is read. Callers
that want one static attribute no longer pay for the counts; ``GetQueueAttributes`` with
``All`` or ``ApproximateNumberOfMessages`` still scans, exactly as before, and is still exact
with respect to delays and visibility timeouts (they are time-dependent, so they are not cached).

Two further O(depth) steps remain per call on a deep queue (a receive scans for visible messages;
a delete looks its receipt handle up in every message); :func:`apply` also gives a delete an index
from receipt handle to message (``delete_message``), keeping moto's behaviour for stale and
unknown handles. And it makes ``GetQueueAttributes`` take its three counts at one instant
(``get_queue_attributes``): counted each at its own clock reading, a message whose delay or
visibility timeout ran out between two counts was in neither (docs/decisions.md D-local-12).

Separately, :func:`disable_inline_event_source_delivery` stops moto from invoking Lambda
synchronously inside ``SendMessage`` for queues with an event source mapping: the local runtime
polls the queues itself, as the Lambda service does (see ``local/mappings.py``); the same for
Kinesis streams inside ``PutRecord(s)`` (see ``local/kinesis_mapping.py``).
:func:`kinesis_resharding_as_aws` makes a split or merge leave the parents' records where AWS does.
:func:`serialize_dynamodb_writes` makes moto's DynamoDB transactions safe under the threaded server;
:func:`back_up_transaction_items` makes a transaction back up the items it touches instead of
deep-copying every table it touches (O(table size): ~20 ms a transaction on the demo's state table,
all of it under that lock).
:func:`route_lambda_invocations` hands Lambda ``Invoke`` to the caller's dispatcher (the runtime's
containers) instead of moto's Docker runner.
:func:`keep_alive_connections` lets a client connection serve more than one request (werkzeug closes
each one, so every AWS request cost a TCP connection and a server thread);
:func:`cache_update_expressions` parses each DynamoDB ``UpdateExpression`` text once (moto parsed it
twice per ``UpdateItem``) and makes the validator's per-request copy and traversals cheaper;
:func:`cache_response_keys` works out once where a response member's value is found in a ``dict``;
:func:`cache_condition_expressions` parses each DynamoDB condition text once, its values bound per request.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import io
import json
import pickle
import selectors
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, overload

from moto import backends as moto_backends
from moto.awslambda import models as lambda_models
from moto.core import responses as moto_responses
from moto.core import serialize as moto_serialize
from moto.core.utils import camelcase_to_underscores, unix_time_millis
from moto.dynamodb import comparisons as dynamodb_comparisons
from moto.dynamodb import models as dynamodb_models
from moto.dynamodb.models.dynamo_type import DynamoType
from moto.dynamodb.models.table import Table as DynamoDBTable
from moto.dynamodb.parsing import ast_nodes as dynamodb_ast_nodes
from moto.dynamodb.parsing import expressions as dynamodb_expressions
from moto.dynamodb.parsing import validators as dynamodb_validators
from moto.kinesis import models as kinesis_models
from moto.moto_server import threaded_moto_server
from moto.moto_server.werkzeug_app import MotoRequestHandler
from moto.sqs import models as sqs_models
from werkzeug import serving as werkzeug_serving

_lock = threading.Lock()
_applied: dict[str, Any] = {}


class QueueAttributes(Mapping[str, Any]):
    """``Queue.attributes`` with the keys moto 5.2.5 builds, each value computed when read."""

    def __init__(self, queue: sqs_models.Queue) -> None:
        self._queue = queue
        names = list(queue.BASE_ATTRIBUTES)
        if queue.fifo_queue:
            names += queue.FIFO_ATTRIBUTES
        if queue.kms_master_key_id:  # type: ignore[attr-defined]
            names += queue.KMS_ATTRIBUTES
        self._names = names

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise KeyError(name)
        queue = self._queue
        value = getattr(queue, camelcase_to_underscores(name))
        if name == "RedrivePolicy" and queue.redrive_policy:
            value = json.dumps(queue.redrive_policy)
        if isinstance(value, bool):
            value = str(value).lower()
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


def _lazy_attributes(self: sqs_models.Queue) -> QueueAttributes:
    return QueueAttributes(self)


class VisibleMessages(Sequence[sqs_models.Message]):
    """``Queue.messages`` (visible and not delayed) as a view: iterate lazily, count without building a list.

    ``ReceiveMessage`` iterates ``queue.messages`` and stops after ``MaxNumberOfMessages``; moto
    built the whole filtered list first, calling the clock twice per message. Iteration walks a
    snapshot of the queue (as the list did) and yields what is visible when reached; counting reads
    the clock once per scan.
    """

    def __init__(self, queue: sqs_models.Queue) -> None:
        self._queue = queue

    def __iter__(self) -> Iterator[sqs_models.Message]:
        for message in list(self._queue._messages):
            if message.visible and not message.delayed:
                yield message

    def _listed(self) -> list[sqs_models.Message]:
        now = _request_instant()  # moto's Message.visible / .delayed, with one clock read per scan
        return [m for m in self._queue._messages if now > m.visible_at and not now < m.delayed_until]

    def __len__(self) -> int:
        return len(self._listed())

    def __bool__(self) -> bool:
        return next(iter(self), None) is not None

    @overload
    def __getitem__(self, index: int) -> sqs_models.Message: ...
    @overload
    def __getitem__(self, index: slice) -> list[sqs_models.Message]: ...
    def __getitem__(self, index: int | slice) -> sqs_models.Message | list[sqs_models.Message]:
        return self._listed()[index]


def _visible_messages(self: sqs_models.Queue) -> VisibleMessages:
    return VisibleMessages(self)


# While ``GetQueueAttributes`` runs on a server thread, the instant its counts are taken at.
_instant = threading.local()


def _request_instant() -> float:
    """The instant of the ``GetQueueAttributes`` this thread is answering, else the clock (ms)."""
    now: float | None = getattr(_instant, "ms", None)
    return unix_time_millis() if now is None else now


def _count_delayed(self: sqs_models.Queue) -> int:
    now = _request_instant()
    return sum(1 for m in self._messages if now < m.delayed_until)


def _count_not_visible(self: sqs_models.Queue) -> int:
    now = _request_instant()
    return sum(1 for m in self._messages if not now > m.visible_at)


def _at_one_instant(original: Any) -> Any:
    def get_queue_attributes(self: Any, queue_name: str, attribute_names: list[str]) -> dict[str, Any]:
        """moto's ``GetQueueAttributes``, its counts taken at the instant the request is answered.

        A message is in exactly one of visible, delayed and in flight at any one instant, so counted
        at one instant the three add up to the queue's depth. moto counts each at its own clock
        reading, so a delay or visibility timeout that ran out between two counts put its message in
        neither or in both (seen as one message "unaccounted" in a demo run). Every count read on
        this thread while the request runs uses its instant; ``All``'s lazy mapping is read here too.
        """
        _instant.ms = unix_time_millis()
        try:
            return dict(original(self, queue_name, attribute_names))
        finally:
            _instant.ms = None

    return get_queue_attributes


def _pending_message_groups(self: sqs_models.Queue) -> set[str]:
    """moto's ``Queue.pending_message_groups`` over a copy of the pending set, not the set itself.

    The server answers requests on threads; moto iterates ``_pending_messages`` in Python while
    another request's receive or delete changes it, and the receive fails with "Set changed size
    during iteration" (seen once in a demo: an HTTP 500 on ReceiveMessage, so a mapping paused a
    second). ``set.copy`` copies in C, holding the GIL: a consistent snapshot (D-local-1).
    """
    return {message.group_id for message in set.copy(self._pending_messages) if message.group_id is not None}


# Receipt handle -> message, for every handle issued since :func:`apply`. A handle not in here
# (issued before, or already deleted) takes moto's own path, so its answers never change.
_handles: dict[str, sqs_models.Message] = {}


def _mark_received(original: Any) -> Any:
    def mark_received(self: sqs_models.Message, visibility_timeout: int | None = None) -> None:
        original(self, visibility_timeout)
        if self.receipt_handle is not None:
            _handles[self.receipt_handle] = self

    return mark_received


def _delete_message(original: Any) -> Any:
    def delete_message(self: sqs_models.Queue, receipt_handle: str) -> None:
        """moto's ``Queue.delete_message`` without its two scans of every message when the handle is known."""
        message = _handles.get(receipt_handle)
        if message is None or receipt_handle in self.deleted_messages:
            original(self, receipt_handle)
            return
        try:
            self._messages.remove(message)  # identity comparison, one C-level pass at worst
        except ValueError:
            # Not in this queue (another queue's handle, purged, or moved to its DLQ): moto decides.
            original(self, receipt_handle)
            return
        self.pending_messages.discard(message)
        handles = [handle for handle in message.all_receipt_handles if handle is not None]
        self.deleted_messages.update(handles)
        for handle in handles:
            _handles.pop(handle, None)

    return delete_message


_QUEUE_PROPERTIES: dict[str, Any] = {
    "attributes": _lazy_attributes,
    "messages": _visible_messages,
    "approximate_number_of_messages_delayed": _count_delayed,
    "approximate_number_of_messages_not_visible": _count_not_visible,
    "pending_message_groups": _pending_message_groups,
}


def apply() -> None:
    """Install the patches (idempotent). Call before the moto server handles its first request."""
    with _lock:
        if "attributes" in _applied:
            return
        for name in _QUEUE_PROPERTIES:
            _applied[name] = sqs_models.Queue.__dict__[name]
            setattr(sqs_models.Queue, name, property(_QUEUE_PROPERTIES[name]))
        # The server asks on every request whether the Host is a moto module: a directory listing and
        # ~170 stat calls each time. The installed modules do not change while it runs.
        listed = _applied["list_of_moto_modules"] = moto_backends.list_of_moto_modules
        moto_backends.list_of_moto_modules = functools.cache(lambda: tuple(listed()))
        # And, to find the action's method, it lists every member of the responses class with
        # inspect.getmembers (~10 % of a SendMessage's server time); a class's methods do not change.
        _applied["method_names_from_class"] = moto_responses.method_names_from_class
        moto_responses.method_names_from_class = functools.cache(_applied["method_names_from_class"])
        _applied["delete_message"] = sqs_models.Queue.delete_message
        _applied["mark_received"] = sqs_models.Message.mark_received
        sqs_models.Queue.delete_message = _delete_message(_applied["delete_message"])  # type: ignore[method-assign]
        sqs_models.Message.mark_received = _mark_received(_applied["mark_received"])  # type: ignore[method-assign]
        _applied["get_queue_attributes"] = sqs_models.SQSBackend.get_queue_attributes
        sqs_models.SQSBackend.get_queue_attributes = _at_one_instant(_applied["get_queue_attributes"])  # type: ignore[method-assign]


def revert() -> None:
    """Undo :func:`apply` (tests compare patched and unpatched behaviour)."""
    with _lock:
        if "attributes" not in _applied:
            return
        for name in _QUEUE_PROPERTIES:
            setattr(sqs_models.Queue, name, _applied.pop(name))
        moto_backends.list_of_moto_modules = _applied.pop("list_of_moto_modules")
        moto_responses.method_names_from_class = _applied.pop("method_names_from_class")
        sqs_models.Queue.delete_message = _applied.pop("delete_message")  # type: ignore[method-assign]
        sqs_models.Message.mark_received = _applied.pop("mark_received")  # type: ignore[method-assign]
        sqs_models.SQSBackend.get_queue_attributes = _applied.pop("get_queue_attributes")  # type: ignore[method-assign]
        _handles.clear()


def is_applied() -> bool:
    return "attributes" in _applied


def _no_inline_mappings(self: sqs_models.Queue) -> dict[str, Any]:
    return {}  # a fresh dict: registrations land nowhere, and SendMessage finds nothing to invoke


def _ignore_mappings(self: sqs_models.Queue, value: dict[str, Any]) -> None:
    return None


def disable_inline_event_source_delivery() -> None:
    """Stop moto delivering SQS messages to Lambda inside ``SendMessage`` (idempotent).

    moto registers an SQS event source mapping on the queue and, on every send, receives a batch and
    invokes the function synchronously (in Docker), deleting the batch on success. The local
    runtime polls the queues itself, with the mapping's batch size, window, concurrency and partial
    batch responses, as the Lambda service does; the mapping itself stays in the Lambda backend,
    where ``GetEventSourceMapping`` / ``UpdateEventSourceMapping`` read and toggle it.
    """
    with _lock:
        if "lambda_event_source_mappings" in _applied:
            return
        _applied["lambda_event_source_mappings"] = True
        sqs_models.Queue.lambda_event_source_mappings = property(  # type: ignore[assignment]
            _no_inline_mappings, _ignore_mappings
        )
        # Kinesis: moto invokes the function (in Docker) inside every PutRecord; the runtime's
        # KinesisMapping reads the shards itself.
        kinesis_models.Stream.lambda_event_source_mappings = property(  # type: ignore[assignment]
            _no_inline_mappings, _ignore_mappings
        )


def open_shard_routing(route: Callable[[Any, str, str], Any]) -> Callable[[Any, str, str], Any]:
    """``route`` (moto's ``Stream.get_shard_for_key``) made to skip closed shards, as AWS routes a put:
    a key whose shard is closed goes to the open shard that owns its hash key (the closed one if none does).
    """

    def open_shard_for_key(self: Any, partition_key: str, explicit_hash_key: str) -> Any:
        shard = route(self, partition_key, explicit_hash_key)
        if shard is None or shard.is_open:
            return shard
        key = (  # Kinesis maps a partition key to a hash key with MD5
            int(explicit_hash_key)
            if explicit_hash_key
            else int(hashlib.md5(partition_key.encode()).hexdigest(), 16)  # noqa: S324
        )
        return next(
            (s for s in self.shards.values() if s.is_open and s.starting_hash <= key <= s.ending_hash),
            shard,
        )

    return open_shard_for_key


def kinesis_resharding_as_aws() -> None:
    """After SplitShard / MergeShards, records stay in the closed parents and new puts go to open shards.

    moto 5.2.5's ``split_shard`` empties the parent and re-puts its records through its routing,
    which does not skip closed shards (so they, and every later put, land in the parent again);
    ``merge_shards`` copies both parents' records into the child. On AWS a parent keeps its records
    (readable until retention ends) and only the open child that owns the hash key receives puts.
    Idempotent; ``tests/integration/streaming_fixtures.split_shard_as_aws`` applies the routing part
    (:func:`open_shard_routing`) for the in-process tests.
    """
    with _lock:
        if "kinesis_resharding" in _applied:
            return
        _applied["kinesis_resharding"] = True
        route = kinesis_models.Stream.get_shard_for_key
        split = kinesis_models.Stream.split_shard
        merge = kinesis_models.Stream.merge_shards

        def keeping_records(original: Any, *names: str) -> Any:
            def wrapper(self: Any, *args: Any) -> None:
                parents = [
                    self.shards[args[index]] for index in range(len(names)) if args[index] in self.shards
                ]
                kept = [parent.records for parent in parents]
                for parent in parents:
                    parent.records = type(parent.records)()  # nothing for moto to move
                try:
                    original(self, *args)
                finally:
                    for parent, records in zip(parents, kept, strict=True):
                        parent.records = records

            return wrapper

        kinesis_models.Stream.get_shard_for_key = open_shard_routing(route)  # type: ignore[method-assign,assignment]
        kinesis_models.Stream.split_shard = keeping_records(split, "shard_to_split")  # type: ignore[method-assign]
        kinesis_models.Stream.merge_shards = keeping_records(  # type: ignore[method-assign]
            merge, "shard_to_merge", "adjacent_shard_to_merge"
        )


# moto's DynamoDBBackend methods that read or write a table's items dict; one lock serializes them.
_DYNAMODB_METHODS = (
    "transact_write_items",
    "put_item",
    "update_item",
    "delete_item",
    "get_item",
    "query",
    "scan",
)
_dynamodb_lock = threading.RLock()


def serialize_dynamodb_writes() -> None:
    """Run moto's DynamoDB item operations one at a time (idempotent).

    moto 5.2.5's ``transact_write_items`` backs up every table it touches with ``copy.deepcopy``
    (iterating the table's items) and restores that copy if a condition fails; ``update_item``
    deep-copies the item. Under ``ThreadedMotoServer`` another request inserting into the same
    table meanwhile raises ``RuntimeError: dictionary changed size during iteration`` (HTTP 500),
    and a rollback would silently undo writes made by other requests since the backup. A
    transaction on AWS is atomic and isolated, so the backend's item operations (``BatchWriteItem``
    goes through ``put_item`` / ``delete_item``) hold one re-entrant lock, as a single-threaded
    server would.
    """
    with _lock:
        if "dynamodb_lock" in _applied:
            return
        _applied["dynamodb_lock"] = {
            name: dynamodb_models.DynamoDBBackend.__dict__[name] for name in _DYNAMODB_METHODS
        }
        for name in _DYNAMODB_METHODS:
            setattr(dynamodb_models.DynamoDBBackend, name, _serialized(_applied["dynamodb_lock"][name]))


def _serialized(original: Any) -> Any:
    @functools.wraps(original)
    def serialized(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _dynamodb_lock:
            return original(self, *args, **kwargs)

    return serialized


def unserialize_dynamodb_writes() -> None:
    """Undo :func:`serialize_dynamodb_writes` (tests)."""
    with _lock:
        originals = _applied.pop("dynamodb_lock", None)
        for name, method in (originals or {}).items():
            setattr(dynamodb_models.DynamoDBBackend, name, method)


# (function name, payload bytes, invocation type) -> the response payload (b"" for an Event).
LambdaDispatch = Callable[[str, bytes, str], bytes]


def route_lambda_invocations(dispatch: LambdaDispatch) -> None:
    """Send every Lambda ``Invoke`` to ``dispatch`` instead of moto's runner (replaces a previous one).

    moto 5.2.5's ``LambdaBackend.invoke`` runs the function in Docker, synchronously even for
    ``InvocationType=Event`` (the controller starting the archiver). The runtime runs functions in its
    own containers, so the backend's invoke resolves the function (name, ARN or qualifier, with moto's
    errors for unknown ones) and hands the payload over; an ``Event`` dispatcher returns at once.
    """
    with _lock:
        if "lambda_invoke" not in _applied:
            _applied["lambda_invoke"] = lambda_models.LambdaBackend.invoke
        _applied["lambda_dispatch"] = dispatch

        def invoke(
            self: lambda_models.LambdaBackend,
            function_name: str,
            qualifier: str | None,
            body: Any,
            headers: Any,
            response_headers: Any,
        ) -> bytes:
            function = self.get_function(function_name, qualifier)
            invocation_type = headers.get("X-Amz-Invocation-Type") or headers.get("x-amz-invocation-type")
            payload = body if isinstance(body, bytes) else (body or "").encode()
            return bytes(
                _applied["lambda_dispatch"](
                    function.function_name, payload, invocation_type or "RequestResponse"
                )
            )

        lambda_models.LambdaBackend.invoke = invoke  # type: ignore[method-assign]


def unroute_lambda_invocations() -> None:
    """Undo :func:`route_lambda_invocations` (tests)."""
    with _lock:
        _applied.pop("lambda_dispatch", None)
        original = _applied.pop("lambda_invoke", None)
        if original is not None:
            lambda_models.LambdaBackend.invoke = original  # type: ignore[method-assign]


_transaction = threading.local()  # .active: inside a transaction wrapped by back_up_transaction_items


class _TablesNotCopied:
    """Stands in for the ``copy`` module in ``moto.dynamodb.models``: inside a wrapped transaction,
    ``deepcopy(table)`` is the table itself (its rollback then restores nothing), since
    :func:`back_up_transaction_items` keeps and restores the touched items instead; else ``copy``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(copy, name)

    @staticmethod
    def deepcopy(value: Any, memo: Any = None) -> Any:
        if getattr(_transaction, "active", False) and isinstance(value, DynamoDBTable):
            return value
        return copy.deepcopy(value, memo)


def _item_key(table: DynamoDBTable, op: Mapping[str, Any]) -> tuple[DynamoType, DynamoType | None] | None:
    attrs = op.get("Key") or op.get("Item") or {}
    try:
        hash_value = DynamoType(attrs[table.hash_key_attr])
        range_value = DynamoType(attrs[table.range_key_attr]) if table.range_key_attr else None
    except (KeyError, TypeError):
        return None  # moto's own validation answers for a malformed entry
    return hash_value, range_value


def _restore(table: DynamoDBTable, hash_value: DynamoType, range_value: DynamoType | None, item: Any) -> None:
    if range_value is not None:
        if item is None:
            table.items.get(hash_value, {}).pop(range_value, None)
        else:
            table.items[hash_value][range_value] = item
    elif item is None:
        table.items.pop(hash_value, None)
    else:
        table.items[hash_value] = item


def _backing_up_items(original: Any) -> Any:
    @functools.wraps(original)
    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        with _dynamodb_lock:  # re-entrant: the same lock as serialize_dynamodb_writes
            backups = []
            for entry in transact_items:
                op = next(iter(entry.values()), None) if isinstance(entry, dict) else None
                table = self.tables.get(op.get("TableName")) if isinstance(op, dict) else None
                key = _item_key(table, op) if table is not None and isinstance(op, dict) else None
                if table is None or key is None:
                    continue
                hash_value, range_value = key
                current = table.get_item(hash_value, range_value)
                backups.append((table, hash_value, range_value, copy.deepcopy(current)))
            _transaction.active = True
            try:
                original(self, transact_items)
            except BaseException:
                for table, hash_value, range_value, item in reversed(backups):
                    _restore(table, hash_value, range_value, item)
                raise
            finally:
                _transaction.active = False

    return transact_write_items


def back_up_transaction_items() -> None:
    """Roll a failed ``TransactWriteItems`` back from the items it touched, not whole-table copies.

    moto 5.2.5 deep-copies every table a transaction names before applying it, and puts the copies
    back if any entry fails: O(items in the table) per transaction, under the lock of
    :func:`serialize_dynamodb_writes`, so every other DynamoDB request of the runtime waits for it.
    With the item operations serialized, nothing else can change a table during a transaction, so a
    copy of each touched item (or its absence) restores exactly the state the table copy did.
    Idempotent; the cancellation reasons and error codes are moto's own.
    """
    with _lock:
        if "transaction_backups" in _applied:
            return
        _applied["transaction_backups"] = (
            dynamodb_models.DynamoDBBackend.__dict__["transact_write_items"],
            dynamodb_models.copy,
        )
        dynamodb_models.copy = _TablesNotCopied()  # type: ignore[assignment]
        dynamodb_models.DynamoDBBackend.transact_write_items = _backing_up_items(  # type: ignore[method-assign]
            dynamodb_models.DynamoDBBackend.transact_write_items
        )


def restore_transaction_copies() -> None:
    """Undo :func:`back_up_transaction_items` (tests)."""
    with _lock:
        saved = _applied.pop("transaction_backups", None)
        if saved is not None:
            dynamodb_models.DynamoDBBackend.transact_write_items = saved[0]  # type: ignore[method-assign]
            dynamodb_models.copy = saved[1]


# .reading_done: this thread's current request body is read in full, so its connection can be kept
_keep_alive = threading.local()


class KeepAliveRequestHandler(MotoRequestHandler):
    """moto's request handler with HTTP/1.1 keep-alive: one connection (and thread) per client connection.

    werkzeug 3.1's development server answers every request with ``Connection: close``, because
    ``http.server`` cannot tell where an unread request body ends and the next request line begins;
    after each response it drains the socket for up to 10 ms to discard such leftovers. So every AWS
    request of the runtime opened a TCP connection and the server started a thread for it. Here the
    body is read in full (``Content-Length`` bytes) before the application sees it, so nothing is
    left to drain and the connection can serve the client's next request. A request whose length
    is not known up front (chunked transfer encoding) keeps werkzeug's behaviour: the answer closes
    the connection and the leftovers are drained.

    ``TCP_NODELAY``: werkzeug writes the headers and the body of a response separately; on a kept
    connection Nagle's algorithm holds the body until the client acknowledges the headers, which a
    client delays (~40 ms on Linux), so every request would take 40 ms.
    """

    disable_nagle_algorithm = True

    def make_environ(self) -> dict[str, Any]:
        environ = super().make_environ()
        _keep_alive.reading_done = False
        if environ.get("wsgi.input_terminated"):
            return environ  # chunked: werkzeug reads it and closes the connection afterwards
        try:
            length = int(environ.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return environ
        environ["wsgi.input"] = io.BytesIO(self.rfile.read(length) if length > 0 else b"")
        _keep_alive.reading_done = True
        return environ

    def send_header(self, keyword: str, value: str) -> None:
        closing = keyword.lower() == "connection" and value.lower() == "close"
        if closing and _keep_alive.__dict__.get("reading_done"):
            return  # http.server keeps the connection open unless the request asked to close it
        super().send_header(keyword, value)


class _NothingToDrain:
    """``werkzeug.serving``'s ``selectors`` module, except that a request whose body was read in full
    by :class:`KeepAliveRequestHandler` finds nothing to drain (what is there is the next request)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(selectors, name)

    @staticmethod
    def DefaultSelector() -> Any:  # noqa: N802 - the name werkzeug calls
        if _keep_alive.__dict__.get("reading_done"):
            return _IdleSelector()
        return selectors.DefaultSelector()


class _IdleSelector:
    def register(self, *args: Any, **kwargs: Any) -> None:
        return None

    def select(self, timeout: float | None = None) -> list[Any]:
        return []

    def close(self) -> None:
        return None


def keep_alive_connections() -> None:
    """Serve each client connection for more than one request (idempotent; before the server starts).

    ``ThreadedMotoServer`` makes its server with :class:`KeepAliveRequestHandler` instead of moto's
    ``MotoRequestHandler``, and werkzeug's post-response drain skips requests whose body was read.
    """
    with _lock:
        if "keep_alive" in _applied:
            return
        _applied["keep_alive"] = (threaded_moto_server.MotoRequestHandler, werkzeug_serving.selectors)
        threaded_moto_server.MotoRequestHandler = KeepAliveRequestHandler  # type: ignore[misc]
        werkzeug_serving.selectors = _NothingToDrain()  # type: ignore[assignment]


def close_connections() -> None:
    """Undo :func:`keep_alive_connections` (tests)."""
    with _lock:
        saved = _applied.pop("keep_alive", None)
        if saved is not None:
            threaded_moto_server.MotoRequestHandler = saved[0]  # type: ignore[misc]
            werkzeug_serving.selectors = saved[1]


# An UpdateExpression's text -> its AST, and id(AST) -> (AST, its pickle). The cached ASTs are read and
# never changed (the validator works on a copy, made from the pickle); the second map holds them alive.
_update_asts: dict[str, Any] = {}
_update_ast_copies: dict[int, tuple[Any, bytes]] = {}
_UPDATE_AST_LIMIT = 4096  # distinct expression texts kept (the runtime's functions use a handful)


def _parsed_once(make: Callable[[Any, str], Any]) -> Callable[[Any, str], Any]:
    def cached_make(cls: Any, expression_str: str) -> Any:
        ast = _update_asts.get(expression_str)
        if ast is None:
            ast = make(cls, expression_str)  # a syntax error raises here, each time, as before
            if len(_update_asts) >= _UPDATE_AST_LIMIT:
                _update_asts.clear()
                _update_ast_copies.clear()
            _update_ast_copies[id(ast)] = (ast, pickle.dumps(ast, protocol=pickle.HIGHEST_PROTOCOL))
            _update_asts[expression_str] = ast
        return ast

    return cached_make


def _copy_for_validation(value: Any, memo: Any = None) -> Any:
    """``deepcopy`` in ``moto.dynamodb.parsing.validators``: a cached AST is copied from its pickle
    (a third of deepcopy's time; the same tree of the same classes); anything else by ``deepcopy``."""
    entry = _update_ast_copies.get(id(value))
    if entry is not None and entry[0] is value and memo is None:
        return pickle.loads(entry[1])  # noqa: S301 - our own pickle of moto's own objects
    return copy.deepcopy(value, memo)


_processed_types: dict[type, tuple[type, ...]] = {}


def _nodes_to_be_processed(self: Any) -> tuple[type, ...]:
    """``DepthFirstTraverser.nodes_to_be_processed``, built once per traverser class instead of per node.

    The traversers of ``moto.dynamodb.parsing.validators`` list node classes as literal keys of their
    ``_processing_map``, so the tuple depends on the class only; any other traverser is asked each time.
    """
    cls = type(self)
    types = _processed_types.get(cls)
    if types is None:
        types = tuple(self._processing_map().keys())
        if cls.__module__ == dynamodb_validators.__name__:
            _processed_types[cls] = types
    return types


def _update_parser_and_traverser() -> tuple[Any, Any]:
    """moto's ``UpdateExpressionParser`` and ``DepthFirstTraverser`` (their modules are untyped)."""
    expressions: Any = dynamodb_expressions
    ast_nodes: Any = dynamodb_ast_nodes
    return expressions.UpdateExpressionParser, ast_nodes.DepthFirstTraverser


def cache_update_expressions() -> None:
    """Parse each distinct DynamoDB ``UpdateExpression`` once (idempotent).

    moto 5.2.5 parses an ``UpdateItem``'s expression twice (the response handler to find the names and
    values it uses, the backend to validate it) with a hand-written tokenizer and parser, then
    deep-copies the tree for the validator, whose ten traversals rebuild each traverser's list of
    node classes at every node. The runtime's functions send a handful of expression texts thousands
    of times (a token lease is ``SET tokens = :tokens, updated_at = :updated, full_at = :full, ...``), so:
    the parse is cached by text (only successful parses; the tree is never changed, as the validator
    works on a copy), the validator's copy of a cached tree comes from its pickle, and a traverser's
    node classes are computed once per class. Values, errors and the updated item are moto's own.
    """
    with _lock:
        if "update_expressions" in _applied:
            return
        parser, traverser = _update_parser_and_traverser()
        make = parser.__dict__["make"]
        _applied["update_expressions"] = (
            make,
            dynamodb_validators.deepcopy,
            traverser.__dict__["nodes_to_be_processed"],
        )
        parser.make = classmethod(_parsed_once(make.__func__))
        dynamodb_validators.deepcopy = _copy_for_validation  # type: ignore[assignment]
        traverser.nodes_to_be_processed = _nodes_to_be_processed


def parse_update_expressions_each_time() -> None:
    """Undo :func:`cache_update_expressions` (tests)."""
    with _lock:
        saved = _applied.pop("update_expressions", None)
        if saved is None:
            return
        parser, traverser = _update_parser_and_traverser()
        parser.make = saved[0]
        dynamodb_validators.deepcopy = saved[1]
        traverser.nodes_to_be_processed = saved[2]
        _update_asts.clear()
        _update_ast_copies.clear()
        _processed_types.clear()


# (picker class, alias providers, member key, shape, its parent) -> the keys to try, in order; each entry
# holds its shape and parent, so their ids stay theirs while the entry lives.
_possible_keys: dict[tuple[Any, ...], tuple[Any, Any, tuple[str, ...]]] = {}
_POSSIBLE_KEYS_LIMIT = 20_000


def _possible_keys_once(original: Any) -> Any:
    def get_possible_keys(self: Any, context: Any) -> Iterator[str]:
        shape = context.shape
        if type(context.obj) is not dict or shape is None:
            return iter(original(self, context))
        parent = getattr(shape, "parent", None)
        key = (type(self), tuple(self.alias_providers), context.key, id(shape), id(parent))
        entry = _possible_keys.get(key)
        if entry is None or entry[0] is not shape or entry[1] is not parent:
            if len(_possible_keys) >= _POSSIBLE_KEYS_LIMIT:
                _possible_keys.clear()
            entry = _possible_keys[key] = (shape, parent, tuple(original(self, context)))
        return iter(entry[2])

    return get_possible_keys


def cache_response_keys() -> None:
    """Work out once per response member where its value may be found in a plain ``dict`` (idempotent).

    moto 5.2.5 serialises a response by walking the operation's output shape and, for every member of
    every structure, asks six alias providers (new objects each time) which keys the value may be
    found under, then ``botocore.xform_name`` of each: for a DynamoDB item, the ten members of each
    attribute's ``AttributeValue``. For a ``dict`` the answer depends only on the member's name, its
    shape and that shape's parent (a dict has no ``Meta`` aliases and its class name is ``dict``), and
    the shapes are the cached service model's own objects, so the keys are cached under those; any
    other object is asked every time. The values are still read from the object each time.
    """
    with _lock:
        if "response_keys" in _applied:
            return
        _applied["response_keys"] = moto_serialize.XFormedAttributePicker.__dict__["get_possible_keys"]
        moto_serialize.XFormedAttributePicker.get_possible_keys = _possible_keys_once(  # type: ignore[method-assign]
            _applied["response_keys"]
        )


def look_up_response_keys_each_time() -> None:
    """Undo :func:`cache_response_keys` (tests)."""
    with _lock:
        original = _applied.pop("response_keys", None)
        if original is not None:
            moto_serialize.XFormedAttributePicker.get_possible_keys = original  # type: ignore[method-assign]
            _possible_keys.clear()


class _ValueName(str):
    """An expression attribute value's name (``:tokens``), standing in for its value in a cached tree."""


# (condition text, its names mapping, its values' names) -> (tree, names found, values found)
_condition_trees: dict[tuple[Any, ...], tuple[Any, tuple[str, ...], tuple[str, ...]]] = {}
_CONDITION_TREE_LIMIT = 4096  # distinct conditions kept (the runtime's functions use a few dozen)


def _condition_tree(parser: Any) -> Any:
    """The steps of moto 5.2.5's ``ConditionExpressionParser.parse`` up to its syntax tree, in its order."""
    nodes = parser._lex_condition_expression()
    nodes = parser._parse_paths(nodes)
    nodes = parser._apply_functions(nodes)
    nodes = parser._apply_comparator(nodes)
    nodes = parser._apply_in(nodes)
    nodes = parser._apply_between(nodes)
    nodes = parser._apply_parens_and_booleans(nodes)
    node = nodes[0]
    parser._assert_no_redundant_parentheses(node)
    return node


def _parsed_condition_once(original: Any) -> Any:
    def parse(self: Any) -> Any:
        expression = self.condition_expression
        if not expression:
            return original(self)
        values = self.expression_attribute_values
        key = (
            expression,
            tuple(sorted((self.expression_attribute_names or {}).items())),
            tuple(sorted(values)) if isinstance(values, dict) else values,
        )
        entry = _condition_trees.get(key)
        if entry is None:
            lookup = self._lookup_expression_attribute_value

            def by_name(name: str) -> _ValueName:
                lookup(name)  # a value the request does not define fails here, with moto's own error
                return _ValueName(name)

            self._lookup_expression_attribute_value = by_name
            try:
                node = _condition_tree(self)  # a syntax error raises here, each time, as before
            finally:
                del self._lookup_expression_attribute_value
            entry = (node, tuple(self._find_literals(node)), tuple(self._find_expr_attr_values(node)))
            if len(_condition_trees) >= _CONDITION_TREE_LIMIT:
                _condition_trees.clear()
            _condition_trees[key] = entry
        node, names_found, values_found = entry
        self.expr_attr_names_found.extend(names_found)
        self.expr_attr_values_found.extend(values_found)
        return self._make_op_condition(node)

    return parse


def _bound_operand(original: Any) -> Any:
    def make_operand(self: Any, node: Any) -> Any:
        if type(node.value) is _ValueName:
            return dynamodb_comparisons.AttributeValue(self._lookup_expression_attribute_value(node.value))
        return original(self, node)

    return make_operand


def cache_condition_expressions() -> None:
    """Parse each distinct DynamoDB condition once; bind its values for each request (idempotent).

    moto 5.2.5 parses every ``ConditionExpression`` (and ``FilterExpression``) with a hand-written
    lexer and parser, one regular expression per token, and puts the request's values into the
    tree as it parses, so no tree could be reused: the runtime's conditions carry a new ``:now``
    each time. Here the tree is built once per (text, names, the values' names) with each value
    left as its name, and each request's values are looked up when the tree becomes moto's
    condition objects (``_make_op_condition``), as moto's own parse does last. About a tenth of the
    moto process's GIL time during the demo's burst went to this parse (docs/performance.md, Demo).
    Errors (syntax, a missing name or value, a keyword) are raised by moto's own code, each time;
    only successful parses are kept. The conditions' outcomes are moto's own.
    """
    with _lock:
        if "condition_expressions" in _applied:
            return
        parser = dynamodb_comparisons.ConditionExpressionParser
        _applied["condition_expressions"] = (parser.__dict__["parse"], parser.__dict__["_make_operand"])
        parser.parse = _parsed_condition_once(_applied["condition_expressions"][0])  # type: ignore[method-assign]
        parser._make_operand = _bound_operand(_applied["condition_expressions"][1])  # type: ignore[method-assign]


def parse_condition_expressions_each_time() -> None:
    """Undo :func:`cache_condition_expressions` (tests)."""
    with _lock:
        saved = _applied.pop("condition_expressions", None)
        if saved is not None:
            parser = dynamodb_comparisons.ConditionExpressionParser
            parser.parse, parser._make_operand = saved  # type: ignore[method-assign]
            _condition_trees.clear()
