"""One configuration of the blueprint in virtual time: front door, queues, mappings, workers, controller.

The front door admits each tick's arrivals through API Gateway's stage throttle and (Breakwater) the
tier's usage plan and ingest's token bucket (``breakwater.fairness.take_lease``, at the controller's
multiplier), routes them by shuffle sharding (``breakwater.routing``) and sends each to its queue at
its own arrival time. Workers (``sim.worker``) consume through event source mappings
(``sim.lambda_esm``); the controller (``breakwater.controller.run_controller``) runs on its schedule
with in-memory ports (``sim.control``) and turns the sideline drainers on and off, starts the
archiver and sets each tenant's multiplier. What the archiver parks an operator replays once the
event has ended and the queues have drained back (``sim.replay``).

Every part counts the AWS calls it stands for in one :class:`sim.billing.Meter`; at the end of the
run they become the billed units of ``local/pricing`` (:attr:`Recording.usage`). Every DynamoDB call
is also made against its item in a :class:`sim.dynamodb.StateTable`, metered per virtual second and
throttled past a partition's limits (``limits``: AWS's own figures unless a run divides them).
"""

from __future__ import annotations

import gc
import math
import time
from array import array
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy
from botocore.exceptions import ClientError

from breakwater.archive_budget import ArchiveBudget, ArchiveDue
from breakwater.backlog import DriftLimits
from breakwater.backpressure import BackpressurePolicy
from breakwater.concurrency import counters_interval_s
from breakwater.controller import ControllerConfig, run_controller
from breakwater.envelope import Origin
from breakwater.fairness import BucketLimits, BucketState, contended_ask_interval_s
from breakwater.observability import logger, metrics
from breakwater.routing import QueueDepths, shard_for
from breakwater.settings import TierLimits
from breakwater.sideline import DecisionConfig
from breakwater_cdk.ceilings import (
    burst_slots,
    consumer_bucket_containers,
    health_report_shards,
    worker_containers,
)
from breakwater_cdk.config import TierConfig
from local.aws_limits import AwsLimits
from sim.billing import RECEIVE_MAX, Billing, Meter, usage
from sim.config import Setup
from sim.control import ControllerState
from sim.dynamodb import DEPENDENCY_HEALTH, StateTable
from sim.front_door import FrontDoor
from sim.gates import ConsumerBuckets, LeaseTable, LocalRefusals
from sim.lambda_esm import EventSourceMapping, FunctionConcurrency
from sim.messages import Message
from sim.replay import ArchiveReplay
from sim.scenarios import Load, Scenario
from sim.sqs import SqsQueue
from sim.worker import Costs, Outcome, WorkerModel, WorkerSetup

ARCHIVER_START_S = 1.0  # an asynchronous invoke, then the archiver reads and parks what waits


@dataclass
class Recording:
    """What a run saw, as compact arrays (a seed-scale run records millions of first attempts)."""

    # every first attempt on a live queue: when it was enqueued, when received, whose
    first_enqueued: array[float] = field(default_factory=lambda: array("d"))
    first_received: array[float] = field(default_factory=lambda: array("d"))
    first_tenant: array[int] = field(default_factory=lambda: array("l"))
    # every message processed successfully: when it was enqueued, when its processing started, whose
    served_enqueued: array[float] = field(default_factory=lambda: array("d"))
    served_at: array[float] = field(default_factory=lambda: array("d"))
    served_tenant: array[int] = field(default_factory=lambda: array("l"))
    # every message accepted and not processed by the run's end, and not expired then: waiting in a
    # queue or a dead-letter queue, failed or held in a worker's hands, parked and not replayed
    unserved_enqueued: array[float] = field(default_factory=lambda: array("d"))
    unserved_tenant: array[int] = field(default_factory=lambda: array("l"))
    samples: list[tuple[float, int, int, int, int]] = field(default_factory=list)  # t, live, aside, all, dlq
    totals: dict[str, int] = field(default_factory=dict)
    controller_runs: int = 0
    wall_s: float = 0.0
    usage: dict[str, float] = field(default_factory=dict)  # billed units (local/pricing/prices.json)
    dynamodb: dict[str, Any] = field(default_factory=dict)  # the items' report (StateTable.report)

    def add(self, name: str, amount: int = 1) -> None:
        self.totals[name] = self.totals.get(name, 0) + amount


class System(FrontDoor):
    """Build one configuration for one scenario; :meth:`run` it to the scenario's end."""

    def __init__(
        self,
        scenario: Scenario,
        setup: Setup,
        costs: Costs,
        *,
        function_concurrency: int | None = None,
        billing: Billing | None = None,
        limits: AwsLimits | None = None,
    ) -> None:
        self.scenario = scenario
        self.setup = setup
        self.costs = costs
        self.billing = billing or Billing()
        self.meter = Meter()
        self.env = simpy.Environment()
        self.rec = Recording()
        config = setup.config
        tier = config.tiers[config.default_tier]
        self._tier = TierLimits(**tier.model_dump())
        # tenants of another tier than the default (by index): their limits and their tier's config
        self._tiers: dict[int, tuple[TierLimits, TierConfig]] = {
            tenant: (TierLimits(**config.tiers[name].model_dump()), config.tiers[name])
            for tenant, name in scenario.tenant_tiers.items()
        }
        self.table = StateTable(scenario.tenants, limits, seed=scenario.seed + 2)
        worker = config.worker
        # HEALTH_REPORT_SHARDS as the stack sets it (its live containers' reports, 250 WCU/s a shard)
        self.health_shards = health_report_shards(config) if setup.practices else 1
        self.state = ControllerState(
            scenario.tenants,
            self.limits,
            self.meter,
            self.billing,
            self.table if setup.practices else None,
            lambda: self.env.now,
            health_shards=self.health_shards,
        )
        visibility = config.worker.visibility_timeout_seconds
        receives = config.queue_set.max_receive_count
        env = self.env
        self.dlqs: list[SqsQueue] = []

        def queue(name: str) -> SqsQueue:
            dlq = SqsQueue(env, f"{name}-dlq", visibility_timeout_s=visibility)
            made = SqsQueue(
                env,
                name,
                visibility_timeout_s=visibility,
                max_receive_count=receives,
                dead_letter=dlq,
                fair=setup.group_ids,
            )
            self.dlqs.append(dlq)
            return made

        self.live = [queue(f"live-{index}") for index in range(setup.queue_count)]
        self.by_role: dict[Origin, SqsQueue] = {}
        practices = self._practices = setup.practices
        live_function = FunctionConcurrency(env, function_concurrency)
        sideline_function = FunctionConcurrency(env, function_concurrency)
        breaker = (worker.outage_backoff_seconds, worker.outage_backoff_max_seconds) if practices else None
        sideline_cfg = config.sideline

        def decision(mode: str) -> DecisionConfig:
            return DecisionConfig(
                mode="sideline" if mode == "sideline" else "live",
                sidelining_enabled=practices,
                sideline_age_ms=sideline_cfg.sideline_age_seconds * 1000,
                defer_base_seconds=sideline_cfg.defer_base_seconds,
                max_defer_seconds=sideline_cfg.max_defer_seconds,
            )

        def worker_setup(mode: str) -> WorkerSetup:
            return WorkerSetup(
                decision(mode),
                practices,
                breaker,
                receives,
                worker.timeout_seconds,
                costs,
                self.health_shards,
                counters_interval_s(worker_containers(config, "sideline" if mode == "sideline" else "live")),
            )

        table = self.table
        ingest = config.ingest  # the workers lease their consumer tokens as ingest does
        refusals = LocalRefusals(ingest.lease_seconds, ingest.lease_max_fraction)
        # the live and sideline workers' containers pace their asks of a contended bucket together
        paced_s = contended_ask_interval_s(consumer_bucket_containers(config))
        seed = scenario.seed + 3
        rate = ConsumerBuckets(self.limits, table, refusals, paced_s, seed) if practices else None
        concurrency = worker.mapping_concurrency
        # the burst pools as the stack sizes them: a share of what the worker's mappings allow
        live_slots = burst_slots(config, "live")
        sideline_slots = burst_slots(config, "sideline")
        self.live_worker = WorkerModel(
            "live",
            worker_setup("live"),
            self,
            self.limits,
            rate,
            LeaseTable(live_slots, table) if practices else None,
            self.meter,
            seed=scenario.seed + 4,
        )
        self.mappings: list[EventSourceMapping] = []
        mapped = list(self.live)
        if practices:
            self.by_role = {
                Origin.SURGE: queue("surge"),
                Origin.SPILLOVER: queue("spillover"),
                Origin.BACKLOG: queue("backlog"),
            }
            mapped.append(self.by_role[Origin.SURGE])
        for each in mapped:
            self.mappings.append(
                self._mapping(each, self.live_worker, setup.live_max_concurrency, live_function)
            )
        self.sideline_mappings: dict[str, EventSourceMapping] = {}
        self.sideline_worker: WorkerModel | None = None
        if practices:
            self.sideline_worker = WorkerModel(
                "sideline",
                worker_setup("sideline"),
                self,
                self.limits,
                rate,
                LeaseTable(sideline_slots, table),
                self.meter,
                seed=scenario.seed + 5,
            )
            for role in (Origin.SPILLOVER, Origin.BACKLOG):
                self.sideline_mappings[self.by_role[role].name] = self._mapping(
                    self.by_role[role], self.sideline_worker, concurrency, sideline_function, enabled=False
                )
        self.every = [*self.live, *self.by_role.values()]
        # the front door
        self._stage = BucketLimits(rate=config.api.throttle_rate, burst=config.api.throttle_burst)
        self._stage_state = BucketState.full(self._stage, 0.0)
        ceiling = config.backpressure.max_multiplier
        self._edge = BucketLimits(rate=self._tier.rate * ceiling, burst=self._tier.burst)
        self._edges = {
            tenant: BucketLimits(rate=limits.rate * ceiling, burst=limits.burst)
            for tenant, (limits, _) in self._tiers.items()
        }
        self._ingest_timeout_s = float(config.ingest.timeout_seconds)
        self._edge_state: dict[int, BucketState] = {}
        self._ingest_state: dict[int, BucketState] = {}
        # tenants ingest refuses locally after the bucket refused them, until its refill
        self._ingest_refusals = LocalRefusals(config.ingest.lease_seconds, config.ingest.lease_max_fraction)
        self._ingest_limits: dict[tuple[float, int, float], BucketLimits] = {}  # by tier and multiplier
        shard = min(config.queue_set.shard_size, setup.queue_count)
        self._shards = [shard_for(name, setup.queue_count, shard) for name in scenario.tenants]
        self._depths = QueueDepths(config.ingest.depth_refresh_seconds)
        self.replay = (
            ArchiveReplay(env, scenario, self.live, self.by_role, self._shards, config.archive, self.meter)
            if practices
            else None
        )
        # the authorizer's answer is cached per API key (a tenant) this long
        self._authorizer_cache_s = float(config.api.authorizer_cache_seconds)
        self._authorized_until: dict[int, float] = {}
        # the outage's bounds, read per message processed
        self._down = (scenario.event_start_s, scenario.event_end_s) if scenario.kind == "outage" else None
        self._poison_every = max(1, round(1 / scenario.poison_share))
        self._subject_sent = 0
        self._rng = np.random.default_rng(scenario.seed + 1)
        self._work_ms = np.asarray(scenario.work_ms, dtype=np.float64)
        backpressure = config.backpressure
        self.controller_config = ControllerConfig(
            backpressure=BackpressurePolicy(
                backlog_target=backpressure.backlog_target,
                min_multiplier=backpressure.min_multiplier,
                growth_step=backpressure.growth_step,
                max_multiplier=backpressure.max_multiplier,
            ),
            healthy_age_s=config.alarms.oldest_message_age_seconds,
            archive_budget=ArchiveBudget(
                age_s=sideline_cfg.archive_age_seconds, depth=sideline_cfg.archive_depth
            ),
            drift=DriftLimits(
                minimum=backpressure.drift_tolerance, fraction=backpressure.drift_tolerance_fraction
            ),
            invocations=1,
            parallel_shards=1,
        )

    def limits(self, tenant: int) -> TierLimits:
        other = self._tiers.get(tenant)
        return self._tier if other is None else other[0]

    def _mapping(
        self,
        queue: SqsQueue,
        worker: WorkerModel,
        concurrency: int,
        function: FunctionConcurrency,
        *,
        enabled: bool = True,
    ) -> EventSourceMapping:
        env = self.env
        config = self.setup.config.worker
        return EventSourceMapping(
            env,
            queue,
            worker.handle,  # at the queue's clock
            batch_size=config.batch_size,
            batching_window_s=config.batching_window_seconds,
            max_concurrency=concurrency,
            function=function,
            enabled=enabled,
        )

    # -- Sink: what the workers report -----------------------------------------------------------------
    def observe(self, message: Message, role: str, now_s: float) -> None:
        # a replayed message is old work, not a first attempt (the demo reports those on their own)
        if message.receive_count == 1 and role == "live" and message.replay_run is None:
            rec = self.rec
            rec.first_enqueued.append(message.enqueued_at / 1000)
            rec.first_received.append(now_s)
            rec.first_tenant.append(message.tenant)

    def process(self, message: Message, at_s: float) -> tuple[Outcome, float]:
        down = self._down
        if down is not None and down[0] <= at_s < down[1]:
            return "down", self.scenario.failure_ms / 1000
        if message.poison:
            return "failed", message.work_ms / 1000
        rec = self.rec
        rec.served_enqueued.append(message.enqueued_at / 1000)
        rec.served_at.append(at_s)
        rec.served_tenant.append(message.tenant)
        return "ok", message.work_ms / 1000

    def send_move(self, message: Message, destination: Origin, delay_s: int, after_s: float = 0.0) -> None:
        self.by_role[destination].send(message, delay_s + after_s)

    def count(self, tenant: int, counter: str, amount: int = 1) -> None:
        totals = self.rec.totals
        totals[counter] = totals.get(counter, 0) + amount
        if self._practices:
            self.state.add(tenant, counter, amount)

    def report_oldest(self, role: str, age_ms: int, now_ms: int, shard: int = 0) -> tuple[int, int] | None:
        return self.state.record_oldest_age(role, age_ms, now_ms, shard)

    def report_outage(self, until_ms: int) -> None:
        self.meter.dynamodb_writes += 1  # the health item's outage mark
        table = self.table
        if self._practices:
            written, _ = table.retried_write(
                table.dependency, DEPENDENCY_HEALTH, self.env.now, table.health_wcu
            )
            if not written:  # logged by the worker; the drainers run on, each behind its own breaker
                self.rec.add("outage_reports_throttled")
                return
        self.state.report_outage(until_ms)

    # -- processes -----------------------------------------------------------------------------------
    def _load(self) -> Generator[simpy.Event, object, None]:
        scenario, env = self.scenario, self.env
        load = Load(scenario)
        tick = scenario.tick_s
        t = 0.0
        while t < scenario.load_end_s - 1e-9:
            end = min(t + tick, scenario.load_end_s)
            times, tenants = load.arrivals(t, end)
            self._admit(times, tenants, end)
            yield env.timeout(end - t)
            t = end

    def _sampler(self) -> Generator[simpy.Event, object, None]:
        env, rec = self.env, self.rec
        surge = [self.by_role[Origin.SURGE]] if Origin.SURGE in self.by_role else []
        live_roles = [*self.live, *surge]
        sideline = [self.by_role[role] for role in (Origin.SPILLOVER, Origin.BACKLOG) if role in self.by_role]
        while True:
            live = sum(queue.depth for queue in live_roles)
            aside = sum(queue.depth for queue in sideline)
            dead = sum(queue.depth for queue in self.dlqs)
            rec.samples.append((env.now, live, aside, live + aside, dead))
            yield env.timeout(self.scenario.sample_s)

    def _controller(self) -> Generator[simpy.Event, object, None]:
        env = self.env
        ports = self.state.ports(
            live=self.live,
            every=self.every,
            sideline={"spillover": self.by_role[Origin.SPILLOVER], "backlog": self.by_role[Origin.BACKLOG]},
            set_sideline_enabled=self._set_sideline_enabled,
            start_archiver=self._start_archiver,
            clock_ms=lambda: int(env.now * 1000),
        )
        while True:
            yield env.timeout(self.scenario.controller_interval_s)
            try:
                run_controller(self.controller_config, ports, int(env.now * 1000) + 60_000)
            except ClientError:  # a throttled call the run does not catch (the run state, a claim)
                self.rec.add("controller_runs_failed")
            metrics.clear_metrics()
            self.rec.controller_runs += 1
            self.meter.invoke("controller", 1, math.ceil(self.billing.controller_ms))

    def _set_sideline_enabled(self, enabled: bool, held: frozenset[str]) -> Iterable[str]:
        changed = []
        for name, mapping in self.sideline_mappings.items():
            wanted = enabled and name not in held
            if mapping.enabled != wanted:
                mapping.enabled = wanted
                changed.append(name)
        return changed

    def _start_archiver(self, due: ArchiveDue) -> None:
        queue = next(queue for queue in self.every if queue.name == due.queue_url)

        def archive() -> Generator[simpy.Event, object, None]:
            yield self.env.timeout(ARCHIVER_START_S)
            by_tenant: dict[int, int] = {}
            parked = queue.purge_waiting()
            for message in parked:
                by_tenant[message.tenant] = by_tenant.get(message.tenant, 0) + 1
            # one run: it receives and deletes what waits, ten at a time, and writes it to S3 in objects
            assert self.replay is not None  # only Breakwater archives
            meter = self.meter
            meter.invoke("archiver", 1, math.ceil(self.billing.archiver_ms))
            meter.sqs_batches(len(parked))
            meter.sqs(0, -(-len(parked) // RECEIVE_MAX))  # DeleteMessageBatch
            meter.s3_puts += self.replay.park(parked)
            for tenant, amount in by_tenant.items():
                self.count(tenant, "archived", amount)

        self.env.process(archive())

    def _usage(self) -> dict[str, float]:
        """What the run's calls are billed as (the meter, the mappings' and the gates' counts)."""
        meter = self.meter
        for mapping in [*self.mappings, *self.sideline_mappings.values()]:
            mapping.settle_polls()
            meter.invoke("worker", mapping.invocations, mapping.billed_ms)
            for messages, requests in enumerate(mapping.receives):
                meter.sqs(messages, requests)
            meter.sqs_idle_polls += mapping.idle_polls
        rate = self.live_worker.rate
        if rate is not None:
            meter.dynamodb_writes += rate.writes
        for worker in (self.live_worker, self.sideline_worker):
            leases = worker.leases if worker is not None else None
            if leases is not None:
                meter.dynamodb_writes += leases.writes
                meter.dynamodb_transact_items += leases.transact_items
                meter.dynamodb_item_reads += leases.item_reads
        return usage(meter, self.setup.config, self.billing)

    def _throttle_effects(self) -> None:
        """What throttled calls did, from the parts that took the real code's path on them."""
        rec = self.rec
        rec.dynamodb = self.table.report()
        for worker in (self.live_worker, self.sideline_worker):
            if worker is None:
                continue
            rec.add("batch_failures", worker.batch_failures)
            rec.add("batch_failure_messages", worker.batch_failure_messages)
            rec.add("unreleased_leases", worker.unreleased_leases)
            rec.add("health_reports_throttled", worker.health_throttled)
            if worker.leases is not None:
                rec.add("burst_transactions_cancelled", worker.leases.conflicts)
                rec.add("leases_refused_on_error", worker.leases.refused_on_error)
                rec.add("pool_places_unreleased", worker.leases.unreleased)
        if self.live_worker.rate is not None:
            rec.add("consumer_bucket_failed_open", self.live_worker.rate.failed_open)
            rec.add("consumer_refused_locally", self.live_worker.rate.refusals.refused_locally)
        rec.add("ingest_refused_locally", self._ingest_refusals.refused_locally)

    def _record_unserved(self, messages: list[Message]) -> None:
        """Record ``messages``, accepted and left unprocessed at the run's end, but those expired by
        then (dropped when received, as the ones dropped before)."""
        end_ms = self.scenario.end_s * 1000
        kept = [message for message in messages if message.expires_at is None or message.expires_at > end_ms]
        self.rec.unserved_enqueued.extend(message.enqueued_at / 1000 for message in kept)
        self.rec.unserved_tenant.extend(message.tenant for message in kept)

    def run(self) -> Recording:
        """Run to the scenario's end (virtual); the policies' logs and metrics stay quiet meanwhile."""
        level = logger.log_level
        logger.setLevel("CRITICAL")  # a throttled shard is logged as an error by the controller
        # The run makes no garbage cycles worth collecting, but holds millions of live objects (the
        # messages, the recordings): the cyclic collector would walk them again and again for nothing.
        collecting = gc.isenabled()
        gc.disable()
        started = time.perf_counter()
        try:
            env = self.env
            env.process(self._load())
            env.process(self._sampler())
            if self.replay is not None:
                env.process(self._controller())
                env.process(self.replay.run())
            env.run(until=self.scenario.end_s)
        finally:
            if collecting:
                gc.enable()
            logger.setLevel(level)
            metrics.clear_metrics()
        rec = self.rec
        rec.wall_s = time.perf_counter() - started
        rec.usage = self._usage()
        self._throttle_effects()
        rec.totals["waiting_at_end"] = sum(queue.depth for queue in self.every)
        rec.totals["in_dlq"] = sum(queue.depth for queue in self.dlqs)
        # what is left in the queues, the workers' hands and the archive (parked, not replayed)
        for queue in [*self.every, *self.dlqs]:
            self._record_unserved(queue.unprocessed_messages())
        if self.replay is not None:
            self._record_unserved(self.replay.remaining())
            rec.totals["replay_sent"] = self.replay.sent
        for mapping in [*self.mappings, *self.sideline_mappings.values()]:
            self._record_unserved(mapping.in_hand())
        rec.totals["poison_in_dlq"] = sum(
            message.poison for queue in self.dlqs for message in queue.waiting_messages()
        )
        # every message the run moved through SQS: the load's, and each copy a worker moved
        rec.totals["simulated_messages"] = sum(queue.sent for queue in [*self.every, *self.dlqs])
        return rec
