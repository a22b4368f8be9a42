"""What the outage and poison scenarios measure, from the run's samples and the processor's effects.

The effects come from the local processor hooks (``local/emulator/processor_hooks.py``): one line per
message the processor really ran, with when it was enqueued and when it finished. They are what
"served" means below, so a message a worker received but set aside (a breaker holding it, a move) is
not counted as served when it was received.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from local.scenarios.measures import drain_seconds
from local.scenarios.noisy_neighbour import Scenario

FRESH_WITHIN = 1.5  # fresh traffic has recovered when its p99 age is back within this much of the baseline's
STEP_S = 0.5


class FaultSwitches:
    """The switches the processor hooks read (``BREAKWATER_LOCAL_FAULTS``), replaced atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.values: dict[str, bool] = {}
        self.set()

    def set(self, **values: bool) -> None:
        self.values.update(values)
        path = self.path.with_suffix(".tmp")
        path.write_text(json.dumps(self.values), encoding="utf-8")
        path.replace(self.path)


def read_effects(path: Path) -> list[dict[str, Any]]:
    """Every processing the hooks recorded, in the order they were written."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def duplicated(effects: list[dict[str, Any]]) -> int:
    """Messages the processor ran more than once (each extra run counts)."""
    return sum(count - 1 for count in Counter(effect["id"] for effect in effects).values() if count > 1)


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, -(-99 * len(ordered) // 100) - 1))]


def outage_figures(
    scenario: Scenario,
    started: float,
    effects: list[dict[str, Any]],
    accepted_at: list[tuple[float, str]],
    depths: list[tuple[float, int, int, int]],
    first_attempts: list[tuple[float, str, float, str]],
) -> dict[str, Any]:
    """Fresh recovery, drain and backlog around the outage (the burst phase); times in seconds.

    ``fresh_recovery_s``: the first ``s`` after the outage's end from which the p99 age at which the
    processor ran the messages enqueued since ``end + s`` is within :data:`FRESH_WITHIN` of the p99
    of those enqueued and run before the outage. A message accepted in that span and not run during the live
    part of the run (set aside, parked) counts as infinitely old. ``fresh_recovery_first_receive_s``
    is the same on the age of first receive (what the AgeOfFirstAttempt metric measures), which does
    not see a message that was received and set aside.
    ``drain_s``: from the outage's end until the live and sideline queues hold no more than the
    baseline's deepest backlog (``local.scenarios.measures.drain_seconds``, as every scenario's report
    has it): everything the outage left is processed, parked or dropped.
    """
    start, end = scenario.baseline_s, scenario.baseline_s + scenario.burst_s
    first_runs: dict[str, tuple[float, float]] = {}  # id -> (enqueued t, age s when it was run)
    for effect in effects:
        if effect["id"] not in first_runs:
            enqueued = effect["enqueued_at"] / 1000 - started
            first_runs[effect["id"]] = (enqueued, (effect["at"] - effect["enqueued_at"]) / 1000)
    runs = sorted(first_runs.values())
    # The service before the outage: messages enqueued and run before it began (one the outage caught
    # is part of what it did, not of the baseline).
    baseline = p99([age for (t, age) in runs if t + age < start])
    baseline_receive = p99(
        [age / 1000 for (t, _, age, role) in first_attempts if role == "live" and t < start]
    )
    accepted = sorted(t for (t, _) in accepted_at)

    def recovered_from(s: float) -> bool:
        since = end + s
        ages = [age for (t, age) in runs if t >= since]
        unserved = max(0, sum(1 for t in accepted if t >= since) - len(ages))
        ages += [float("inf")] * unserved
        worst = p99(ages)
        return baseline is not None and (worst is None or worst <= FRESH_WITHIN * max(baseline, 0.05))

    def received_from(s: float) -> bool:
        since = end + s
        ages = [
            age / 1000 for (t, _, age, role) in first_attempts if role == "live" and t - age / 1000 >= since
        ]
        worst = p99(ages)
        return baseline_receive is not None and (
            worst is None or worst <= FRESH_WITHIN * max(baseline_receive, 0.05)
        )

    after_s = scenario.after_s
    steps = [i * STEP_S for i in range(int(after_s / STEP_S) + 1)]
    at_end = min(depths, key=lambda d: abs(d[0] - end), default=None)
    return {
        "outage_s": scenario.burst_s,
        "baseline_p99_run_age_s": baseline,
        "fresh_recovery_s": next((s for s in steps if recovered_from(s)), None),
        "fresh_recovery_first_receive_s": next((s for s in steps if received_from(s)), None),
        "drain_s": drain_seconds(depths, start, end),
        "backlog_at_outage_end": (at_end[1] + at_end[2]) if at_end else None,
        "peak_backlog": max((live + side for (_, live, side, _) in depths), default=0),
        "accepted_during_outage": sum(1 for t in accepted if start <= t < end),
    }
