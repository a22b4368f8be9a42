"""Backpressure and organic growth: the controller's per-tenant inbound rate multiplier, and live health.

A tenant whose backlog grows past ``backlog_target`` gets its inbound rate scaled by
``target / backlog`` (inverse-proportional, never below ``min_multiplier``): the bigger the backlog,
the harder ingest pushes back, so the backlog cannot become insurmountable. As it drains the factor
rises again on its own, back to 1 once the backlog is under the target. A tenant that keeps running
near its limit with no backlog to speak of earns ``growth_step`` more per run, up to
``max_multiplier`` (organic growth within the tier ceiling), and gives it back a step per run once
it uses less than ``low_use`` of its grown limit: growth follows use both ways, so a burst long past
does not leave a tenant with a larger share of the shared capacity for good. Use is the share of the
current limit the tenant was admitted at (a few throttled requests in a quiet minute are not full
use). The backlog itself is estimated in :mod:`breakwater.backlog`. Everything here is pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple


class MultiplierChange(StrEnum):
    THROTTLE = "throttle"  # backlog over target: factor below 1
    RELEASE = "release"  # was throttled, backlog back under target: factor back to 1
    GROW = "grow"  # near the limit, no backlog: organic growth
    SHRINK = "shrink"  # grown, but using little of it: a step back toward 1
    HOLD = "hold"


@dataclass(frozen=True)
class BackpressurePolicy:
    backlog_target: int
    min_multiplier: float
    growth_step: float
    max_multiplier: float
    near_limit: float = 0.8  # utilisation (share of the current limit) that counts as "near the limit"
    quiet_backlog_fraction: float = 0.1  # backlog under this share of the target counts as "no backlog"
    low_use: float = 0.5  # a grown tenant using less than this share of its limit gives a step back

    def __post_init__(self) -> None:
        if not 0 <= self.low_use < self.near_limit:
            raise ValueError(f"low_use ({self.low_use}) must be in [0, near_limit ({self.near_limit}))")


def pressure_factor(backlog: int, config: BackpressurePolicy) -> float:
    """``min(1, target / backlog)``, bounded below by ``min_multiplier``."""
    if backlog <= config.backlog_target:
        return 1.0
    return max(config.min_multiplier, config.backlog_target / backlog)


def utilisation(accepted_delta: float, elapsed_s: float, limit_rate: float) -> float:
    """Share of the tenant's current limit it was admitted at since the last run (0 with no interval).

    Throttled requests are not counted: a tenant held at its limit is admitted at about the limit
    (its bucket refills at that rate), so it reads near 1 anyway, while a burst that was throttled for
    a moment in an otherwise quiet minute reads as the small share it is. Clients retrying a refusal
    in a loop do not inflate it either.
    """
    if elapsed_s <= 0 or limit_rate <= 0:
        return 0.0
    return max(0.0, accepted_delta) / (elapsed_s * limit_rate)


class MultiplierDecision(NamedTuple):
    """A named tuple: one is decided for every changed tenant of every run (see ``backlog.Estimate``)."""

    multiplier: float
    change: MultiplierChange


def next_multiplier(
    current: float, backlog: int, used: float | None, config: BackpressurePolicy
) -> MultiplierDecision:
    """The multiplier for the next minute, from the current one, the backlog and the utilisation
    (None: not measured yet, so neither grown nor shrunk)."""
    factor = pressure_factor(backlog, config)
    if factor < 1.0:
        return MultiplierDecision(round(factor, 4), MultiplierChange.THROTTLE)
    if current < 1.0:
        return MultiplierDecision(1.0, MultiplierChange.RELEASE)
    quiet = backlog <= config.backlog_target * config.quiet_backlog_fraction
    if used is not None and quiet and used >= config.near_limit and current < config.max_multiplier:
        grown = min(config.max_multiplier, current + config.growth_step)
        return MultiplierDecision(round(grown, 4), MultiplierChange.GROW)
    if used is not None and used < config.low_use and current > 1.0:
        shrunk = max(1.0, min(current, config.max_multiplier) - config.growth_step)
        return MultiplierDecision(round(shrunk, 4), MultiplierChange.SHRINK)
    return MultiplierDecision(min(current, config.max_multiplier), MultiplierChange.HOLD)


@dataclass(frozen=True)
class LiveHealth:
    depth: int
    oldest_age_s: float | None  # None when no worker reported recently
    healthy: bool


def live_health(
    depth: int, oldest_age_ms: int | None, observed_at_ms: int | None, now_ms: int, healthy_age_s: int
) -> LiveHealth:
    """Live queues are healthy when the oldest message workers saw is younger than ``healthy_age_s``.

    SQS has no age attribute, so the age comes from the workers' observations. An observation older
    than ``healthy_age_s`` is stale: with messages waiting that means nobody is draining them
    (unhealthy); with empty queues there is simply nothing to observe (healthy).
    """
    fresh = (
        observed_at_ms is not None
        and oldest_age_ms is not None
        and now_ms - observed_at_ms <= healthy_age_s * 1000
    )
    if not fresh:
        return LiveHealth(depth=depth, oldest_age_s=None, healthy=depth == 0)
    age_s = (oldest_age_ms or 0) / 1000
    return LiveHealth(depth=depth, oldest_age_s=age_s, healthy=age_s <= healthy_age_s)
