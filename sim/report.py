"""What a run means: ages by phase, peak backlog, recovery, the table, the JSON and the plots.

AgeOfFirstAttempt is what the live workers see on a message's first receive from a live queue (the
alarm's metric). Phases are by enqueue time: *before*, *during* and *after* the event. *quiet* is
every tenant but the event's subject; *noisy* is the subject.

The outage scenario's recovery is measured on the age at which messages are *processed* (a first
attempt during an outage is prompt, and fails).

Recovery: the fresh traffic's, as the embedded default measures it. The threshold is twice the quiet
tenants' baseline p99 (at least 50 ms); recovery is the first time after the event's end from which
the quiet messages enqueued since have their p99 within the threshold (0: at once). When quiet
messages sent in the run's last tenth were never served, the run did not recover (``None``).

Cost: the run's AWS calls as billed (:mod:`sim.billing`), priced per million delivered (processed)
messages over the whole run, by service and in total.

What the event costs the tenants, beside the quiet ones' ages:

- ``noisy_fresh_p99_ms``: the p99 age at which the event's subject gets its *own fresh* work done: its
  messages enqueued since the event started (how stale is what it gets back). One accepted and never
  processed within the run (``noisy_fresh_unserved`` counts them: waiting in a queue or a dead-letter
  queue, in a worker's hands, parked by the archiver and not replayed; not expired by then) counts at
  its age when the run ended, a lower bound, so that a configuration that leaves the subject's oldest
  work undone does not look fresher for it; one replayed from the archive counts at its age when
  processed;
- ``stale_processed``: messages processed older than the scenario's TTL, or without one older than
  :data:`FRESHNESS_S` (work done too late to be of use);
- ``dlq_due_to_outage``: in the outage scenario, the messages dead-lettered (none are poison there);
- ``drain_s``: from the event's end until the backlog (live and set aside) is back to its level before
  the event (``None``: not within the run).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from local.columns import aligned
from local.pricing.cost import cost_summary
from sim.scenarios import Scenario
from sim.system import Recording

PHASES = ("before", "during", "after")
FRESHNESS_S = 900.0  # without a TTL: processed later than this after it was sent, a message is stale


def _pct(values: np.ndarray, q: float) -> float | None:
    return round(float(np.percentile(values, q)) * 1000, 1) if len(values) else None


def arrays(rec: Recording, served: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(enqueued, at, tenant) of each first attempt on a live queue, or (``served``) each processing."""
    enqueued = np.asarray(rec.served_enqueued if served else rec.first_enqueued, dtype=np.float64)
    at = np.asarray(rec.served_at if served else rec.first_received, dtype=np.float64)
    tenants = np.asarray(rec.served_tenant if served else rec.first_tenant, dtype=np.int64)
    return enqueued, at, tenants


def summarize(rec: Recording, scenario: Scenario) -> dict[str, Any]:
    enqueued, received, tenants = arrays(rec)
    age = received - enqueued
    quiet = tenants != scenario.subject
    phase = np.where(enqueued < scenario.event_start_s, 0, np.where(enqueued < scenario.event_end_s, 1, 2))
    ages: dict[str, dict[str, Any]] = {}
    for group, mask in (("quiet", quiet), ("noisy", ~quiet)):
        row: dict[str, Any] = {"p50_ms": _pct(age[mask], 50), "p99_ms": _pct(age[mask], 99)}
        for index, name in enumerate(PHASES):
            selected = age[mask & (phase == index)]
            row[f"{name}_p50_ms"] = _pct(selected, 50)
            row[f"{name}_p99_ms"] = _pct(selected, 99)
            row[f"{name}_count"] = len(selected)
        ages[group] = row
    served_enqueued, served_at, served_tenants = arrays(rec, served=True)
    served_age = served_at - served_enqueued
    served_quiet = served_tenants != scenario.subject
    served_phase = np.where(
        served_enqueued < scenario.event_start_s, 0, np.where(served_enqueued < scenario.event_end_s, 1, 2)
    )
    served: dict[str, Any] = {}
    for index, name in enumerate(PHASES):
        selected = served_age[served_quiet & (served_phase == index)]
        served[f"{name}_p50_ms"] = _pct(selected, 50)
        served[f"{name}_p99_ms"] = _pct(selected, 99)
    ages["quiet_served"] = served
    baseline = ages["quiet"]["before_p99_ms"] or 0.0
    threshold_s = 2 * max(baseline, 50.0) / 1000
    if scenario.kind == "outage":
        # A message's first attempt during an outage is prompt and fails: what recovers is when fresh
        # traffic is processed again as fast as before.
        served_baseline = served["before_p99_ms"] or 0.0
        threshold_s = 2 * max(served_baseline, 50.0) / 1000
        recovery_s = _recovery(served_enqueued[served_quiet], served_age[served_quiet], scenario, threshold_s)
    else:
        recovery_s = _recovery(enqueued[quiet], age[quiet], scenario, threshold_s)
    during = ages["quiet"]["during_p99_ms"]
    ratio = during / baseline if during is not None and baseline else None
    bins = _series(enqueued, received, age, quiet, scenario)
    event_bins = [
        value
        for t, value in zip(bins["t_s"], bins["quiet_p99_ms"], strict=True)
        if t >= scenario.event_start_s and value is not None
    ]
    worst = max(event_bins, default=None)
    samples = np.asarray(rec.samples, dtype=np.float64) if rec.samples else np.zeros((0, 5))
    totals = rec.totals
    fresh = ~served_quiet & (served_enqueued >= scenario.event_start_s)
    fresh_ages = np.concatenate([served_age[fresh], _unserved_ages(rec, scenario)])
    freshness_s = scenario.ttl_s if scenario.ttl_s is not None else FRESHNESS_S
    priced = cost_summary(rec.usage, totals.get("processed", 0), scenario.end_s)
    return {
        "ages": ages,
        "quiet_baseline_p99_ms": baseline,
        "quiet_p99_ratio": round(ratio, 3) if ratio is not None else None,
        "quiet_p99_max_ratio": round(worst / baseline, 3) if worst is not None and baseline else None,
        "recovery_threshold_ms": round(threshold_s * 1000, 1),
        "recovery_s": None if recovery_s is None else round(recovery_s, 1),
        "recovery_min": None if recovery_s is None else round(recovery_s / 60, 2),
        "peak_backlog": int(samples[:, 3].max()) if len(samples) else 0,
        "drain_s": _drain_s(samples, scenario),
        "noisy_fresh_p99_ms": _pct(fresh_ages, 99),
        "noisy_fresh_unserved": len(fresh_ages) - int(np.count_nonzero(fresh)),
        "stale_processed": int(np.count_nonzero(served_age > freshness_s)),
        "dlq_due_to_outage": totals.get("in_dlq", 0) if scenario.kind == "outage" else 0,
        "peak_live_backlog": int(samples[:, 1].max()) if len(samples) else 0,
        "peak_sideline_backlog": int(samples[:, 2].max()) if len(samples) else 0,
        "offered": totals.get("offered", 0),
        "accepted": totals.get("accepted", 0),
        "refused": totals.get("refused", 0),
        "processed": totals.get("processed", 0),
        "dropped_ttl": totals.get("dropped", 0),
        "parked": totals.get("archived", 0),
        "replayed": totals.get("replayed", 0),
        "dead_lettered": totals.get("in_dlq", 0),
        "poison_sent": totals.get("poison_sent", 0),
        "poison_in_dlq": totals.get("poison_in_dlq", 0),
        "waiting_at_end": totals.get("waiting_at_end", 0),
        "failed_attempts": totals.get("failed", 0),
        "moved": {name: totals.get(name, 0) for name in ("sidelined", "spilled", "deferred")},
        "controller_runs": rec.controller_runs,
        "usd_per_million": priced["usd_per_million_delivered"],
        "usd_per_million_by_service": priced["usd_per_million_by_service"],
        "cost": {
            key: priced[key]
            for key in ("delivered", "usd_total", "usd_per_million_by_unit", "usage", "prices")
        },
        **_dynamodb(rec),
        "first_attempts": len(age),
        "simulated_messages": totals.get("simulated_messages", 0),
        "wall_s": round(rec.wall_s, 2),
        "messages_per_wall_s": round(totals.get("simulated_messages", 0) / rec.wall_s)
        if rec.wall_s
        else None,
        "series": {
            **bins,
            "backlog_t_s": samples[:, 0].round(1).tolist(),
            "live_backlog": samples[:, 1].astype(int).tolist(),
            "sideline_backlog": samples[:, 2].astype(int).tolist(),
        },
    }


def _unserved_ages(rec: Recording, scenario: Scenario) -> np.ndarray:
    """The ages at the run's end of the subject's messages enqueued since the event started and never
    processed within the run."""
    enqueued = np.asarray(rec.unserved_enqueued, dtype=np.float64)
    tenants = np.asarray(rec.unserved_tenant, dtype=np.int64)
    fresh = enqueued[(tenants == scenario.subject) & (enqueued >= scenario.event_start_s)]
    return np.maximum(scenario.end_s - fresh, 0.0)


THROTTLE_EFFECTS = (
    "batch_failures",  # invocations a gate's error failed whole (none: a gate's error costs its tenant)
    "batch_failure_messages",  # the messages those batches held
    "burst_transactions_cancelled",  # burst transactions throttled (taken for a lost race, tried again)
    "leases_refused_on_error",  # tenants refused a lease because its item stayed throttled: deferred
    "unreleased_leases",  # leases left to expire: their release write stayed throttled
    "pool_places_unreleased",  # burst places left to expire: the pool's write stayed throttled
    "consumer_bucket_failed_open",  # consumer-rate asks answered from the container's own view
    "health_reports_throttled",  # oldest-age reports dropped
    "outage_reports_throttled",  # breaker outage marks dropped
    "front_door_5xx",  # requests whose ingest bucket write stayed throttled past ingest's timeout
    "front_door_retried",  # tenant ticks admitted after botocore's retries of the bucket write
    "controller_runs_failed",  # runs ended by a throttled call they do not catch
)


def _dynamodb(rec: Recording) -> dict[str, Any]:
    """The items' report (hottest items, throttles by kind, the limits) and what the throttles did."""
    report = rec.dynamodb
    return {
        "limits": report.get("limits"),
        "hottest_items": report.get("hottest_items", []),
        "dynamodb_throttles": report.get("dynamodb_throttles", {}),
        "throttle_effects": {name: rec.totals.get(name, 0) for name in THROTTLE_EFFECTS},
        # asks a bucket had refused shortly before, refused again without a write until its refill:
        # ingest's per tenant and tick, the workers' per container, tenant and batch
        "refused_locally": {
            "ingest": rec.totals.get("ingest_refused_locally", 0),
            "consumer": rec.totals.get("consumer_refused_locally", 0),
        },
    }


def hottest_table(results: Mapping[str, Mapping[str, Any]], count: int = 10) -> str:
    """Each configuration's hottest items (peak WCU/s first) and its throttles by kind."""
    lines: list[str] = []
    for name, result in results.items():
        hottest = result.get("hottest_items") or []
        throttles = result.get("dynamodb_throttles") or {}
        lines.append(f"{name}: hottest DynamoDB items ({result.get('limits') or 'limits not stated'})")
        if not hottest:
            lines.append("  (no DynamoDB item: this configuration writes none)")
            continue
        width = max(len(entry["item"]) for entry in hottest[:count])
        lines.append(
            f"  {'item'.ljust(width)}  {'kind':<15} {'peak WCU/s':>10} {'peak RCU/s':>10} {'throttled':>10}"
        )
        for entry in hottest[:count]:
            lines.append(
                f"  {entry['item'].ljust(width)}  {entry['kind']:<15} {entry['peak_wcu_per_s']:>10,.0f} "
                f"{entry['peak_rcu_per_s']:>10,.0f} {entry['throttled']:>10,}"
            )
        lines.append(
            "  throttles by kind: "
            + (", ".join(f"{kind} {count:,}" for kind, count in throttles.items()) or "none")
        )
        effects = {key: value for key, value in (result.get("throttle_effects") or {}).items() if value}
        if effects:
            lines.append(
                "  what they did: " + ", ".join(f"{key} {value:,}" for key, value in effects.items())
            )
    return "\n".join(lines)


def _drain_s(samples: np.ndarray, scenario: Scenario) -> float | None:
    """Seconds from the event's end until the total backlog is back to its level before the event
    (its most then, at least 10 messages); None when it never is within the run."""
    if not len(samples):
        return None
    t, total = samples[:, 0], samples[:, 3]
    before = total[t < scenario.event_start_s]
    level = max(float(before.max()) if len(before) else 0.0, 10.0)
    after = (t >= scenario.event_end_s) & (total <= level)
    if not after.any():
        return None
    return round(float(t[after][0]) - scenario.event_end_s, 1)


def _recovery(enqueued: np.ndarray, age: np.ndarray, scenario: Scenario, threshold_s: float) -> float | None:
    """The first step after the event from which the quiet traffic's p99 stays within the threshold."""
    fresh = enqueued >= scenario.event_end_s
    if not fresh.any():
        return None
    times = enqueued[fresh]
    order = np.argsort(times)
    times = times[order]
    slow = (age[fresh][order] > threshold_s).astype(np.int64)
    last_sent = float(times[-1])
    if last_sent < scenario.load_end_s - 0.1 * (scenario.load_end_s - scenario.event_end_s):
        return None  # the fresh traffic of the run's last stretch was never served
    # suffix counts: messages (and slow ones) enqueued from each step on
    slow_after = np.concatenate([np.cumsum(slow[::-1])[::-1], [0]])
    step = scenario.sample_s
    for since in np.arange(0.0, scenario.load_end_s - scenario.event_end_s, step):
        first = int(np.searchsorted(times, scenario.event_end_s + since))
        total = len(times) - first
        if total == 0 or slow_after[first] <= 0.01 * total:
            return float(since)
    return None


def _series(
    enqueued: np.ndarray, received: np.ndarray, age: np.ndarray, quiet: np.ndarray, scenario: Scenario
) -> dict[str, list[Any]]:
    """p99 age per bin of receive time (a minute at seed scale), quiet and noisy."""
    width = 60.0 if scenario.end_s > 3600 else max(scenario.sample_s, 1.0)
    edges = np.arange(0.0, scenario.end_s + width, width)
    index = np.clip(np.searchsorted(edges, received, side="right") - 1, 0, len(edges) - 1)
    out: dict[str, list[Any]] = {"t_s": edges[:-1].tolist(), "quiet_p99_ms": [], "noisy_p99_ms": []}
    order = np.argsort(index, kind="stable")
    sorted_index = index[order]
    bounds = np.searchsorted(sorted_index, np.arange(len(edges)))
    for b in range(len(edges) - 1):
        members = order[bounds[b] : bounds[b + 1]]
        for name, mask in (("quiet_p99_ms", quiet), ("noisy_p99_ms", ~quiet)):
            chosen = age[members[mask[members]]]
            out[name].append(_pct(chosen, 99))
    return out


def table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """One column per configuration, one row per figure."""
    names = list(results)
    rows: list[tuple[str, list[str]]] = []

    def fmt(value: Any, scale: float = 1.0, unit: str = "") -> str:
        if value is None:
            return "-"
        if isinstance(value, float) or scale != 1.0:
            number = value / scale
            if number >= 100:
                return f"{number:,.0f}{unit}"
            return f"{number:.2f}{unit}" if number < 10 else f"{number:.1f}{unit}"
        return f"{value:,}{unit}"

    for group in ("quiet", "noisy"):
        for phase in PHASES:
            for q in ("p50", "p99"):
                rows.append(
                    (
                        f"{group} {q} age {phase}",
                        [fmt(results[name]["ages"][group][f"{phase}_{q}_ms"], 1000, " s") for name in names],
                    )
                )
    for phase in PHASES:
        rows.append(
            (
                f"quiet p99 until processed {phase}",
                [fmt(results[name]["ages"]["quiet_served"][f"{phase}_p99_ms"], 1000, " s") for name in names],
            )
        )
    for label, key, unit in (
        ("quiet p99 ratio (event/baseline)", "quiet_p99_ratio", "x"),
        ("quiet p99 worst minute / baseline", "quiet_p99_max_ratio", "x"),
        ("time to recover", "recovery_min", " min"),
        ("peak backlog", "peak_backlog", ""),
        ("backlog drained after the event", "drain_s", " s"),
        ("subject's fresh work p99 age", "noisy_fresh_p99_ms", " ms"),
        ("subject's fresh work never processed", "noisy_fresh_unserved", ""),
        ("stale work processed", "stale_processed", ""),
        ("dead-lettered by the outage", "dlq_due_to_outage", ""),
        ("peak live backlog", "peak_live_backlog", ""),
        ("accepted", "accepted", ""),
        ("refused", "refused", ""),
        ("dropped by TTL", "dropped_ttl", ""),
        ("parked (archived)", "parked", ""),
        ("replayed from the archive", "replayed", ""),
        ("dead-lettered", "dead_lettered", ""),
        ("waiting at end", "waiting_at_end", ""),
        ("DynamoDB throttles", "dynamodb_throttled", ""),
        ("batches failed by a throttle", "batch_failures", ""),
    ):
        cells = []
        for name in names:
            value = _figure(results[name], key)
            cells.append(
                "not recovered" if key == "recovery_min" and value is None else fmt(value, 1.0, unit)
            )
        rows.append((label, cells))
    services = [
        service
        for service in next(iter(results.values()), {}).get("usd_per_million_by_service", {})
        if any(results[name]["usd_per_million_by_service"].get(service) for name in names)
    ]
    for service in services:
        rows.append(
            (
                f"$ per million delivered: {service}",
                [_usd(results[name]["usd_per_million_by_service"].get(service)) for name in names],
            )
        )
    if services:
        total = [_usd(results[name].get("usd_per_million")) for name in names]
        rows.append(("$ per million delivered", total))
    rows.append(("wall time", [fmt(results[name].get("wall_s"), 1.0, " s") for name in names]))
    return aligned(names, rows)


def _figure(result: Mapping[str, Any], key: str) -> Any:
    if key == "dynamodb_throttled":
        return sum((result.get("dynamodb_throttles") or {}).values())
    if key == "batch_failures":
        return (result.get("throttle_effects") or {}).get("batch_failures", 0)
    return result.get(key)


def _usd(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def write_json(
    path: Path, scenario: Scenario, results: Mapping[str, Mapping[str, Any]], extra: Mapping[str, Any]
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"scenario": scenario.describe(), **extra, "configurations": results}
    path.write_text(json.dumps(document, indent=1, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON: {type(value).__name__}")


def plot(
    path: Path, described: Mapping[str, Any], results: Mapping[str, Mapping[str, Any]], title: str
) -> None:
    """Quiet tenants' p99 AgeOfFirstAttempt and the backlog over virtual time, one line per configuration.

    ``described`` is :meth:`Scenario.describe` (as the JSON holds it), so a plot can be drawn again
    from ``out/sim/<scenario>.json`` alone (``python -m sim.report out/sim/noisy.json out.png``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = float(described["baseline_s"])
    end = start + float(described["event_s"])
    total = end + float(described["after_s"]) + float(described["drain_s"])
    minutes = total > 3600
    scale = 60.0 if minutes else 1.0
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    colours = {"naive": "tab:red", "fair": "tab:orange", "breakwater": "tab:blue"}
    styles = {"naive": "-", "fair": "--", "breakwater": "-"}
    for name, result in results.items():
        series = result["series"]
        t = np.asarray(series["t_s"]) / scale
        p99 = np.asarray([np.nan if v is None else v / 1000 for v in series["quiet_p99_ms"]])
        top.plot(
            t, p99, label=f"{name}: quiet p99", color=colours.get(name), lw=1.4, ls=styles.get(name, "-")
        )
        bt = np.asarray(series["backlog_t_s"]) / scale
        bottom.plot(
            bt,
            series["live_backlog"],
            label=f"{name}: live",
            color=colours.get(name),
            lw=1.4,
            ls=styles.get(name, "-"),
        )
        if any(series["sideline_backlog"]):
            bottom.plot(
                bt,
                series["sideline_backlog"],
                label=f"{name}: sidelined",
                color=colours.get(name),
                lw=1.0,
                ls=":",
            )
    for axis in (top, bottom):
        axis.axvspan(start / scale, end / scale, color="grey", alpha=0.15)
        axis.grid(alpha=0.3)
        axis.legend(loc="upper right", fontsize=8)
    top.set_yscale("log")
    top.set_ylabel("AgeOfFirstAttempt p99 (s)")
    bottom.set_yscale("symlog", linthresh=100)
    bottom.set_ylim(bottom=0)
    bottom.set_ylabel("messages in the queues")
    bottom.set_xlabel("virtual time (min)" if minutes else "virtual time (s)")
    top.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Draw a plot again from a run's JSON: ``python -m sim.report out/sim/noisy.json out/sim/noisy.png``."""
    import sys

    source, target = (argv if argv is not None else sys.argv[1:])[:2]
    document = json.loads(Path(source).read_text())
    described = document["scenario"]
    title = (
        f"{described['kind']}: {described['tenants']} tenants, quiet p99 AgeOfFirstAttempt and the backlog "
        "(grey: the event)"
    )
    plot(Path(target), described, document["configurations"], title)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
