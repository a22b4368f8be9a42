"""What a scenario run sees of the emulated system: API answers, first deliveries, queue depths, counters.

Times are seconds after the start of the load. The first deliveries come from the runtime's mapping
hook (:func:`observe_deliveries`) and, independently, from the workers' EMF output
(:func:`emf_first_attempts`); queue depths from ``GetQueueAttributes``; the workers' per-tenant
counters from the state table; AWS requests from the botocore events counted in every container
and in the runtime's own clients.
"""

from __future__ import annotations

import json
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from local.emulator.discovery import MappingSpec
from local.emulator.functions import Invocation
from local.emulator.runtime import LocalRuntime

FIRST_ATTEMPT_PROPERTY = "AgeOfFirstAttemptByTenant"  # breakwater.worker.FIRST_ATTEMPT_PROPERTY
COUNTER_NAMES = ("processed", "dropped", "sidelined", "spilled", "deferred", "failed")


@dataclass
class Observations:
    """Everything the run saw, with times relative to the start of the load."""

    started: float = 0.0
    accepted: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    accepted_at: list[tuple[float, str]] = field(default_factory=list)  # (t of the 202, tenant)
    throttled: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    rejected: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    # (t of first attempt, tenant, age ms, queue role) for records delivered with ApproximateReceiveCount 1
    first_attempts: list[tuple[float, str, float, str]] = field(default_factory=list)
    # (t, live visible+in flight, sideline visible+in flight, dlq)
    depths: list[tuple[float, int, int, int]] = field(default_factory=list)
    # accepted messages per tag the scenario gave them ("poison")
    accepted_tagged: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, tenant: str, status: int, t: float, tag: str = "") -> None:
        """One answer of the API to ``tenant``, ``t`` seconds after the start of the load."""
        with self.lock:
            if status == 202:
                self.accepted[tenant] += 1
                self.accepted_at.append((t, tenant))
                if tag:
                    self.accepted_tagged[tag] += 1
            elif status == 429:
                self.throttled[tenant] += 1
            else:
                self.rejected[tenant] += 1


def _queue_role(source_arn: str) -> str:
    name = source_arn.rsplit(":", 1)[-1]
    for role in ("spillover", "backlog", "surge"):
        if role in name:
            return role
    return "live"


def observe_deliveries(observations: Observations) -> Any:
    """The runtime's mapping hook: the age of each message at its first delivery to a worker."""

    def on_invocation(
        spec: MappingSpec, batch: list[dict[str, Any]], invocation: Invocation, at: float
    ) -> None:
        role = _queue_role(spec.source_arn)
        rows = []
        for message in batch:
            if message.get("Attributes", {}).get("ApproximateReceiveCount") != "1":
                continue
            try:
                envelope = json.loads(message["Body"])
                rows.append(
                    (at - observations.started, envelope["tenant"], at * 1000 - envelope["enqueued_at"], role)
                )
            except (ValueError, KeyError, TypeError):
                continue
        with observations.lock:
            observations.first_attempts.extend(rows)

    return on_invocation


def queue_depths(runtime: LocalRuntime, client: Any, *, last_dlq: int | None = None) -> tuple[int, int, int]:
    """(live, sideline, dlq) messages: visible + in flight + delayed, from GetQueueAttributes.

    Each queue is one request to the emulator, which is the demo's serial resource (one moto process):
    pass ``last_dlq`` to reuse the previous DLQ total instead of asking the dozen DLQs again.
    """
    assert runtime.deployment is not None
    live = sideline = dlq = 0
    for key, url in runtime.deployment.outputs.items():
        if not key.endswith("Url") or "sqs" not in url:
            continue
        if "Dlq" in key and last_dlq is not None:
            continue
        attributes = client.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesDelayed",
            ],
        )["Attributes"]
        count = sum(int(value) for value in attributes.values())
        if "Dlq" in key:
            dlq += count
        elif key.startswith("Live"):
            live += count
        else:
            sideline += count
    return live, sideline, dlq if last_dlq is None else last_dlq


def tenant_counters(runtime: LocalRuntime, tenants: list[str]) -> dict[str, dict[str, int]]:
    """The per-tenant counters the workers flush to the state table (``tenant#<id>`` / ``counters``)."""
    client = runtime.aws.client("dynamodb", counted=False)
    table = runtime.output("StateTableName")
    out: dict[str, dict[str, int]] = {}
    for tenant in tenants:
        item = client.get_item(
            TableName=table,
            Key={"pk": {"S": f"tenant#{tenant}"}, "sk": {"S": "counters"}},
            ConsistentRead=True,
        ).get("Item", {})
        out[tenant] = {name: int(item[name]["N"]) for name in COUNTER_NAMES if name in item}
    return out


def emf_first_attempts(runtime: LocalRuntime, started: float) -> list[tuple[float, str, float, str]]:
    """(t, tenant, age ms, queue role) per first attempt, from the workers' EMF output.

    The worker puts the batch's first-attempt ages per tenant in each blob as the property
    ``AgeOfFirstAttemptByTenant`` (``breakwater.worker.FIRST_ATTEMPT_PROPERTY``), beside the
    ``AgeOfFirstAttempt`` metric values; ``t`` is the blob's timestamp (the end of the batch).
    """
    rows: list[tuple[float, str, float, str]] = []
    for _function, blob in runtime.logs.blobs():
        by_tenant = blob.get(FIRST_ATTEMPT_PROPERTY)
        if not isinstance(by_tenant, dict):
            continue
        t = int(blob["_aws"].get("Timestamp", 0)) / 1000 - started
        role = str(blob.get("QueueRole", "live"))
        for tenant, ages in by_tenant.items():
            rows.extend((t, str(tenant), float(age), role) for age in ages)
    rows.sort()
    return rows


def aws_requests(runtime: LocalRuntime, by_function: dict[str, Counter[str]]) -> Counter[str]:
    """The runtime's own clients' requests plus the functions' (one snapshot of the pools)."""
    total = runtime.aws.requests.snapshot()
    for counts in by_function.values():
        total.update(counts)
    return total


def aws_requests_by_function(runtime: LocalRuntime) -> dict[str, Counter[str]]:
    """The requests each function's containers made (the runtime's own clients are not in here)."""
    return {pool.spec.name: Counter(pool.requests) for pool in runtime.pools.values()}


def dead_letter_messages(runtime: LocalRuntime, *, hide_seconds: int) -> list[dict[str, Any]]:
    """Every message in the stack's dead-letter queues, each once: received and hidden for ``hide_seconds``
    (long enough to read each queue to its end; they come back after it), not deleted."""
    assert runtime.deployment is not None
    client = runtime.aws.client("sqs", counted=False)
    found: list[dict[str, Any]] = []
    for name, url in runtime.deployment.outputs.items():
        if not (name.endswith("Url") and "Dlq" in name and "sqs" in url):
            continue
        seen: set[str] = set()
        while True:
            messages = client.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=hide_seconds, WaitTimeSeconds=0
            ).get("Messages", [])
            fresh = [m for m in messages if m["MessageId"] not in seen]
            if not fresh:
                break
            seen.update(m["MessageId"] for m in fresh)
            found.extend(fresh)
    return found
