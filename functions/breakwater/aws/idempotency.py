"""Processing idempotency per envelope id: Powertools idempotency on the idempotency table, per batch.

The key prefix is fixed (not derived from the function name), so the live and the sideline worker,
two functions, share one record per envelope: a message processed by either is never processed
again by the other.

Powertools writes two records per call (put INPROGRESS, update COMPLETED). :class:`BatchedPersistenceLayer`
keeps its ``idempotent_function`` and record layout but moves both writes to the batch, two writes
per message being most of the worker's AWS cost: before the batch's admitted messages run, each
one's INPROGRESS lock is taken with Powertools' own condition (so two copies of an envelope are
never worked on in parallel, and a completed one is never run again), one conditional PutItem each;
the COMPLETED records are buffered and written after the batch, with BatchWriteItem
(:meth:`take_completed` and :meth:`write_completed` in the batch's settle, or :meth:`flush`). Each is
one write unit, where an item of a transaction costs two. A lock the batch could not take (the
record exists: a duplicate) falls back to Powertools' per-call path, which reads the record and
answers "already done" or "in progress". A failure deletes its lock at once, so the retry can run.

Without locking (``processing.guarantee`` = ``at_least_once``) the batch takes no INPROGRESS locks: it
reads the records of its messages (one consistent BatchGetItem per 100) and skips the completed
ones, and each success is recorded after it, with the rest of the batch's records. Two copies
running at once, or a run whose worker died before the batch's records were written, may run twice.

A message whose processor handed back transactional effects (``WorkContext.add_effect``) is recorded
at once instead, in one TransactWriteItems with its effects (the inbox pattern): the record's put is
conditional on no other copy having completed, so the effects happen once or not at all, whatever
dies when.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyItemAlreadyExistsError,
    IdempotencyPersistenceLayerError,
)
from aws_lambda_powertools.utilities.idempotency.persistence.datarecord import DataRecord
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.exceptions import ClientError

from breakwater.aws.counters import batch_get_items, retrying_conflicts
from breakwater.envelope import Envelope, processing_id
from breakwater.observability import PowertoolsSettings, logger
from breakwater.processor import WorkContext
from breakwater.worker.ports import HeldElsewhereError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

KEY_PREFIX = "breakwater.process"
MAX_BATCH_WRITE = 25

Processor = Callable[[Envelope, WorkContext], dict[str, Any]]

# The batch takes a lock only where no record exists; Powertools' own condition (persistence/dynamodb.py,
# _put_record) also takes an expired record or lock, which the per-call path does for those rare keys.
_LOCK_CONDITION = "attribute_not_exists(#id)"
# A message's record with its effects: unless another copy has completed it (whoever holds the lock).
_COMMIT_CONDITION = "attribute_not_exists(#id) OR #status = :in_progress"


COMMIT_ATTEMPTS = 4


def _conflicted(exc: ClientError) -> bool:
    """Whether a commit was refused only because another transaction held one of its items."""
    code = exc.response.get("Error", {}).get("Code")
    if code == "TransactionConflictException":
        return True
    reasons = [reason.get("Code") for reason in exc.response.get("CancellationReasons") or []]
    return (
        code == "TransactionCanceledException"
        and "TransactionConflict" in reasons
        and all(reason in (None, "None", "TransactionConflict") for reason in reasons)
    )


class EffectsAlreadyCommittedError(IdempotencyItemAlreadyExistsError):
    """Another copy of the message committed its record (and its effects) first: these were not written."""


class EffectsNotCommittedError(RuntimeError):
    """The transaction of a message's effects and record was refused or failed: nothing of it was written."""


class BatchedPersistenceLayer(DynamoDBPersistenceLayer):
    """Powertools' DynamoDB layer whose INPROGRESS puts and COMPLETED updates are made per batch."""

    def __init__(self, table_name: str, *, client: DynamoDBClient | None = None) -> None:
        super().__init__(table_name=table_name, boto3_client=client)
        self._locked: set[str] = set()  # INPROGRESS locks the batch took and no call has used yet
        self._running: set[str] = set()  # locks a call is using
        self._completed: dict[str, DataRecord] = {}  # COMPLETED records waiting for the flush
        self._keys: dict[str, str] = {}  # envelope id -> record key, for the batch (one hash per envelope)
        # the running call's transactional effects, written with its COMPLETED record
        self.effects: list[dict[str, Any]] | None = None
        # when the lock another invocation holds on the running call's message expires (epoch ms)
        self.held_until_ms: int | None = None
        # without locks: the record keys the batch read, and the responses of those found completed
        self._read: set[str] = set()
        self._done: dict[str, dict[str, Any]] = {}

    def use_lock(self, envelope: Envelope) -> bool:
        """If the batch took this envelope's lock and no call used it yet, a call runs under it now."""
        key = self.key_of(envelope)
        if key not in self._locked:
            return False
        self._locked.remove(key)
        self._running.add(key)
        return True

    def key_of(self, envelope: Envelope) -> str:
        return self._key_of_id(processing_id(envelope))

    def _key_of_id(self, envelope_id: str) -> str:
        key = self._keys.get(envelope_id)
        if key is None:
            # Powertools' _generate_hash: its JSON encoder only adds types a string never needs
            digest = self.hash_function(json.dumps(envelope_id, sort_keys=True).encode()).hexdigest()
            key = self._keys[envelope_id] = f"{self.function_name}#{digest}"
        return key

    def _get_hashed_idempotency_key(self, data: dict[str, Any]) -> str | None:
        # The key is ``id`` (event_key_jmespath="id"): the same hash as Powertools' JMESPath search,
        # without a search per call (two per message). A whole envelope (Powertools' per-call path)
        # is keyed by its processing id, as the batch's locks are.
        envelope_id = data.get("id") if isinstance(data, dict) else None
        if isinstance(envelope_id, str) and envelope_id:
            if data.get("dedup_key") and data.get("tenant"):
                envelope_id = processing_id(Envelope.model_validate(data))
            return self._key_of_id(envelope_id)
        return super()._get_hashed_idempotency_key(data)

    # -- per batch -----------------------------------------------------------------------------------
    def lock_puts(self, envelopes: Iterable[Envelope], remaining_ms: int) -> dict[str, dict[str, Any]]:
        """The conditional PutItems that take the INPROGRESS locks the batch does not hold yet.

        Keyed by record key (a second copy of an envelope adds nothing). The condition takes a
        lock only where no record exists; an expired record or lock fails it, and that message
        takes Powertools' own path, whose condition also takes expired ones.
        """
        now_ms = int(time.time() * 1000)
        expiry = {"N": str(self._get_expiry_timestamp())}
        in_progress_expiry = {"N": str(now_ms + remaining_ms)}
        names = {"#id": self.key_attr}
        puts: dict[str, dict[str, Any]] = {}
        for envelope in envelopes:
            key = self.key_of(envelope)
            if key in puts or key in self._locked or key in self._running or key in self._completed:
                continue
            puts[key] = {
                "TableName": self.table_name,
                "Item": {
                    self.key_attr: {"S": key},
                    self.expiry_attr: expiry,
                    self.status_attr: {"S": "INPROGRESS"},
                    self.in_progress_expiry_attr: in_progress_expiry,
                },
                "ConditionExpression": _LOCK_CONDITION,
                "ExpressionAttributeNames": names,
            }
        return puts

    def read_batch(self, envelopes: Iterable[Envelope]) -> None:
        """Without locks: read the records of ``envelopes`` not read yet (BatchGetItem, consistent)."""
        keys = [
            key
            for key in dict.fromkeys(self.key_of(envelope) for envelope in envelopes)
            if key not in self._read and key not in self._completed
        ]
        # Enough calls for every key and a few rounds of unprocessed ones; what is left is read one by
        # one when its message runs (done_response).
        items, left = batch_get_items(
            self.client,
            self.table_name,
            [self._get_key(key) for key in keys],
            consistent=True,
            calls=len(keys) // 100 + 8,
        )
        now_s = int(time.time())
        for item in items:
            self._remember_if_completed(item, now_s)
        unread = {key[self.key_attr]["S"] for key in left}
        self._read.update(key for key in keys if key not in unread)

    def done_response(self, key: str) -> dict[str, Any] | None:
        """Without locks: the stored response if ``key`` is completed (read by the batch, or now)."""
        if key in self._completed:  # a second copy in the same batch
            return dict(json.loads(self._completed[key].response_data or "{}"))
        if key not in self._read:
            item = self.client.get_item(
                TableName=self.table_name, Key=self._get_key(key), ConsistentRead=True
            )
            self._remember_if_completed(item.get("Item") or {}, int(time.time()))
            self._read.add(key)
        return self._done.get(key)

    def _remember_if_completed(self, item: dict[str, Any], now_s: int) -> None:
        """A record read without locks: its response, if it says COMPLETED and has not expired."""
        expiry = int(item.get(self.expiry_attr, {}).get("N", "0"))
        if item.get(self.status_attr, {}).get("S") == "COMPLETED" and expiry > now_s:
            self._done[item[self.key_attr]["S"]] = json.loads(item.get(self.data_attr, {}).get("S") or "{}")

    def record_success(self, key: str, result: dict[str, Any]) -> None:
        """Without locks: the COMPLETED record of a success (with its effects at once, else buffered)."""
        record = DataRecord(
            idempotency_key=key,
            status="COMPLETED",
            expiry_timestamp=self._get_expiry_timestamp(),
            response_data=json.dumps(result, default=str),
        )
        if self.effects:
            self.commit_with_effects(record, self.effects, locked=False)
            return
        self._completed[key] = record

    def lock_batch(self, envelopes: Iterable[Envelope], remaining_ms: int) -> None:
        """Take the INPROGRESS locks the batch does not hold yet, one conditional PutItem each.

        Not one transaction: a lock is one write unit on its own and two in a transaction, and no
        lock needs another to land with it. A lock refused because the record exists (a duplicate,
        done or in progress) is left to the per-call path, which reads the record; any other error
        leaves this and the remaining messages to it too.
        """
        for key, put in self.lock_puts(envelopes, remaining_ms).items():
            try:
                self.client.put_item(**put)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                    logger.warning("batch idempotency lock failed", extra={"error": str(exc)})
                    return
                continue
            self._locked.add(key)

    def unlock_batch(self, envelopes: Iterable[Envelope]) -> None:
        """Delete the INPROGRESS locks the batch took for ``envelopes`` and no call used (BatchWriteItem).

        For messages the worker locked but then set aside unprocessed (its breaker opened mid-batch):
        their copies elsewhere must not find a lock that lasts as long as this invocation.
        """
        keys = [
            key
            for key in dict.fromkeys(self.key_of(envelope) for envelope in envelopes)
            if key in self._locked
        ]
        for start in range(0, len(keys), MAX_BATCH_WRITE):
            chunk = keys[start : start + MAX_BATCH_WRITE]
            requests: list[Any] = [{"DeleteRequest": {"Key": self._get_key(key)}} for key in chunk]
            for _ in range(3):
                response = self.client.batch_write_item(RequestItems={self.table_name: requests})
                requests = list((response.get("UnprocessedItems") or {}).get(self.table_name, []))
                if not requests:
                    break
        self._locked.difference_update(keys)

    def flush(self) -> None:
        """Write the buffered COMPLETED records (BatchWriteItem, 25 per call, unprocessed ones retried)."""
        self.write_completed(self.take_completed())

    def take_completed(self) -> list[dict[str, Any]]:
        """End the batch: its buffered COMPLETED records as ``Put`` entries, for the caller to write
        (the worker's settle hands them to :meth:`write_completed`)."""
        records, self._completed, self._locked, self._running = (
            list(self._completed.values()),
            {},
            set(),
            set(),
        )
        self._keys, self._read, self._done = {}, set(), {}
        return [{"TableName": self.table_name, "Item": self._completed_item(record)} for record in records]

    def write_completed(self, puts: Sequence[dict[str, Any]]) -> None:
        """COMPLETED records taken by :meth:`take_completed`, with BatchWriteItem (25 per call)."""
        requests: list[Any] = [{"PutRequest": {"Item": put["Item"]}} for put in puts]
        for attempt in range(8):
            if not requests:
                return
            chunk, requests = requests[:MAX_BATCH_WRITE], requests[MAX_BATCH_WRITE:]
            try:
                response = self.client.batch_write_item(RequestItems={self.table_name: chunk})
            except Exception as exc:  # the locks expire with the invocation; a later copy may run again
                logger.error(
                    "idempotency records not written", extra={"records": len(chunk), "error": str(exc)}
                )
                continue
            requests.extend((response.get("UnprocessedItems") or {}).get(self.table_name, []))
            if attempt == 7 and requests:
                logger.error("idempotency records left unprocessed", extra={"records": len(requests)})

    # -- Powertools' per-call hooks ----------------------------------------------------------------------
    def _completed_item(self, record: DataRecord) -> dict[str, Any]:
        return {
            self.key_attr: {"S": record.idempotency_key},
            self.expiry_attr: {"N": str(record.expiry_timestamp)},
            self.status_attr: {"S": record.status},
            self.data_attr: {"S": record.response_data},
        }

    def _put_record(self, data_record: DataRecord) -> None:
        key = data_record.idempotency_key
        if key in self._completed:  # a second copy in the same batch: done, as the stored record will say
            raise IdempotencyItemAlreadyExistsError(old_data_record=self._completed[key])
        if key in self._locked:  # the batch holds the lock: this call uses it
            self._locked.remove(key)
            self._running.add(key)
            return
        try:
            super()._put_record(data_record)
        except IdempotencyItemAlreadyExistsError as exc:
            held = exc.old_data_record
            expiry = held.in_progress_expiry_timestamp if held is not None else None
            self.held_until_ms = int(expiry) if expiry is not None else None  # a Decimal, as deserialized
            raise

    def commit_with_effects(
        self, data_record: DataRecord, effects: Sequence[dict[str, Any]], *, locked: bool = True
    ) -> None:
        """The COMPLETED record and ``effects`` in one transaction (the inbox pattern).

        The record's condition fails only where another copy completed the message: its effects are
        the ones written, these never are (:class:`EffectsAlreadyCommittedError`). Any other refusal
        or error writes nothing either: the lock is given back (only while it is still a lock, in case
        the transaction did go through unseen) and the message fails, to be run again. A transaction
        cancelled only because another one held an item is retried first (:func:`_conflicted`).
        """
        key = data_record.idempotency_key
        self._running.discard(key)
        record = {
            "Put": {
                "TableName": self.table_name,
                "Item": self._completed_item(data_record),
                "ConditionExpression": _COMMIT_CONDITION,
                "ExpressionAttributeNames": {"#id": self.key_attr, "#status": self.status_attr},
                "ExpressionAttributeValues": {":in_progress": {"S": "INPROGRESS"}},
            }
        }
        try:
            # another writer's transaction held an item for a moment: the same write again, after a
            # jittered pause, while the invocation has the time
            retrying_conflicts(
                lambda: self.client.transact_write_items(TransactItems=[*effects, record]),  # type: ignore[list-item]
                attempts=COMMIT_ATTEMPTS,
                conflicted=_conflicted,
            )
        except ClientError as exc:
            self._not_committed(exc, data_record, effects, locked=locked)

    def _not_committed(
        self, exc: ClientError, data_record: DataRecord, effects: Sequence[dict[str, Any]], *, locked: bool
    ) -> NoReturn:
        """Raise what a refused commit means: done by another copy, or not written (lock given back)."""
        reasons = exc.response.get("CancellationReasons") or []
        if len(reasons) == len(effects) + 1 and reasons[-1].get("Code") == "ConditionalCheckFailed":
            raise EffectsAlreadyCommittedError(
                "another copy of this message committed its effects", old_data_record=data_record
            ) from exc
        if locked:
            self._give_back_lock(data_record.idempotency_key)
        refused = [
            f"{index}: {reason.get('Code')} {reason.get('Message', '')}".strip()
            for index, reason in enumerate(reasons[:-1])
            if reason.get("Code") not in (None, "None")
        ]
        raise EffectsNotCommittedError(
            f"the effects and the idempotency record were not written ({'; '.join(refused) or exc})"
        ) from exc

    def _give_back_lock(self, key: str) -> None:
        try:
            self.client.delete_item(
                TableName=self.table_name,
                Key=self._get_key(key),
                ConditionExpression="#status = :in_progress",
                ExpressionAttributeNames={"#status": self.status_attr},
                ExpressionAttributeValues={":in_progress": {"S": "INPROGRESS"}},
            )
        except Exception as exc:  # a lock expires with the invocation that took it
            logger.warning("idempotency lock not given back", extra={"error": str(exc)})

    def _update_record(self, data_record: DataRecord) -> None:
        if self.effects:
            self.commit_with_effects(data_record, self.effects)
            return
        key = data_record.idempotency_key
        if key not in self._running:
            super()._update_record(data_record)
            return
        self._running.remove(key)
        self._completed[key] = data_record

    def _delete_record(self, data_record: DataRecord) -> None:
        self._running.discard(data_record.idempotency_key)
        super()._delete_record(data_record)


class IdempotentProcessor:
    """``process`` behind Powertools idempotency keyed by ``envelope.id``, locked and recorded per batch."""

    def __init__(
        self,
        process: Processor,
        table_name: str,
        expires_after_seconds: int,
        *,
        client: DynamoDBClient | None = None,
        powertools: PowertoolsSettings | None = None,
        locking: bool = True,
    ) -> None:
        self._process = process
        # exactly once (a lock before each message runs) or at least once (a record after it)
        self._locking = locking
        # ``POWERTOOLS_IDEMPOTENCY_DISABLED``, which ``idempotent_function`` reads too: then it makes no
        # record, and the batch takes no lock either. A function's environment does not change while
        # it runs, so it is read once per container.
        self._disabled = (powertools or PowertoolsSettings.from_env()).idempotency_disabled
        self.persistence = BatchedPersistenceLayer(table_name, client=client)
        self.config = IdempotencyConfig(event_key_jmespath="id", expires_after_seconds=expires_after_seconds)
        # what idempotent_function does at its first call; lock() may come before any call
        self.persistence.configure(self.config, key_prefix=KEY_PREFIX)

        @idempotent_function(
            data_keyword_argument="envelope",
            persistence_store=self.persistence,
            config=self.config,
            key_prefix=KEY_PREFIX,
        )
        def run(*, envelope: Envelope, work: WorkContext) -> dict[str, Any]:
            return process(envelope, work)

        self._run = run
        self._context: LambdaContext | None = None

    @property
    def locking(self) -> bool:
        """Whether each message's record is locked before it runs (exactly once) or not (at least once)."""
        return self._locking and not self._disabled

    def register_context(self, context: LambdaContext) -> None:
        """Lets an in-progress record of a killed invocation expire with it."""
        self._context = context
        self.config.register_lambda_context(context)

    def _remaining_ms(self) -> int:
        return self._context.get_remaining_time_in_millis() if self._context else 0

    def lock(self, envelopes: Sequence[Envelope]) -> None:
        """Take the locks of ``envelopes`` the batch does not hold yet (before any of them runs)."""
        if not envelopes or self._disabled:
            return
        if self._locking:
            self.persistence.lock_batch(envelopes, self._remaining_ms())
        else:
            self.persistence.read_batch(envelopes)

    def unlock(self, envelopes: Sequence[Envelope]) -> None:
        """Give back the locks of ``envelopes`` the batch took but did not use."""
        if envelopes and not self._disabled and self._locking:
            self.persistence.unlock_batch(envelopes)

    def flush(self) -> None:
        self.persistence.flush()

    def take_completed(self) -> list[dict[str, Any]]:
        return self.persistence.take_completed()

    def write_completed(self, puts: Sequence[dict[str, Any]]) -> None:
        self.persistence.write_completed(puts)

    def __call__(self, envelope: Envelope, work: WorkContext) -> dict[str, Any]:
        # The list itself: what the processor adds while it runs is there when the record is written.
        self.persistence.effects = work.effects
        try:
            if self._disabled:  # no record to write them with: the effects alone, in one transaction
                result = self._process(envelope, work)
                if work.effects:
                    self.persistence.client.transact_write_items(TransactItems=work.effects)  # type: ignore[arg-type]
                return result
            if not self._locking:
                return self._run_unlocked(envelope, work)
            if self.persistence.use_lock(envelope):
                return self._run_locked(envelope, work)
            self.persistence.held_until_ms = None
            try:
                result = self._run(envelope=envelope, work=work)
            except IdempotencyPersistenceLayerError as exc:
                if isinstance(exc.__cause__, EffectsAlreadyCommittedError):
                    return {}  # another copy's effects stand; this copy is done without its own
                raise
            except IdempotencyAlreadyInProgressError as exc:
                until = self.persistence.held_until_ms
                if until is None:
                    raise
                retry_in_s = max(0.0, (until - time.time() * 1000) / 1000)
                raise HeldElsewhereError(str(exc), retry_in_s) from exc
            return result
        finally:
            self.persistence.effects = None

    def _run_unlocked(self, envelope: Envelope, work: WorkContext) -> dict[str, Any]:
        """At least once: skip a message whose record says completed, else run it and record it after."""
        key = self.persistence.key_of(envelope)
        done = self.persistence.done_response(key)
        if done is not None:
            return done
        result = self._process(envelope, work)
        with contextlib.suppress(EffectsAlreadyCommittedError):  # another copy's effects stand
            self.persistence.record_success(key, result)
        return result

    def _run_locked(self, envelope: Envelope, work: WorkContext) -> dict[str, Any]:
        """What ``idempotent_function`` does once ``save_inprogress`` succeeded, for a lock the batch took.

        The per-call machinery (a handler object, the payload dumped and deep-copied, the key hashed
        three times) cost more than the rest of the message; the steps and records are Powertools'
        own: run, then ``save_success`` (buffered COMPLETED record), or ``delete_record`` and re-raise.
        """
        data = {"id": processing_id(envelope)}
        try:
            result = self._process(envelope, work)
        except Exception as exc:
            try:
                self.persistence.delete_record(data=data, exception=exc)
            except Exception as delete_exc:
                raise IdempotencyPersistenceLayerError(
                    "Failed to delete record from idempotency store", delete_exc
                ) from delete_exc
            raise
        with contextlib.suppress(EffectsAlreadyCommittedError):  # another copy's effects stand
            self.persistence.save_success(data=data, result=result)
        return result
