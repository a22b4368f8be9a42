"""The ``scale`` scenario: 10,000 tenants, 20,000 messages a second for 10 minutes, the limits in the loop.

Where the seed-scale scenarios ask what one tenant's event does to the others, this one asks what
the fleet's own load does to the shared DynamoDB items: every tenant sends at once, Zipf-skewed as
the seed scale draws them (exponent 1), the top tenant a premium tenant at the most its tier admits
(its rate times the controller's largest multiplier), for 10 virtual minutes. The load has no
noisy event; its *event* is the full load itself, between a 2-minute baseline and 2 minutes after
in which every tenant sends a tenth of its rate (the same tenants, mix and fleet). So the report's
ratios keep their meaning:

The top tenant's rate is the premium tier's most when the Zipf draw gives it at least that (20,000
messages a second over 10,000 tenants: about 2,040), the draw's otherwise.

- ``quiet_p99_ratio``: the quiet tenants' (every tenant but the premium one) p99 AgeOfFirstAttempt
  during the full load over their p99 in the baseline;
- ``quiet_p99_max_ratio``: the worst minute's quiet p99 from the full load's start on, over the same
  baseline.

The fleet is sized as a platform team would for the offered peak (:func:`sizing`), within what
``breakwater_cdk.config`` accepts: enough live queues and concurrency that the peak keeps half of it busy,
and a stage throttle above the peak (the account's API Gateway quota raised to match).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from breakwater_cdk.config import BlueprintConfig
from sim.config import load_context
from sim.scenarios import DEFAULT_COSTS, Scenario, fleet_capacity, zipf_rates
from sim.worker import Costs

TENANTS = 10_000
TOTAL_RATE = 20_000.0  # messages per second offered at full load
WORK_MS = 100.0  # the processor's mean time per message
PREMIUM = "premium"
LIVE_QUEUES = 16
UTILISATION = 0.5  # the share of the live fleet the offered peak keeps busy
CONCURRENCY_STEP = 25  # mapping concurrency is rounded up to a multiple of this
# At the peak a mapping's batches fill at once; the window makes them full when the load is lower too
# (a tenth of the invocations, and of their cost), for at most a second's wait.
BATCHING_WINDOW_S = 1


def sizing(
    *,
    total_rate: float = TOTAL_RATE,
    work_ms: float = WORK_MS,
    costs: Costs = DEFAULT_COSTS,
    batch_size: int = 10,
    queues: int = LIVE_QUEUES,
    context: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The configuration a platform team would set for ``total_rate`` (a cdk.json ``breakwater`` override).

    A full batch of ``batch_size`` occupies one invocation for its records' work and the
    invocation's own costs; the live set's concurrency is what keeps the offered peak at
    :data:`UTILISATION` of it, spread over ``queues`` live queues (each mapping's
    ``max_concurrency`` at most 1,000, as the config allows), with a batching window so that batches
    are full (:data:`BATCHING_WINDOW_S`). The stage throttle is set above the
    peak with its burst at twice it (never below ``context``'s, cdk.json's by default): at 1,000/s API
    Gateway would refuse 95 % of the load before any tenant's limit.
    """
    batch_s = (
        costs.invoke_ms + batch_size * (costs.per_record_ms + work_ms) + costs.gate_ms + costs.settle_ms
    ) / 1000
    per_invocation = batch_size / batch_s  # messages per second one busy invocation processes
    needed = total_rate / per_invocation / UTILISATION
    per_queue = math.ceil(needed / queues / CONCURRENCY_STEP) * CONCURRENCY_STEP
    if per_queue > 1000:
        raise ValueError(
            f"{total_rate:g} messages/s at {work_ms:g} ms needs {per_queue} concurrency per live queue "
            f"on {queues} queues; the config allows 1000: use more queues"
        )
    stage = math.ceil(total_rate * 1.25 / 1000) * 1000
    # never below what the configuration has (its stage carries several of its largest plans at once)
    api = (load_context() if context is None else context).get("api", {})
    rate = max(stage, int(api.get("throttle_rate", 0)))
    burst = max(2 * stage, int(api.get("throttle_burst", 0)))
    return {
        "queue_set": {"size": queues},
        "worker": {
            "max_concurrency": per_queue,
            "batch_size": batch_size,
            "batching_window_seconds": BATCHING_WINDOW_S,
        },
        "api": {"throttle_rate": rate, "throttle_burst": burst},
    }


def scale_rates(tenants: int, total_rate: float, top_rate: float, exponent: float = 1.0) -> np.ndarray:
    """Zipf-skewed rates adding up to ``total_rate``, the top one set to ``top_rate`` (the rest rescaled)."""
    rates = zipf_rates(tenants, total_rate, exponent)
    rates[0] = top_rate
    rest = rates[1:].sum()
    if tenants > 1 and rest > 0:
        rates[1:] *= (total_rate - top_rate) / rest
    return rates


def scale_scenario(
    config: BlueprintConfig,
    *,
    tenants: int = TENANTS,
    total_rate: float = TOTAL_RATE,
    work_ms: float = WORK_MS,
    exponent: float = 1.0,
    baseline_s: float = 120.0,
    event_s: float = 600.0,
    after_s: float = 120.0,
    share_outside: float = 0.1,
    costs: Costs = DEFAULT_COSTS,
    seed: int = 1,
) -> Scenario:
    """The scale scenario for ``config`` (sized by :func:`sizing`, or as the caller set it)."""
    if PREMIUM not in config.tiers:
        raise ValueError(f"the scale scenario's top tenant is of tier {PREMIUM!r}, which the config lacks")
    premium = config.tiers[PREMIUM]
    # the most the front door admits for it (its rate at the controller's largest multiplier), unless
    # the Zipf draw gives the top tenant less (a small load)
    most = premium.rate * config.backpressure.max_multiplier
    top = min(most, float(zipf_rates(tenants, total_rate, exponent)[0]))
    rates = scale_rates(tenants, total_rate, top, exponent)
    names = tuple(f"tenant-{index:05d}" for index in range(1, tenants + 1))
    fleet = config.queue_set.size * config.worker.mapping_concurrency
    return Scenario(
        kind="scale",
        tenants=names,
        rates=tuple(float(rate) for rate in rates),
        work_ms=tuple(work_ms for _ in names),
        subject=0,
        baseline_s=baseline_s,
        event_s=event_s,
        after_s=after_s,
        sample_s=10.0,
        seed=seed,
        capacity=fleet_capacity(config, work_ms, costs),
        tenant_tiers={0: PREMIUM},
        share_outside_event=share_outside,
        notes={
            "offered_rate": total_rate,
            "zipf_exponent": exponent,
            "share_outside_event": share_outside,
            "premium_rate": top,
            "live_queues": config.queue_set.size,
            "mapping_concurrency": config.worker.mapping_concurrency,
            "live_fleet": fleet,
            "stage_throttle": config.api.throttle_rate,
            "work_ms": work_ms,
        },
    )
