"""SQS event source mappings, emulated as the Lambda service runs them (moto stores mappings but runs none).

Per mapping, one poller: it re-reads the mapping from moto about once a second (one
``ListEventSourceMappings`` a second serves every poller, :class:`MappingConfigs`), so
``UpdateEventSourceMapping`` — the controller enabling or disabling a sideline
drainer, a new batch size or maximum concurrency — takes effect as it would in AWS; a disabled
mapping does not poll. While enabled it receives up to ``BatchSize`` messages, waiting up to
``MaximumBatchingWindowInSeconds`` to fill a batch, and invokes the function with at most
``ScalingConfig.MaximumConcurrency`` batches in flight (it does not receive what it cannot invoke,
so the rest waits in the queue). After an invocation it deletes what succeeded: everything, or,
with ``ReportBatchItemFailures``, all but the ``batchItemFailures``; after a function error it
deletes nothing. The batch's slot is free as soon as the function returns: the deletes are the
service's, not an invocation, so the next batch does not wait for them. Whatever is not deleted
becomes visible again when its visibility timeout ends, and SQS's redrive policy moves it to the
DLQ after ``maxReceiveCount`` receives.

A chaos run may give a mapping :class:`DeliveryFaults`: the duplicate deliveries SQS's at-least-once
delivery allows, at a rate per received message.

A mapping in provisioned mode (``ProvisionedPollerConfig``) has several pollers instead: always
``MinimumPollers`` of them receiving, even from an empty queue, each with up to
:data:`INVOCATIONS_PER_POLLER` batches in flight, as Lambda documents a poller. When every poller
holds all the batches it may and messages keep coming, one more starts, up to ``MaximumPollers``; a
poller above the minimum that finds the queue empty stops. Such a mapping has no concurrency setting
of its own beyond its pollers, so the function's execution environments bound it, as they bound a
mapping without ``MaximumConcurrency``: no more batches in flight than the function has containers
(the runtime gives it what the maximum pollers run, unless capped), and no more pollers either.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from local.emulator.discovery import INVOCATIONS_PER_POLLER, MappingSpec
from local.emulator.embedded_aws import REGION, AwsClients, EmbeddedAws
from local.emulator.functions import FunctionPool, Invocation

log = logging.getLogger("breakwater.local.mappings")

REFRESH_SECONDS = 1.0
POLL_WAIT_SECONDS = 1  # long polling, shortened so a disable or a stop is noticed within a second


@dataclass
class MappingStats:
    polls: int = 0
    empty_polls: int = 0
    invocations: int = 0
    function_errors: int = 0
    received: int = 0
    deleted: int = 0
    reported_failures: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    pollers: int = 0  # receiving now
    max_pollers: int = 0  # the most that received at once
    batch_sizes: list[int] = field(default_factory=list)


@dataclass
class MappingState:
    enabled: bool
    batch_size: int
    window_s: float
    max_concurrency: int  # batches in flight, on demand (the one poller's bound)
    report_failures: bool
    # Provisioned mode: the bounds of ProvisionedPollerConfig; None: on demand, one poller.
    minimum_pollers: int | None = None
    maximum_pollers: int | None = None


class MappingConfigs:
    """Every event source mapping's configuration, as moto has it, from one ``ListEventSourceMappings``.

    Each poller re-reads its mapping about once a second; with one ``GetEventSourceMapping`` each,
    every poller sent the one moto process a request a second, for a configuration that changes a
    few times a run. The pollers share one instance: a read older than ``max_age`` lists every
    mapping again, once for all of them. Not counted as the functions' requests (the Lambda service
    has its mappings in hand).
    """

    def __init__(self, aws: AwsClients) -> None:
        self._lambda = aws.client("lambda", counted=False)
        self._lock = threading.Lock()
        self._configs: dict[str, dict[str, Any]] = {}
        self._read_at = float("-inf")

    def get(self, uuid: str, max_age: float) -> dict[str, Any]:
        """``uuid``'s configuration, read at most ``max_age`` seconds ago (moto's error if there is none)."""
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= max_age or uuid not in self._configs:
                configs: dict[str, dict[str, Any]] = {}
                kwargs: dict[str, Any] = {}
                while True:
                    page = self._lambda.list_event_source_mappings(**kwargs)
                    configs.update((m["UUID"], m) for m in page.get("EventSourceMappings", []))
                    if not page.get("NextMarker"):
                        break
                    kwargs["Marker"] = page["NextMarker"]
                self._configs, self._read_at = configs, now
            config = self._configs.get(uuid)
        if config is None:
            return dict(self._lambda.get_event_source_mapping(UUID=uuid))  # raises moto's not-found error
        return config


class DeliveryFaults:
    """Duplicate deliveries, each received message picked at ``rate``, in one of three ways (:data:`KINDS`).

    - ``same_batch``: its record twice in the batch;
    - ``concurrent``: also in a batch of its own, invoked at once beside the batch (two consumers
      received it);
    - ``undeleted``: after the function succeeded with it, it is not deleted: it comes back after its
      visibility timeout (a delete that was lost).

    ``counts`` is per kind, shared by every mapping given this instance.
    """

    KINDS = ("same_batch", "concurrent", "undeleted")

    def __init__(self, rate: float, seed: int) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be between 0 and 1, not {rate!r}")
        self.rate = rate
        self.counts: Counter[str] = Counter()
        self._draw = random.Random(seed)  # which messages: a fault schedule, not a secret
        self._lock = threading.Lock()

    def pick(self, batch: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        """The batch's messages each kind picked (most lists empty)."""
        picked: dict[str, list[dict[str, Any]]] = {kind: [] for kind in self.KINDS}
        with self._lock:
            for message in batch:
                if self._draw.random() < self.rate:
                    kind = self._draw.choice(self.KINDS)
                    picked[kind].append(message)
                    self.counts[kind] += 1
        return picked


def sqs_record(message: dict[str, Any], source_arn: str) -> dict[str, Any]:
    """One record of the SQS event Lambda delivers (lower-camel keys, string attributes)."""
    attributes = {key: str(value) for key, value in message.get("Attributes", {}).items()}
    message_attributes = {}
    for name, value in message.get("MessageAttributes", {}).items():
        message_attributes[name] = {
            "stringValue": value.get("StringValue"),
            "binaryValue": value.get("BinaryValue"),
            "stringListValues": value.get("StringListValues", []),
            "binaryListValues": value.get("BinaryListValues", []),
            "dataType": value.get("DataType"),
        }
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": attributes,
        "messageAttributes": message_attributes,
        "md5OfBody": message.get("MD5OfBody", ""),
        "eventSource": "aws:sqs",
        "eventSourceARN": source_arn,
        "awsRegion": REGION,
    }


def failed_ids(invocation: Invocation, batch_ids: list[str], report_failures: bool) -> set[str]:
    """Message ids that must not be deleted after ``invocation`` (all of them after a function error).

    With ReportBatchItemFailures, a response naming an id that is not in the batch (or that is not
    the documented shape) fails the whole batch, as Lambda does.
    """
    if not invocation.ok:
        return set(batch_ids)
    if not report_failures:
        return set()
    result = invocation.result
    if result is None:
        return set()
    if not isinstance(result, dict):
        return set(batch_ids)
    failures = result.get("batchItemFailures") or []
    ids = set()
    for failure in failures:
        identifier = failure.get("itemIdentifier") if isinstance(failure, dict) else None
        if not identifier or identifier not in batch_ids:
            return set(batch_ids)
        ids.add(identifier)
    return ids


class SqsMapping:
    """The poller of one SQS event source mapping."""

    def __init__(
        self,
        spec: MappingSpec,
        pool: FunctionPool,
        aws: EmbeddedAws,
        executor: ThreadPoolExecutor,
        *,
        default_max_concurrency: int,
        on_invocation: Callable[[MappingSpec, list[dict[str, Any]], Invocation, float], None] | None = None,
        configs: MappingConfigs | None = None,
    ) -> None:
        if spec.queue_url is None:
            raise ValueError(f"mapping {spec.uuid} is not an SQS mapping")
        self.spec = spec
        self.queue_url: str = spec.queue_url
        self._pool = pool
        self._configs = configs or MappingConfigs(aws)  # the runtime passes one for all its pollers
        self._sqs = aws.client("sqs")
        self._executor = executor
        self._default_max_concurrency = default_max_concurrency
        self._on_invocation = on_invocation
        self._stop = threading.Event()
        self._slots = threading.Condition()
        self._settling = 0  # batches whose invocation returned and whose deletes are still being made
        self._state: MappingState | None = None
        self._state_read_at = 0.0
        self.stats = MappingStats()
        self.faults: DeliveryFaults | None = None  # a chaos run's duplicate deliveries
        self._threads: list[threading.Thread] = []
        self._started = 0  # pollers started so far, which names them

    def start(self) -> SqsMapping:
        with self._slots:
            self._start_poller()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._slots:
            self._slots.notify_all()
            threads = list(self._threads)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def drain(self, timeout: float = 30.0) -> None:
        """Wait until no invocation of this mapping is in flight and every returned batch is deleted."""
        deadline = time.monotonic() + timeout
        with self._slots:
            while (self.stats.in_flight or self._settling) and time.monotonic() < deadline:
                self._slots.wait(0.1)

    def state(self) -> MappingState:
        now = time.monotonic()
        if self._state is None or now - self._state_read_at >= REFRESH_SECONDS:
            config = self._configs.get(self.spec.uuid, REFRESH_SECONDS)
            scaling = config.get("ScalingConfig") or {}
            pollers = config.get("ProvisionedPollerConfig") or {}
            self._state = MappingState(
                enabled=config.get("State") in ("Enabled", "Enabling", "Updating"),
                batch_size=int(config.get("BatchSize") or 10),
                window_s=float(config.get("MaximumBatchingWindowInSeconds") or 0),
                max_concurrency=int(scaling.get("MaximumConcurrency") or self._default_max_concurrency),
                report_failures="ReportBatchItemFailures" in (config.get("FunctionResponseTypes") or []),
                # Lambda's defaults for an SQS mapping when a bound is left out.
                minimum_pollers=int(pollers.get("MinimumPollers") or 2) if pollers else None,
                maximum_pollers=int(pollers.get("MaximumPollers") or 200) if pollers else None,
            )
            self._state_read_at = now
        return self._state

    def _poller_bounds(self, state: MappingState) -> tuple[int, int]:
        """How few and how many pollers receive for the mapping now (one on demand, or disabled).

        No more pollers than the function has containers: one that could never hold a batch in flight
        would only add receives.
        """
        if state.maximum_pollers is None or state.minimum_pollers is None or not state.enabled:
            return 1, 1
        ceiling = max(1, min(state.maximum_pollers, self._default_max_concurrency))
        return min(state.minimum_pollers, ceiling), ceiling

    def _limit(self, state: MappingState) -> int:
        """Batches in flight the mapping allows now (called holding ``_slots``)."""
        if state.maximum_pollers is None:
            return state.max_concurrency
        return min(self.stats.pollers * INVOCATIONS_PER_POLLER, self._default_max_concurrency)

    def _start_poller(self) -> None:
        """One more poller (called holding ``_slots``)."""
        self._started += 1
        thread = threading.Thread(
            target=self._run, name=f"esm-{self.spec.uuid[:8]}-{self._started}", daemon=True
        )
        # Pollers come and go with the load: keep only the running ones for stop() to join.
        self._threads = [running for running in self._threads if running.is_alive()] + [thread]
        self.stats.pollers += 1
        self.stats.max_pollers = max(self.stats.max_pollers, self.stats.pollers)
        thread.start()

    def _fit_pollers(self, state: MappingState, *, idle: bool) -> bool:
        """Start the pollers the minimum still lacks; True when the calling poller is one too many.

        A poller is one too many above the maximum, or above the minimum when it found the queue empty.
        """
        floor, ceiling = self._poller_bounds(state)
        with self._slots:
            while self.stats.pollers < floor and not self._stop.is_set():
                self._start_poller()
            if self.stats.pollers > ceiling or (idle and self.stats.pollers > floor):
                self.stats.pollers -= 1
                self._slots.notify_all()
                return True
            return False

    def _scale_up(self, state: MappingState) -> None:
        """After a batch: one more poller when every running poller holds all the batches it may."""
        _, ceiling = self._poller_bounds(state)
        with self._slots:
            busy = self.stats.in_flight >= self.stats.pollers * INVOCATIONS_PER_POLLER
            grow = state.maximum_pollers is not None and busy and self.stats.pollers < ceiling
            if grow and not self._stop.is_set():
                self._start_poller()

    def _acquire_slot(self, state: MappingState) -> bool:
        with self._slots:
            while self.stats.in_flight >= self._limit(state) and not self._stop.is_set():
                self._slots.wait(0.2)
            if self._stop.is_set():
                return False
            self.stats.in_flight += 1
            self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
            return True

    def _release_slot(self) -> None:
        with self._slots:
            self.stats.in_flight -= 1
            self._slots.notify_all()

    def _invocation_returned(self) -> None:
        """The function returned: its slot is free now, while the poller deletes what succeeded.

        ``MaximumConcurrency`` bounds the function's concurrent invocations; the service's
        ``DeleteMessageBatch`` after one is not an invocation, so it does not hold the slot.
        """
        with self._slots:
            self.stats.in_flight -= 1
            self._settling += 1
            self._slots.notify_all()

    def _settled(self) -> None:
        with self._slots:
            self._settling -= 1
            self._slots.notify_all()

    def _receive(self, state: MappingState) -> list[dict[str, Any]]:
        """One batch: up to BatchSize messages, gathered for at most the batching window after the first."""
        batch: list[dict[str, Any]] = []
        window_ends = 0.0
        while len(batch) < state.batch_size and not self._stop.is_set():
            self.stats.polls += 1
            messages = self._sqs.receive_message(
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=min(10, state.batch_size - len(batch)),
                WaitTimeSeconds=0 if batch else POLL_WAIT_SECONDS,
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            if not messages:
                self.stats.empty_polls += 1
                if not batch:
                    break
            if not batch:
                window_ends = time.monotonic() + state.window_s
            batch.extend(messages)
            if state.window_s == 0:
                if len(messages) < 10:
                    break  # no window: take what one receive (or a run of full ones) brings
                continue
            remaining = window_ends - time.monotonic()
            if remaining <= 0:
                break
            if not messages:
                time.sleep(min(0.05, remaining))
        return batch

    def _run(self) -> None:
        """One poller: receives while the mapping is enabled, until it is stopped or one too many."""
        retired = False
        try:
            retired = self._poll()
        finally:
            if not retired:
                with self._slots:
                    self.stats.pollers -= 1

    def _poll(self) -> bool:
        """Poll until stopped (False) or until this poller is one too many (True, already uncounted)."""
        idle = False
        while not self._stop.is_set():
            try:
                state = self.state()
                if self._fit_pollers(state, idle=idle):
                    return True
                idle = False
                if not state.enabled:
                    self._stop.wait(REFRESH_SECONDS)
                    continue
                if not self._acquire_slot(state):
                    return False
                batch = self._receive(state)
                if not batch:
                    self._release_slot()
                    idle = True
                    continue
                self.stats.received += len(batch)
                self._executor.submit(self._invoke, batch, state.report_failures)
                self._scale_up(state)
            except Exception:  # keep polling, as the service does; the error is logged
                log.exception("mapping %s: poll failed", self.spec.uuid)
                self._stop.wait(1.0)
        return False

    def _invoke(self, batch: list[dict[str, Any]], report_failures: bool) -> None:
        returned = False
        try:
            undeleted: set[str] = set()
            if self.faults is not None:
                picked = self.faults.pick(batch)
                batch = batch + picked["same_batch"]
                for message in picked["concurrent"]:
                    self._invoke_copy(message, report_failures)
                undeleted = {message["MessageId"] for message in picked["undeleted"]}
            event = {"Records": [sqs_record(message, self.spec.source_arn) for message in batch]}
            delivered_at = time.time()
            invocation = self._pool.invoke(event, source=self.spec.source_arn)
            self._invocation_returned()
            returned = True
            ids = [message["MessageId"] for message in batch]
            keep = failed_ids(invocation, ids, report_failures) | undeleted
            done = list({m["MessageId"]: m for m in batch if m["MessageId"] not in keep}.values())
            self._delete(done)
            self.stats.invocations += 1
            self.stats.batch_sizes.append(len(batch))
            self.stats.deleted += len(done)
            self.stats.function_errors += 0 if invocation.ok else 1
            self.stats.reported_failures += len(keep) if invocation.ok else 0
            if not invocation.ok:
                log.warning("mapping %s: function error %s", self.spec.uuid, invocation.error)
            if self._on_invocation is not None:
                self._on_invocation(self.spec, batch, invocation, delivered_at)
        except Exception:
            log.exception("mapping %s: invocation failed", self.spec.uuid)
        finally:
            if returned:
                self._settled()
            else:
                self._release_slot()

    def _delete(self, messages: list[dict[str, Any]]) -> None:
        for start in range(0, len(messages), 10):
            chunk = messages[start : start + 10]
            self._sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(chunk)],
            )

    def _invoke_copy(self, message: dict[str, Any], report_failures: bool) -> None:
        """A duplicate delivery of ``message`` in a batch of its own, beside the batch that has it.

        Outside the mapping's concurrency (another consumer received it), but waited for by
        :meth:`drain` like a batch being deleted.
        """
        with self._slots:
            self._settling += 1

        def run() -> None:
            try:
                event = {"Records": [sqs_record(message, self.spec.source_arn)]}
                delivered_at = time.time()
                invocation = self._pool.invoke(event, source=self.spec.source_arn)
                if not failed_ids(invocation, [message["MessageId"]], report_failures):
                    self._delete([message])
                if self._on_invocation is not None:
                    self._on_invocation(self.spec, [message], invocation, delivered_at)
            except Exception:
                log.exception("mapping %s: duplicate delivery failed", self.spec.uuid)
            finally:
                self._settled()

        self._executor.submit(run)
