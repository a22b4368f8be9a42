"""The simulated system's front door: API Gateway's stage throttle and the tier's usage plan, the REQUEST
authorizer, ingest's token bucket at the controller's multiplier, and the routing of what is accepted
to the live queues by shuffle sharding.

A mixin of :class:`sim.system.System`, apart so neither file grows past what one reads at once; it
works on the system's state, declared below as the attributes it reads and writes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from breakwater.fairness import BucketLimits, BucketState, take_lease
from breakwater.routing import QueueDepths, choose_queue
from breakwater.settings import TierLimits
from breakwater_cdk.config import TierConfig
from sim.billing import Billing, Meter
from sim.config import Setup
from sim.control import ControllerState
from sim.dynamodb import COUNTERS, INGEST_BUCKET, LEGACY_DYNAMODB, StateTable
from sim.gates import LocalRefusals
from sim.messages import Message
from sim.scenarios import Scenario
from sim.sqs import SqsQueue
from sim.worker import Costs, WorkerModel

if TYPE_CHECKING:
    from sim.system import Recording


class FrontDoor:
    """What each tick's arrivals meet before a queue (:meth:`_admit`)."""

    scenario: Scenario
    setup: Setup
    costs: Costs
    billing: Billing
    meter: Meter
    rec: Recording
    table: StateTable
    state: ControllerState
    live: list[SqsQueue]
    live_worker: WorkerModel
    _tier: TierLimits
    _tiers: dict[int, tuple[TierLimits, TierConfig]]
    _stage: BucketLimits
    _stage_state: BucketState
    _edge: BucketLimits
    _edges: dict[int, BucketLimits]
    _edge_state: dict[int, BucketState]
    _ingest_state: dict[int, BucketState]
    _ingest_refusals: LocalRefusals
    _ingest_limits: dict[tuple[float, int, float], BucketLimits]
    _ingest_timeout_s: float
    _shards: list[tuple[int, ...]]
    _depths: QueueDepths
    _authorizer_cache_s: float
    _authorized_until: dict[int, float]
    _poison_every: int
    _subject_sent: int
    _rng: np.random.Generator
    _work_ms: np.ndarray

    def _admit(self, times: np.ndarray, tenants: np.ndarray, tick_end: float) -> None:
        rec, scenario = self.rec, self.scenario
        offered = len(times)
        if offered == 0:
            return
        rec.add("offered", offered)
        stage = take_lease(self._stage_state, self._stage, tick_end, offered)
        self._stage_state = stage.state
        passed = stage.granted
        if passed < offered:
            rec.add("refused", offered - passed)
            times, tenants = times[:passed], tenants[:passed]
        # a tick holds a handful of messages: counting them in Python costs less than np.unique
        wanted: dict[int, int] = {}
        for tenant in tenants.tolist():
            wanted[tenant] = wanted.get(tenant, 0) + 1
        self._authorize(wanted, tick_end)
        integrated = passed  # requests that reach ingest: API Gateway bills them, and ingest runs
        if self.setup.practices:
            keep: np.ndarray | None = None
            errors = 0
            for tenant in sorted(wanted):
                count = wanted[tenant]
                at_edge, admitted = self._tenant_admits(tenant, count, tick_end)
                integrated -= count - at_edge  # the usage plan's throttle answers at the gateway
                if admitted < 0:  # the bucket's write stayed throttled past ingest's timeout: 5xx
                    errors += at_edge
                    admitted = 0
                if admitted < count:
                    if keep is None:
                        keep = np.ones(len(times), dtype=bool)
                    where = np.flatnonzero(tenants == tenant)
                    keep[where[admitted:]] = False
            if keep is not None and not keep.all():
                rec.add("refused", int((~keep).sum()) - errors)
                times, tenants = times[keep], tenants[keep]
            if errors:
                rec.add("front_door_5xx", errors)
        meter = self.meter
        meter.api_requests += integrated
        meter.invoke("ingest", integrated, integrated * math.ceil(self.billing.ingest_ms))
        meter.sqs_requests[1] += len(times)  # SendMessage, one per message accepted
        rec.add("accepted", len(times))
        if not len(times):
            return
        # each is stored in SQS a moment after ingest stamped it
        stored = (times + self.costs.enqueue_ms / 1000).tolist()
        stamps = (times * 1000).astype(np.int64).tolist()
        who = tenants.tolist()
        work = self._work_ms[tenants]
        sigma = scenario.work_sigma
        if sigma > 0:
            work = work * self._rng.lognormal(-sigma * sigma / 2, sigma, len(times))
        subject = scenario.subject
        in_event = scenario.in_event(float(times[0]))  # ticks never straddle the event's bounds
        if scenario.kind == "slow" and in_event:
            work = np.where(tenants == subject, work * scenario.slow_factor, work)
        costs = work.tolist()
        poison = [False] * len(who)
        if scenario.kind == "poison" and in_event:
            for position in np.flatnonzero(tenants == subject).tolist():
                self._subject_sent += 1
                poison[position] = self._subject_sent % self._poison_every == self._poison_every // 2
            rec.add("poison_sent", sum(poison))
        ttl_ms = None if scenario.ttl_s is None else int(scenario.ttl_s * 1000)
        expires = [None] * len(who) if ttl_ms is None else [stamp + ttl_ms for stamp in stamps]
        groups: list[int | None] = list(who) if self.setup.group_ids else [None] * len(who)
        messages = list(map(Message, who, stamps, groups, expires, costs, poison))
        if not self.setup.practices:
            self.live[0].arrive(stored, messages)
            return
        live, depths, shards = self.live, self._depths, self._shards
        routed: dict[int, tuple[list[float], list[Message]]] = {}
        for at, message in zip(stored, messages, strict=True):
            candidates = shards[message.tenant]
            for index in candidates:
                if depths.is_stale(index, at):
                    self.meter.sqs_requests[0] += 1  # GetQueueAttributes
                    depths.observe(index, live[index].visible_count, at)
            index = choose_queue(candidates, depths.snapshot(candidates))
            depths.record_send(index)
            bucket = routed.get(index)
            if bucket is None:
                bucket = routed[index] = ([], [])
            bucket[0].append(at)
            bucket[1].append(message)
        for index, (at_times, batch) in routed.items():
            live[index].arrive(at_times, batch)

    def _authorize(self, wanted: dict[int, int], now: float) -> None:
        """The REQUEST authorizer runs for a tenant's request when its cached answer has expired."""
        until = self._authorized_until
        ran = 0
        for tenant, count in wanted.items():
            if self._authorizer_cache_s <= 0:
                ran += count
            elif until.get(tenant, -math.inf) <= now:
                until[tenant] = now + self._authorizer_cache_s
                ran += 1
        if ran:
            self.meter.invoke("authorizer", ran, ran * math.ceil(self.billing.authorizer_ms))

    def _tenant_admits(self, tenant: int, count: int, now: float) -> tuple[int, int]:
        """The usage plan's throttle at the edge, then ingest's bucket at the controller's multiplier:
        how many passed the edge, and how many ingest admitted (-1: none, its bucket's write stayed
        throttled until ingest timed out, and API Gateway answered them with a 5xx)."""
        other = self._tiers.get(tenant)
        edge_limits = self._edge if other is None else self._edges[tenant]
        edge_state = self._edge_state.get(tenant) or BucketState.full(edge_limits, now)
        edge = take_lease(edge_state, edge_limits, now, count)
        self._edge_state[tenant] = edge.state
        if edge.granted == 0:
            return 0, 0
        multiplier = self.state.multipliers.get(tenant, 1.0)  # ControllerState.multiplier, per tick
        tier = self._tier if other is None else other[0]
        limits = self._ingest_limits.get((tier.rate, tier.burst, multiplier))
        if limits is None:
            base = BucketLimits(rate=tier.rate, burst=tier.burst)
            limits = self._ingest_limits[(tier.rate, tier.burst, multiplier)] = base.scaled(multiplier)
        table = self.table
        held = self.live_worker.leases.held_count(tenant) if self.live_worker.leases is not None else 0
        refusals = self._ingest_refusals
        if refusals._until and refusals.blocked(tenant, now):
            # refused where it was refused before, until the refill: no bucket write, only the counters
            self.meter.dynamodb_writes += 1
            table.retried_write(
                table.counters(tenant), COUNTERS, now, table.counters_units(held), LEGACY_DYNAMODB
            )
            self.state.add(tenant, "throttled", edge.granted)
            return edge.granted, 0
        state = self._ingest_state.get(tenant) or BucketState.full(limits, now)
        decision = take_lease(state, limits, now, edge.granted)
        # the bucket's conditional write, and the tenant's counters (accepted, throttled) in one write
        self.meter.dynamodb_writes += 2
        if not self._bucket_written(tenant, now):
            return edge.granted, -1
        self._ingest_state[tenant] = decision.state
        if not decision.granted:
            refusals.refused(tenant, now, decision.state, limits)
        # a throttled flush keeps its counts for the next one (modelled as written: a tick later at most)
        table.retried_write(
            table.counters(tenant), COUNTERS, now, table.counters_units(held), LEGACY_DYNAMODB
        )
        if decision.granted:
            self.state.add(tenant, "accepted", decision.granted)
        if decision.granted < edge.granted:
            self.state.add(tenant, "throttled", edge.granted - decision.granted)
        return edge.granted, decision.granted

    def _bucket_written(self, tenant: int, now: float) -> bool:
        """Ingest's bucket write, with botocore's legacy retries until ingest's own timeout."""
        table = self.table
        item, units = table.ingest_bucket(tenant), table.bucket_wcu
        if table.write(item, INGEST_BUCKET, now, units):
            return True
        waited = 0.0
        for attempt in range(1, LEGACY_DYNAMODB.attempts):
            waited += LEGACY_DYNAMODB.wait(attempt, None)
            if waited >= self._ingest_timeout_s:
                break
            if table.write(item, INGEST_BUCKET, now + waited, units):
                self.rec.add("front_door_retried")
                return True
        return False
