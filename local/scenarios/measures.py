"""The measures that set the configurations apart (naive, fair, breakwater), as the simulator names them.

Every report of the embedded scenarios has them per configuration, with the meaning ``sim/report.py``
gives them at seed scale; times here are seconds after the start of the load, and the *event* is the
scenario's burst phase (the burst, the slowdown, the outage; the poison scenario's middle phase, as its
``quiet_p99_ratio`` has it).

- ``quiet_p99_ratio``: the quiet tenants' p99 age at first attempt (live queues) during the event and
  for 10 s after it, over before it (``local.scenarios.report.summarize``);
- ``quiet_p99_max_ratio``: the quiet tenants' worst window of :data:`WINDOW_S` (by first-attempt time,
  windows from the event's start to the last first attempt) by p99 age, over their baseline p99: the
  simulator's worst minute, at the demo's compressed time (``quiet_p99_max_window_s`` in the JSON);
- ``noisy_fresh_p99_ms``: the p99 age at which the processor ran the event subject's (tenant-01's) own
  messages enqueued since the event started: how stale the work it gets back is. From the processor
  hooks' effects (each carries when its envelope was enqueued, at the front door, and when it ran),
  each message once. One never run within the run (``noisy_fresh_unserved`` counts them) counts at its
  age when the run ended, the latest fresh send times taken as theirs: a lower bound, so that a
  configuration that leaves the subject's oldest work undone does not look fresher for it.
  ``noisy_fresh_first_attempt_p99_ms`` is the same on the age at first receive (a message's send time is
  its first attempt's time less its age);
- ``stale_processed``: messages run older than :data:`FRESHNESS_S` (no scenario sets a TTL): the
  simulator's window of three default sideline ages, at the demo's compression (three of its 10 s);
- ``dlq_due_to_outage``: in the outage scenario the messages dead-lettered (none is poison there), 0 in
  the others;
- ``peak_backlog``: the most the live and sideline queues held together (per sample);
- ``drain_s``: from the event's end until they hold no more than before the event (:func:`drain_seconds`);
- ``usd_per_million``: the cost section's total $ per million delivered messages.
"""

from __future__ import annotations

import math
from typing import Any

from local.scenarios.noisy_neighbour import DEMO_CONTEXT, Scenario
from local.scenarios.observations import Observations

WINDOW_S = 10.0  # the worst window of the quiet tenants' ages: a minute at seed scale, compressed
# A message run this long after it was sent did its work too late (the simulator's 900 s is three of the
# template's 300 s sideline ages; the demo's sideline age is compressed to 10 s).
FRESHNESS_S = 3.0 * DEMO_CONTEXT["breakwater"]["sideline"]["sideline_age_seconds"]
DRAIN_SLACK = 5  # messages above the baseline's deepest backlog that still count as drained


# The rows of the side-by-side table (console and HTML): (label, report key, unit). {window} and
# {freshness} are the report's own figures.
MEASURES: tuple[tuple[str, str, str], ...] = (
    ("quiet p99 age, event / before", "quiet_p99_ratio", "x"),
    ("quiet p99 age, worst {window:g} s / before", "quiet_p99_max_ratio", "x"),
    ("tenant-01's fresh work, p99 age when run", "noisy_fresh_p99_ms", "ms"),
    ("tenant-01's fresh messages never run", "noisy_fresh_unserved", ""),
    ("stale work run (older than {freshness:g} s)", "stale_processed", ""),
    ("dead-lettered because of the outage", "dlq_due_to_outage", ""),
    ("peak backlog (live + sideline)", "peak_backlog", ""),
    ("backlog drained after the event", "drain_s", "s"),
    ("$ per million delivered", "usd_per_million", "$"),
)


def percentile(values: list[float], q: float) -> float | None:
    """The ``q``-th percentile of ``values`` by the nearest rank (None: no values)."""
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[index]


def measure_rows(results: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """:data:`MEASURES` formatted, a cell per configuration (``-``: the report lacks it)."""
    first = results[0] if results else {}
    labels = {
        "window": first.get("quiet_p99_max_window_s") or WINDOW_S,
        "freshness": first.get("freshness_s") or FRESHNESS_S,
    }
    return [
        (label.format(**labels), [_cell(result.get(key), unit, key) for result in results])
        for label, key, unit in MEASURES
    ]


def _cell(value: Any, unit: str, key: str) -> str:
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return "not within the run" if key == "drain_s" and value is None else "-"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "$":
        return f"${value:,.2f}"
    if unit == "s":
        return f"{value:,.1f} s"
    return f"{value:,.0f}" + (f" {unit}" if unit else "")


def drain_seconds(depths: list[tuple[float, int, int, int]], start: float, end: float) -> float | None:
    """Seconds from ``end`` until the live and sideline queues hold no more than their deepest before
    ``start`` (plus :data:`DRAIN_SLACK`): what the event left is processed, parked or dropped. None: not
    within the samples."""
    baseline = max((live + side for (t, live, side, _) in depths if t < start), default=0)
    return next(
        (t - end for (t, live, side, _) in depths if t >= end and live + side <= baseline + DRAIN_SLACK),
        None,
    )


def worst_window_p99(
    rows: list[tuple[float, float]], start: float, window_s: float = WINDOW_S
) -> tuple[float | None, list[tuple[float, float | None]]]:
    """The worst p99 of ``rows`` ((t, age ms)) over windows of ``window_s`` from ``start`` on, and the
    p99 of each window (start, p99; None where it holds no row)."""
    last = max((t for t, _ in rows), default=start)
    windows: list[tuple[float, float | None]] = []
    begin = start
    while begin <= last:
        ages = [age for t, age in rows if begin <= t < begin + window_s]
        windows.append((begin, percentile(ages, 99)))
        begin += window_s
    return max((p99 for _, p99 in windows if p99 is not None), default=None), windows


def comparison(
    scenario: Scenario,
    obs: Observations,
    first_attempts: list[tuple[float, str, float, str]],
    effects: list[dict[str, Any]],
    *,
    in_dlq: int,
    cost: dict[str, Any] | None,
    ended_t: float | None = None,
) -> dict[str, Any]:
    """The measures above for one configuration's run: ``obs`` its observations (accepted messages,
    depths; ``obs.started`` the load's start, epoch seconds), ``first_attempts`` the workers' EMF rows
    (t, tenant, age ms, queue role), ``effects`` every processing the hooks recorded (epoch ms);
    ``ended_t``: when the run stopped (seconds after the start; default the last depth sample)."""
    start, end = scenario.baseline_s, scenario.baseline_s + scenario.burst_s
    subject = scenario.noisy
    live = [(t, tenant, age) for (t, tenant, age, role) in first_attempts if role == "live"]
    quiet = [(t, age) for (t, tenant, age) in live if tenant != subject]
    baseline = percentile([age for t, age in quiet if t < start], 99)
    worst, windows = worst_window_p99(quiet, start)
    runs: dict[str, tuple[float, float]] = {}  # envelope id -> (enqueued t, age ms when first run)
    for effect in effects:
        if effect["id"] not in runs:
            runs[effect["id"]] = (
                effect["enqueued_at"] / 1000 - obs.started,
                float(effect["at"] - effect["enqueued_at"]),
            )
    subject_runs = _subject_runs(effects, runs, subject, start)
    fresh_sent = sorted(t for (t, tenant) in obs.accepted_at if tenant == subject and t >= start)
    fresh_accepted = len(fresh_sent)
    unserved = max(0, fresh_accepted - len(subject_runs))
    if ended_t is None:
        ended_t = max((row[0] for row in obs.depths), default=end)
    waiting = [max(0.0, ended_t - t) * 1000 for t in fresh_sent[fresh_accepted - unserved :]]
    fresh_first = [age for (t, tenant, age) in live if tenant == subject and t - age / 1000 >= start]
    totals = [live_depth + side for (_, live_depth, side, _) in obs.depths]
    return {
        "quiet_baseline_p99_ms": baseline,
        "quiet_p99_max_ratio": worst / max(baseline, 1.0) if worst is not None and baseline else None,
        "quiet_p99_max_window_s": WINDOW_S,
        "quiet_p99_windows_ms": windows,
        "noisy_fresh_p99_ms": percentile(subject_runs + waiting, 99),
        "noisy_fresh_processed": len(subject_runs),
        "noisy_fresh_unserved": unserved,
        "noisy_fresh_first_attempt_p99_ms": percentile(fresh_first, 99),
        "stale_processed": sum(1 for (_, age) in runs.values() if age > FRESHNESS_S * 1000),
        "freshness_s": FRESHNESS_S,
        "dlq_due_to_outage": in_dlq if scenario.kind == "outage" else 0,
        "peak_backlog": max(totals, default=0),
        "drain_s": drain_seconds(obs.depths, start, end),
        "usd_per_million": (cost or {}).get("usd_per_million_delivered"),
    }


def _subject_runs(
    effects: list[dict[str, Any]], runs: dict[str, tuple[float, float]], subject: str, start: float
) -> list[float]:
    """The ages (ms) at which the subject's messages enqueued since ``start`` were first run."""
    ids = {effect["id"] for effect in effects if effect["tenant"] == subject}
    return [age for envelope, (enqueued, age) in runs.items() if envelope in ids and enqueued >= start]
