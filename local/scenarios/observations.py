"""What a scenario run sees of the emulated system: API answers, first deliveries, queue depths, counters.

Times are seconds after the start of the load. The first deliveries come from the runtime's mapping
hook (:func:`observe_deliveries`) and, independently, from the workers' EMF output
(:func:`emf_first_attempts`); queue depths from ``GetQueueAttributes``; the workers' per-tenant
counters from the state table; AWS requests from the botocore events counted in every container
and in the runtime's own clients, and what AWS would bill for them (:func:`usage_snapshot`,
:func:`cost_section`).
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
from local.pricing import cost
from local.pricing.usage import less

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


LAMBDA_SERVICE = "lambda-service"  # the runtime's own counted clients: the mappings' pollers
API_GATEWAY = "api-gateway"


def usage_snapshot(runtime: LocalRuntime) -> dict[str, dict[str, float]]:
    """The billed units counted so far, by where they arose: each function (its logical id), the Lambda
    service's event source mappings (:data:`LAMBDA_SERVICE`, their SQS and Kinesis reads are billed to
    the account) and the API (:data:`API_GATEWAY`)."""
    parts = {logical_id: dict(pool.usage) for logical_id, pool in runtime.pools.items()}
    parts[LAMBDA_SERVICE] = runtime.aws.usage.snapshot()
    parts[API_GATEWAY] = {
        "apigateway.rest_requests": float(runtime.api.billed_requests if runtime.api else 0)
    }
    return parts


def usage_between(
    after: dict[str, dict[str, float]], before: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    return {part: less(units, before.get(part, {})) for part, units in after.items()}


def emf_metrics(runtime: LocalRuntime, since: float, until: float) -> int:
    """Distinct custom metrics (namespace, name, dimension values) the functions emitted as EMF in
    [``since``, ``until``] (epoch seconds): what CloudWatch bills per metric-month."""
    seen: set[tuple[str, str, tuple[tuple[str, str], ...]]] = set()
    for _function, blob in runtime.logs.blobs():
        meta = blob.get("_aws") or {}
        stamp = int(meta.get("Timestamp", 0)) / 1000
        if not since <= stamp <= until:
            continue
        for directive in meta.get("CloudWatchMetrics") or []:
            namespace = str(directive.get("Namespace", ""))
            dimension_sets = directive.get("Dimensions") or [[]]
            for metric in directive.get("Metrics") or []:
                for names in dimension_sets:
                    dimensions = tuple((str(n), str(blob.get(n, ""))) for n in names)
                    seen.add((namespace, str(metric.get("Name", "")), dimensions))
    return len(seen)


def cost_section(
    runtime: LocalRuntime,
    usage_by_part: dict[str, dict[str, float]],
    *,
    delivered: int,
    started: float,
    ended: float,
    requests: int | None = None,
) -> dict[str, Any]:
    """The report's cost: $ per million delivered messages by service (:func:`cost.cost_summary`).

    The functions' GB-seconds are priced for their architecture in the template. The scheduled
    functions run ``schedule_speedup`` times as often here as the template says: their usage is
    priced at the template's rate (divided by it), so compressed time does not inflate their share.
    Kinesis shards and custom metrics are billed by the hour: priced over the run's window.
    """
    assert runtime.assembly is not None
    speedup = max(1.0, float(runtime.options.schedule_speedup))
    scheduled = {lid for schedule in runtime.schedule_specs for lid in schedule.function_logical_ids}
    resources = runtime.assembly.resources("AWS::Lambda::Function")
    parts: dict[str, dict[str, float]] = {}
    for part, units in usage_by_part.items():
        priced = dict(units)
        if part in runtime.pools:
            logical_id = part
            properties = resources.get(logical_id, {}).get("Properties", {})
            architecture = (properties.get("Architectures") or ["x86_64"])[0]
            if "lambda.gb_seconds" in priced:
                priced[cost.lambda_duration_unit(architecture)] = priced.pop("lambda.gb_seconds")
            if logical_id in scheduled:
                priced = {unit: quantity / speedup for unit, quantity in priced.items()}
        parts[part] = priced
    shards = on_demand = 0
    for stream in runtime.assembly.resources("AWS::Kinesis::Stream").values():
        properties = stream.get("Properties", {})
        if (properties.get("StreamModeDetails") or {}).get("StreamMode") == "ON_DEMAND":
            on_demand += 1
        else:
            shards += int(properties.get("ShardCount") or 1)
    window_s = max(0.0, ended - started)
    parts["hourly"] = cost.hourly_usage(
        window_s, shards=shards, on_demand_streams=on_demand, metrics=emf_metrics(runtime, started, ended)
    )
    summary = cost.cost_summary(
        cost.add(parts.values()), delivered, window_s, by_part=parts, requests=requests
    )
    summary["scheduled_functions_scaled_by"] = 1 / speedup
    return summary
