"""The noisy-neighbour scenario: 20 tenants at steady rates, one bursting, driven through the local API.

Time is compressed through the blueprint's own configuration (the same context mechanism a user
has, see :data:`DEMO_CONTEXT`): smaller tier limits, a 10 s sideline age, a worker that spends
100 ms per message, and a controller schedule run every few seconds. The load is open-loop (each
tenant sends on its own schedule whatever happens to earlier requests), as real clients do. A
sideline queue past 40 waiting messages is archived (the controller starts the archiver); after the
load the demo replays the archive with the job's own entry point on a local SparkSession.
"""

from __future__ import annotations

import http.client
import json
import queue
import random
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from local.emulator.discovery import MappingSpec
from local.emulator.functions import Invocation
from local.emulator.runtime import LocalRuntime
from local.scenarios.stream_load import EventTraffic

# Applied to both runs; the naive run adds {"mode": "naive"}. Every key is one a fork can set in cdk.json.
DEMO_CONTEXT: dict[str, Any] = {
    "breakwater": {
        "tiers": {
            "standard": {
                "rate": 10,
                "burst": 20,
                "consumer_rate": 5,
                "concurrency": 2,
                "concurrency_floor": 1,
            }
        },
        # Archive budgets compressed like the rest: a sideline queue of 40 waiting messages is parked
        # in S3 (the age budget's floor is a minute, longer than a sidelined message waits here).
        "sideline": {
            "sideline_age_seconds": 10,
            "max_defer_seconds": 5,
            "defer_base_seconds": 1,
            "archive_age_seconds": 60,
            "archive_depth": 40,
        },
        "worker": {
            "batch_size": 10,
            "max_concurrency": 2,
            "timeout_seconds": 10,
            "visibility_timeout_multiplier": 3,
            "heartbeat_seconds": 5,
            "simulated_work_ms": 100,
        },
    }
}


@dataclass(frozen=True)
class Scenario:
    tenants: int = 20
    # messages per second, each quiet tenant: 20 x 0.5 = 10 msg/s at baseline, below what the emulator's
    # live workers deliver on 2 cores (about 13 msg/s, bounded by the one moto server process: see
    # docs/performance.md, Demo, and bench/demo_baseline.py); at 1 msg/s the baseline was saturated.
    quiet_rate: float = 0.5
    noisy_rate: float = 0.5  # the noisy tenant outside its burst
    burst_rate: float = 50.0  # 10 x the tier's consumer_rate (5/s)
    baseline_s: float = 15.0
    burst_s: float = 20.0
    after_s: float = 25.0
    drain_s: float = 20.0  # at most, after the load stops, for queues to empty
    senders: int = 12
    sample_s: float = 1.0
    replay: bool = True  # after the drain, replay what the archiver parked (when it parked anything)
    replay_rate: float = 50.0  # messages/s into the live queues (the workers still gate each tenant)
    # After the replay, at most this long for the replayed envelopes to be worked; what is left is
    # reported as queued (a parked tenant's envelopes drain at its consumer rate, 5/s here).
    replay_drain_s: float = 5.0
    # When each tenant sends its first message. "together": every tenant at t = 0, so the quiet tenants'
    # 2 s schedules stay in phase and their messages arrive in clumps of 19 (what `make demo` runs and
    # reports). "spread": each tenant's first send drawn uniformly from its first period with
    # ``phase_seed``, at the same rates: no clumps, so the baseline has no contention tail of its own
    # (docs/performance.md, Demo).
    phases: Literal["together", "spread"] = "together"
    phase_seed: int = 1

    def __post_init__(self) -> None:
        if self.phases not in ("together", "spread"):
            raise ValueError(f"phases must be 'together' or 'spread', not {self.phases!r}")

    def first_sends(self) -> dict[str, float]:
        """Each tenant's first send, in seconds after the start of the load (see ``phases``)."""
        if self.phases == "together":
            return {tenant: 0.0 for tenant in self.tenant_ids}
        draw = random.Random(self.phase_seed)  # a load schedule, not a secret
        return {tenant: draw.uniform(0.0, 1.0 / self.rate(tenant, 0.0)) for tenant in self.tenant_ids}

    @property
    def noisy(self) -> str:
        return "tenant-01"

    @property
    def tenant_ids(self) -> list[str]:
        return [f"tenant-{i:02d}" for i in range(1, self.tenants + 1)]

    @property
    def duration_s(self) -> float:
        return self.baseline_s + self.burst_s + self.after_s

    def rate(self, tenant: str, t: float) -> float:
        if tenant != self.noisy:
            return self.quiet_rate
        in_burst = self.baseline_s <= t < self.baseline_s + self.burst_s
        return self.burst_rate if in_burst else self.noisy_rate

    def phase(self, t: float) -> str:
        if t < self.baseline_s:
            return "baseline"
        if t < self.baseline_s + self.burst_s:
            return "burst"
        return "after"


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
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, tenant: str, status: int, t: float) -> None:
        """One answer of the API to ``tenant``, ``t`` seconds after the start of the load."""
        with self.lock:
            if status == 202:
                self.accepted[tenant] += 1
                self.accepted_at.append((t, tenant))
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


class LoadGenerator:
    """Open-loop senders: one schedule per tenant, a pool of keep-alive HTTP connections to the API."""

    def __init__(
        self, api_url: str, keys: dict[str, str], scenario: Scenario, observations: Observations
    ) -> None:
        self.url = urlsplit(api_url)
        self.host = self.url.hostname or "127.0.0.1"
        self.keys = keys
        self.scenario = scenario
        self.obs = observations
        self._work: queue.Queue[tuple[str, float] | None] = queue.Queue()
        self.events = EventTraffic(api_url, keys)  # a share of each tenant's requests, as events

    def _sender(self) -> None:
        connection = http.client.HTTPConnection(self.host, self.url.port, timeout=30)
        path = self.url.path.rstrip("/") + "/v1/messages"
        while True:
            item = self._work.get()
            if item is None:
                return
            tenant, _ = item
            if self.events.divert(tenant):
                continue
            body = json.dumps({"type": "demo", "payload": {"tenant": tenant}})
            headers = {"Authorization": f"Bearer {self.keys[tenant]}", "Content-Type": "application/json"}
            try:
                connection.request("POST", path, body=body, headers=headers)
                response = connection.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                connection.close()
                connection = http.client.HTTPConnection(self.host, self.url.port, timeout=30)
                status = 0
            self._answered(tenant, status)

    def _answered(self, tenant: str, status: int) -> None:
        self.obs.record(tenant, status, time.time() - self.obs.started)

    def run(self, on_tick: Any = None) -> None:
        senders = [threading.Thread(target=self._sender, daemon=True) for _ in range(self.scenario.senders)]
        for thread in senders:
            thread.start()
        next_send = self.scenario.first_sends()
        start = self.obs.started
        last_tick = 0.0
        while True:
            t = time.time() - start
            if t >= self.scenario.duration_s:
                break
            for tenant in self.scenario.tenant_ids:
                while next_send[tenant] <= t:
                    self._work.put((tenant, next_send[tenant]))
                    next_send[tenant] += 1.0 / self.scenario.rate(tenant, next_send[tenant])
            if on_tick is not None and t - last_tick >= 1.0:
                last_tick = t
                on_tick(t)
            time.sleep(0.01)
        for _ in senders:
            self._work.put(None)
        for thread in senders:
            thread.join(30)


def create_tenants(runtime: LocalRuntime, tenant_ids: list[str], tier: str = "standard") -> dict[str, str]:
    """Demo tenants, added as an operator adds them (``bin/tenants add``: ``usage_plans.add_tenant``)."""
    from breakwater.aws.tenants import TenantTable
    from breakwater.aws.usage_plans import STACK_OUTPUT, EdgePlans, UsagePlans, add_tenant

    table = TenantTable(
        runtime.output("TenantsTableName"), client=runtime.aws.client("dynamodb", counted=False)
    )
    plans = UsagePlans(
        EdgePlans.from_output(runtime.output(STACK_OUTPUT)),
        client=runtime.aws.client("apigateway", counted=False),
    )
    return {tenant: add_tenant(table, plans, tenant, tier) for tenant in tenant_ids}


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
