"""Scenarios: who sends how much when, what each message costs, and what goes wrong.

The four kinds are the embedded default's (``local/scenarios``): ``noisy`` (one tenant sends far past
capacity), ``outage`` (the processor's dependency is down), ``slow`` (one tenant's messages become
expensive) and ``poison`` (a share of one tenant's messages fail every time). Seed scale
(:func:`seed_scale`) is 1,000 tenants with Zipf-skewed rates, a 30-minute event and hours after it;
:func:`embedded` is the embedded default's noisy run, for the validation against its report.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from breakwater_cdk.config import BlueprintConfig
from sim.worker import Costs

DEFAULT_COSTS = Costs()

Kind = Literal["noisy", "outage", "slow", "poison", "scale"]
KINDS: tuple[Kind, ...] = ("noisy", "outage", "slow", "poison")  # the seed-scale ones (--scenario all)


@dataclass(frozen=True)
class Scenario:
    kind: Kind
    tenants: tuple[str, ...]
    rates: tuple[float, ...]  # each tenant's usual messages per second
    work_ms: tuple[float, ...]  # what processing one of its messages takes, on average
    # each message's cost is the tenant's mean times a lognormal draw of mean 1 and this spread: equal
    # costs would keep every worker finishing its batches in lockstep, which no real processor does
    work_sigma: float = 0.5
    subject: int = 0  # the tenant the event is about (noisy, slow, poison)
    baseline_s: float = 1800.0
    event_s: float = 1800.0
    after_s: float = 5.5 * 3600
    drain_s: float = 0.0  # after the load stops, while queues empty
    event_rate: float | None = None  # noisy: the subject's rate during the event
    slow_factor: float = 20.0
    poison_share: float = 0.02
    failure_ms: float = 100.0  # how long a call to a dependency that is down takes to fail
    arrivals: Literal["poisson", "periodic"] = "poisson"
    first_sends: tuple[float, ...] | None = None  # periodic: each tenant's first send
    tick_s: float = 1.0  # the front door admits a tick's arrivals at once (each keeps its own time)
    sample_s: float = 10.0  # depths are sampled, and age series binned, this often
    controller_interval_s: float = 60.0  # the controller's schedule (rate(1 minute))
    ttl_s: float | None = None  # expires_at on every message
    seed: int = 1
    capacity: float | None = None  # messages/s the naive fleet processes (for the arithmetic)
    # tenants (by index) of another tier than the configuration's default, by tier name
    tenant_tiers: Mapping[int, str] = field(default_factory=dict)
    # scale: every tenant sends this share of its rate outside the event (the event is the full load)
    share_outside_event: float = 1.0
    notes: Mapping[str, Any] = field(default_factory=dict)

    @property
    def event_start_s(self) -> float:
        return self.baseline_s

    @property
    def event_end_s(self) -> float:
        return self.baseline_s + self.event_s

    @property
    def load_end_s(self) -> float:
        return self.event_end_s + self.after_s

    @property
    def end_s(self) -> float:
        return self.load_end_s + self.drain_s

    def in_event(self, t: float) -> bool:
        return self.event_start_s <= t < self.event_end_s

    def rate(self, tenant: int, t: float) -> float:
        if self.kind == "scale" and not self.in_event(t):
            return self.rates[tenant] * self.share_outside_event
        if (
            self.kind == "noisy"
            and tenant == self.subject
            and self.in_event(t)
            and self.event_rate is not None
        ):
            return self.event_rate
        return self.rates[tenant]

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "tenants": len(self.tenants),
            "total_rate": round(sum(self.rates), 3),
            "subject": self.tenants[self.subject],
            "subject_rate": self.rates[self.subject],
            "event_rate": self.event_rate,
            "baseline_s": self.baseline_s,
            "event_s": self.event_s,
            "after_s": self.after_s,
            "drain_s": self.drain_s,
            "work_ms_mean": round(float(np.mean(self.work_ms)), 3),
            "capacity": self.capacity,
            "arrivals": self.arrivals,
            "seed": self.seed,
            "tenant_tiers": {self.tenants[tenant]: tier for tenant, tier in self.tenant_tiers.items()},
            **self.notes,
        }


def fleet_capacity(config: BlueprintConfig, work_ms: float, costs: Costs) -> float:
    """Messages per second the live fleet processes when every batch is full and nothing is moved."""
    fleet = config.queue_set.size * config.worker.mapping_concurrency
    batch = (
        min(config.worker.batch_size, 10)
        if config.worker.batching_window_seconds == 0
        else config.worker.batch_size
    )
    batch_s = (costs.invoke_ms + batch * (costs.per_record_ms + work_ms) + costs.settle_ms) / 1000
    return fleet * batch / batch_s


def zipf_rates(count: int, total: float, exponent: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, count + 1) ** exponent
    return total * weights / weights.sum()


def seed_scale(
    kind: Kind,
    config: BlueprintConfig,
    *,
    tenants: int = 1000,
    quiet_share: float = 0.10,
    surge_factor: float = 10.0,
    work_ms: float = 1000.0,
    exponent: float = 1.0,
    baseline_s: float = 1800.0,
    event_s: float = 1800.0,
    after_s: float = 5.5 * 3600,
    costs: Costs = DEFAULT_COSTS,
    seed: int = 1,
) -> Scenario:
    """1,000 tenants, Zipf-skewed rates whose sum is ``quiet_share`` of the fleet's capacity, one event.

    noisy: the top tenant sends ``surge_factor`` x capacity for the event. outage: the dependency is
    down for the event. slow: the top tenant sends half of what its tier's concurrency processes and
    its messages cost ``slow_factor`` x during the event. poison: the top tenant sends as much, and
    2 % of its messages sent during the event (a bad release) fail every time. ``costs``: the
    worker's virtual time per invocation, as the run will use it (the fleet's capacity depends on it).
    """
    capacity = fleet_capacity(config, work_ms, costs)
    names = tuple(f"tenant-{index:04d}" for index in range(1, tenants + 1))
    rates = zipf_rates(tenants, quiet_share * capacity, exponent)
    tier = config.tiers[config.default_tier]
    # What the tenant's tier lets it process at the usual cost: half its concurrency ceiling's worth,
    # within its consumer rate. The slow and poison tenants send that much: busy, but within its limits.
    within_tier = min(tier.consumer_rate, 0.5 * tier.concurrency * 1000.0 / work_ms, 0.1 * capacity)
    if kind in ("slow", "poison"):
        rates[0] = within_tier
    return Scenario(
        kind=kind,
        tenants=names,
        rates=tuple(float(rate) for rate in rates),
        work_ms=tuple(work_ms for _ in names),
        subject=0,
        baseline_s=baseline_s,
        event_s=event_s,
        after_s=after_s,
        event_rate=surge_factor * capacity if kind == "noisy" else None,
        sample_s=10.0,
        seed=seed,
        capacity=capacity,
        notes={"quiet_share": quiet_share, "surge_factor": surge_factor, "zipf_exponent": exponent},
    )


def embedded(reference: Mapping[str, Any], work_ms: float) -> Scenario:
    """The embedded default's noisy run as its report describes it, at the rates its clients achieved,
    each message costing ``work_ms`` (the emulator's simulated work)."""
    scenario = reference["scenario"]
    count = int(scenario["tenants"])
    names = tuple(f"tenant-{index:02d}" for index in range(1, count + 1))
    rates = [float(scenario["quiet_rate"])] * count
    rates[0] = float(scenario["noisy_rate"])
    work = work_ms
    return Scenario(
        kind="noisy",
        tenants=names,
        rates=tuple(rates),
        work_ms=tuple(work for _ in names),
        subject=0,
        baseline_s=float(scenario["baseline_s"]),
        event_s=float(scenario["burst_s"]),
        after_s=float(scenario["after_s"]),
        drain_s=float(scenario["drain_s"]),
        event_rate=float(reference["achieved_burst_rate"]),
        arrivals="periodic",
        first_sends=tuple(0.0 for _ in names),
        work_sigma=0.1,  # the sample processor sleeps a fixed time; the runtime around it varies a little
        tick_s=0.1,
        sample_s=1.0,
        controller_interval_s=60.0 / float(reference["schedule_speedup"]),
        seed=1,
        notes={"validation": "embedded default, noisy"},
    )


def with_overrides(scenario: Scenario, **changes: Any) -> Scenario:
    return replace(scenario, **changes)


class Load:
    """Arrivals per tick: (times, tenant indexes), in time order."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self._rng = np.random.default_rng(scenario.seed)
        first = scenario.first_sends or tuple(0.0 for _ in scenario.tenants)
        self._next = list(first)
        self._mixes: dict[bool, tuple[float, np.ndarray]] = {}

    def arrivals(self, start: float, end: float) -> tuple[np.ndarray, np.ndarray]:
        if self.scenario.arrivals == "periodic":
            return self._periodic(start, end)
        return self._poisson(start, end)

    def _poisson(self, start: float, end: float) -> tuple[np.ndarray, np.ndarray]:
        scenario = self.scenario
        middle = (start + end) / 2
        if scenario.kind == "scale":
            surge = scenario.in_event(middle)
        else:
            surge = scenario.kind == "noisy" and scenario.in_event(middle) and scenario.event_rate is not None
        total, cdf = self._mix(surge)
        count = int(self._rng.poisson(total * (end - start)))
        if count == 0:
            return np.empty(0), np.empty(0, dtype=np.int64)
        # The tenants' and the times' uniforms in one draw: the generator fills an array in order, so these
        # are the same numbers as two draws of ``count``, for one call less per tick.
        uniform = self._rng.random(2 * count)
        # what Generator.choice(len(rates), size=count, p=rates / total) draws, with the table kept
        tenants = cdf.searchsorted(uniform[:count], side="right").astype(np.int64)
        times = start + uniform[count:] * (end - start)
        order = np.argsort(times, kind="stable")
        return times[order], tenants[order]

    def _mix(self, surge: bool) -> tuple[float, np.ndarray]:
        """The rates' total and cumulative share (the same every tick of a phase, so built once)."""
        found = self._mixes.get(surge)
        if found is None:
            scenario = self.scenario
            rates = np.asarray(scenario.rates, dtype=float)
            if scenario.kind == "scale":
                rates = rates if surge else rates * scenario.share_outside_event
            elif surge:
                rates = rates.copy()
                rates[scenario.subject] = scenario.event_rate
            total = float(rates.sum())
            cdf = (rates / total).cumsum()
            cdf /= cdf[-1]
            found = self._mixes[surge] = (total, cdf)
        return found

    def _periodic(self, start: float, end: float) -> tuple[np.ndarray, np.ndarray]:
        scenario = self.scenario
        times: list[float] = []
        tenants: list[int] = []
        for tenant in range(len(scenario.tenants)):
            at = self._next[tenant]
            while at < end:
                if at >= start:
                    times.append(at)
                    tenants.append(tenant)
                at += 1.0 / scenario.rate(tenant, at)
            self._next[tenant] = at
        order = np.argsort(np.asarray(times), kind="stable")
        return np.asarray(times)[order], np.asarray(tenants, dtype=np.int64)[order]
