"""The noisy-neighbour scenario: 20 tenants at steady rates, one bursting, driven through the local API.

Time is compressed through the blueprint's own configuration (the same context mechanism a user
has, see :data:`DEMO_CONTEXT`): smaller tier limits, a 10 s sideline age, a worker that spends
100 ms per message, and a controller schedule run every few seconds (:func:`runtime_options`). The
load is open-loop (each tenant sends on its own schedule whatever happens to earlier requests), as
real clients do. A sideline queue past 40 waiting messages is archived (the controller starts the
archiver); after the load the demo replays the archive with the job's own entry point on a local
SparkSession.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from local.emulator.runtime import RuntimeOptions

# Applied to every run; the naive run adds NAIVE_CONTEXT. Every key is one a fork can set in cdk.json.
DEMO_CONTEXT: dict[str, Any] = {
    # The emulator's stand-in for the processor's work (local/emulator/processor_hooks.py): 100 ms a message.
    "breakwater_local": {"work_ms": 100},
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
        # The live p99 AgeOfFirstAttempt objective, at the demo's scale (its baseline p99 is under a
        # second), and the shortest oldest-message age an alarm may have.
        "alarms": {"age_of_first_attempt_p99_ms": 2000, "oldest_message_age_seconds": 60},
        "worker": {
            "batch_size": 10,
            "max_concurrency": 2,
            "timeout_seconds": 10,
            "visibility_timeout_multiplier": 3,
            "heartbeat_seconds": 5,
            # The breaker on the processor's dependency, compressed like the rest: it probes again after a
            # second, and never waits more than two while an outage lasts.
            "outage_backoff_seconds": 1,
            "outage_backoff_max_seconds": 2,
        },
    },
}


# The baseline: one standard queue in arrival order, no throttling, no sidelining, no message groups
# (with MessageGroupId = tenant, the embedded SQS orders receives as fair queues do: another
# configuration, FAIR_CONTEXT, the simulator's "fair").
NAIVE_CONTEXT: dict[str, Any] = {"breakwater": {"mode": "naive", "queue_set": {"fair_queues": False}}}
FAIR_CONTEXT: dict[str, Any] = {"breakwater": {"mode": "naive", "queue_set": {"fair_queues": True}}}

KINDS = ("noisy", "slow", "outage", "poison")
EVENT_LABEL = {
    "noisy": "burst",
    "slow": "slowed downstream",
    "outage": "dependency outage",
    "poison": "poison messages",
}


def scenario_context(kind: str) -> dict[str, Any]:
    """What a scenario adds to :data:`DEMO_CONTEXT` (both configurations), as keys a fork can set.

    The poison scenario dead-letters after two receives, and a failed message is visible again after
    one worker timeout, so a poison message reaches its dead-letter queue within the run.
    """
    if kind == "poison":
        return {
            "breakwater": {
                "queue_set": {"max_receive_count": 2},
                "worker": {"visibility_timeout_multiplier": 1},
            }
        }
    return {}


@dataclass(frozen=True)
class Scenario:
    """``tenants`` tenants at ``quiet_rate``; the first (:attr:`noisy`) bursts to ``burst_rate`` for
    ``burst_s`` between a baseline and an after phase. The report's ``scenario`` is these fields."""

    tenants: int = 20
    # Messages per second, each quiet tenant: together they stay below what the emulator's live workers
    # deliver on a laptop (bench/demo_baseline.py measures it), so the baseline is not saturated and the
    # quiet tenants' ages during the burst show the noisy tenant's effect alone.
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
    # (docs/performance.md, Demo, compares the two).
    phases: Literal["together", "spread"] = "together"
    phase_seed: int = 1
    # "noisy": the first tenant sends burst_rate during the burst. "slow": it keeps its rate, but each of
    # its messages in the burst costs slow_factor times the usual work (its downstream slowed down).
    # "outage": every tenant keeps its rate; during the burst phase the processor's dependency is down.
    # "poison": the first tenant sends poison_rate all along, and poison_share of its messages fail
    # every time (until the fix is deployed, after the load).
    kind: Literal["noisy", "slow", "outage", "poison"] = "noisy"
    slow_factor: float = 20.0
    poison_share: float = 0.02
    poison_rate: float = 5.0  # the tier's consumer rate: a busy tenant, within its limits

    def __post_init__(self) -> None:
        if self.phases not in ("together", "spread"):
            raise ValueError(f"phases must be 'together' or 'spread', not {self.phases!r}")
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if not 0 < self.poison_share <= 1:
            raise ValueError(f"poison_share must be in (0, 1], not {self.poison_share!r}")

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
        if self.kind == "poison":
            return self.poison_rate
        return self.burst_rate if self.kind == "noisy" and self.in_burst(t) else self.noisy_rate

    def in_burst(self, t: float) -> bool:
        return self.baseline_s <= t < self.baseline_s + self.burst_s

    def payload(self, tenant: str, t: float) -> dict[str, Any]:
        """The message a tenant sends at ``t``: in the slow scenario, the slowed tenant's burst-phase
        messages ask the sample processor for ``slow_factor`` times the work."""
        if self.kind == "slow" and tenant == self.noisy and self.in_burst(t):
            return {"tenant": tenant, "work_factor": self.slow_factor}
        if self.kind == "poison" and tenant == self.noisy and self.poisoned(t):
            return {"tenant": tenant, "poison": True}
        return {"tenant": tenant}

    def poisoned(self, t: float) -> bool:
        """Whether the poison tenant's message scheduled at ``t`` is poison: one in ``1 / poison_share``.

        Its n-th message is scheduled at first send + n / poison_rate, with the first send inside the
        first period, so ``floor(t * poison_rate)`` numbers its messages 0, 1, 2, ... whatever the phase.
        """
        every = max(1, round(1 / self.poison_share))
        # Halfway through each run of ``every``: clear of the requests the load sends as events instead.
        return math.floor(t * self.poison_rate + 1e-6) % every == every // 2  # sums of 1 / rate drift down

    def phase(self, t: float) -> str:
        if t < self.baseline_s:
            return "baseline"
        if t < self.baseline_s + self.burst_s:
            return "burst"
        return "after"


def runtime_options(workdir: Path) -> RuntimeOptions:
    """How the demo runs the emulator (each configuration in a ``workdir`` of its own).

    Every container the load's path may use is started before it: cold starts are not a queue effect
    (the scheduled and invoked functions get one each: they run one invocation at a time). The host's cap
    stays low, since more containers than the machine's cores can serve only move the wait into moto;
    a function whose SQS mappings allow more invocations at once (the live worker, one mapping per
    live queue) gets more, up to ``mapping_containers``. The schedules run twelve times as often, as
    the scenario's other times are compressed in :data:`DEMO_CONTEXT`.
    """
    return RuntimeOptions(
        workdir=workdir,
        max_containers=6,
        mapping_containers=10,
        warm_containers=10,
        warm_others=1,
        schedule_speedup=12.0,
    )
