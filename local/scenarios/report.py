"""The demo's report: per configuration and tenant group, the figures ``out/report.json`` holds.

Per tenant group (noisy / quiet): p50 and p99 AgeOfFirstAttempt on the live queues, before and
during the burst, the peak live backlog, the workers' processed / dropped / sidelined / spilled /
deferred counts; per configuration: the quiet tenants' p99 ratio (burst over baseline), the recovery
after the burst, AWS requests per delivered message, and the accounting of every accepted message.
The demo adds ``cost``: $ per million delivered messages by service (``local.pricing``), and the
measures that set the configurations apart (``local.scenarios.measures``). :func:`table` prints the
headline rows, those measures (:func:`comparison_table`) and the cost of each configuration side by
side, :func:`plot` draws ``out/age_by_tenant.png``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

from local.columns import aligned
from local.pricing.cost import side_by_side
from local.scenarios.limits_report import limits_lines
from local.scenarios.measures import measure_rows, percentile
from local.scenarios.noisy_neighbour import Scenario
from local.scenarios.observations import COUNTER_NAMES, Observations

__all__ = ["comparison_table", "cost_table", "percentile", "plot", "summarize", "table"]


def summarize(
    name: str,
    scenario: Scenario,
    obs: Observations,
    first_attempts: list[tuple[float, str, float, str]],
    counters: dict[str, dict[str, int]],
    requests: Counter[str],
    final_depths: tuple[int, int, int],
    emf_ages: list[float],
    runtime_summary: dict[str, Any],
    setup_s: float,
    workers_deployed: bool,
    parked: dict[str, Any] | None = None,
) -> dict[str, Any]:
    burst_start, burst_end = scenario.baseline_s, scenario.baseline_s + scenario.burst_s
    groups = {"noisy": {scenario.noisy}, "quiet": set(scenario.tenant_ids) - {scenario.noisy}}
    live_first = [row for row in first_attempts if row[3] == "live"]
    hook_first = [row for row in obs.first_attempts if row[3] == "live"]
    result: dict[str, Any] = {"config": name, "groups": {}}
    for group, members in groups.items():
        ages = [age for (_, tenant, age, _) in live_first if tenant in members]
        before = [age for (t, tenant, age, _) in live_first if tenant in members and t < burst_start]
        during = [
            age
            for (t, tenant, age, _) in live_first
            if tenant in members and burst_start <= t < burst_end + 10
        ]
        totals = Counter[str]()
        for tenant in members:
            totals.update(counters.get(tenant, {}))
        accepted = sum(obs.accepted[t] for t in members)
        first_attempted = sum(1 for (_, tenant, _, _) in live_first if tenant in members)
        result["groups"][group] = {
            "tenants": len(members),
            "accepted": accepted,
            "throttled": sum(obs.throttled[t] for t in members),
            "rejected": sum(obs.rejected[t] for t in members),
            "first_attempts_live": first_attempted,
            "age_p50_ms": percentile(ages, 50),
            "age_p99_ms": percentile(ages, 99),
            "age_p99_before_burst_ms": percentile(before, 99),
            "age_p99_during_burst_ms": percentile(during, 99),
            # the same ages measured where the mapping hands the batch over: a cross-check of the EMF
            "delivery_hook_age_p99_ms": percentile(
                [age for (_, tenant, age, _) in hook_first if tenant in members], 99
            ),
            "peak_live_backlog": _peak_backlog(obs, members, live_first),
            **{name: totals.get(name, 0) for name in COUNTER_NAMES},
        }
    quiet = result["groups"]["quiet"]
    ratio = None
    if quiet["age_p99_before_burst_ms"] and quiet["age_p99_during_burst_ms"] is not None:
        ratio = quiet["age_p99_during_burst_ms"] / max(quiet["age_p99_before_burst_ms"], 1.0)
    baseline_depth = max((d[1] for d in obs.depths if d[0] < burst_start), default=0)
    recovery = None
    for t, live, _, _ in obs.depths:
        if t >= burst_end and live <= baseline_depth + 10:
            recovery = t - burst_end
            break
    delivered = sum(g["processed"] for g in result["groups"].values())
    accepted_total = sum(g["accepted"] for g in result["groups"].values())
    dropped_total = sum(g["dropped"] for g in result["groups"].values())
    live_left, sideline_left, dlq = final_depths
    # Left the queues for S3 (deleted once archived), and came back by the replay.
    archived = parked["archived"] if parked else 0
    replayed = parked["replay"]["replayed"] if parked and parked["replay"] else 0
    result.update(
        {
            "quiet_p99_ratio_burst_vs_baseline": ratio,
            "quiet_p99_ratio": ratio,  # the same figure, under the name every scenario's report uses
            "recovery_s_after_burst": recovery,
            "peak_live_depth": max((d[1] for d in obs.depths), default=0),
            "peak_sideline_depth": max((d[2] for d in obs.depths), default=0),
            "aws_requests": sum(requests.values()),
            "aws_requests_by_operation": dict(requests.most_common()),
            "aws_requests_per_delivered_message": (sum(requests.values()) / delivered) if delivered else None,
            "emf_age_of_first_attempt_live": {
                "count": len(emf_ages),
                "p50_ms": percentile(emf_ages, 50),
                "p99_ms": percentile(emf_ages, 99),
            },
            "accounting": {
                "accepted": accepted_total,
                "processed": delivered,
                "dropped_expired": dropped_total,
                "queued": live_left + sideline_left,
                "waiting_in_live_queues": live_left,
                "waiting_in_sideline_queues": sideline_left,
                "in_dlq": dlq,
                "archived": archived,
                "replayed": replayed,
                "parked_in_archive": archived - replayed,
                "unaccounted": accepted_total
                - delivered
                - dropped_total
                - live_left
                - sideline_left
                - dlq
                - (archived - replayed),
            },
            "archive_and_replay": parked,
            "workers_deployed": workers_deployed,
            "setup_s": setup_s,
            "scenario": asdict(scenario),
            "runtime": runtime_summary,
            "series": {
                "first_attempts": [
                    (round(t, 3), tenant, round(age, 1), role) for (t, tenant, age, role) in first_attempts
                ],
                "depths": obs.depths,
            },
        }
    )
    return result


def _peak_backlog(
    obs: Observations, members: set[str], live_first: list[tuple[float, str, float, str]]
) -> int:
    """The group's messages accepted but not yet attempted on a live queue, at its worst (per sample)."""
    accepted = sorted(t for (t, tenant) in obs.accepted_at if tenant in members)
    attempted = sorted(t for (t, tenant, _, _) in live_first if tenant in members)
    peak = a = b = 0
    for t, *_ in obs.depths:
        while a < len(accepted) and accepted[a] <= t:
            a += 1
        while b < len(attempted) and attempted[b] <= t:
            b += 1
        peak = max(peak, a - b)
    return peak


def table(results: list[dict[str, Any]]) -> str:
    """The headline figures, one row per configuration and tenant group."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:,.0f}"

    header = (
        f"{'config':10s} {'group':6s} {'accepted':>8s} {'429s':>6s} {'p50 age ms':>10s} {'p99 age ms':>10s} "
        f"{'p99 pre':>8s} {'p99 burst':>9s} {'peak backlog':>12s} {'processed':>9s} {'dropped':>7s} "
        f"{'sidelined':>9s} {'spilled':>7s} {'deferred':>8s}"
    )
    lines = [header, "-" * len(header)]
    for result in results:
        for group, g in result["groups"].items():
            lines.append(
                f"{result['config']:10s} {group:6s} {g['accepted']:8d} {g['throttled']:6d} "
                f"{ms(g['age_p50_ms']):>10s} "
                f"{ms(g['age_p99_ms']):>10s} {ms(g['age_p99_before_burst_ms']):>8s} "
                f"{ms(g['age_p99_during_burst_ms']):>9s} {g['peak_live_backlog']:12d} {g['processed']:9d} "
                f"{g['dropped']:7d} {g['sidelined']:9d} {g['spilled']:7d} {g['deferred']:8d}"
            )
    lines.append("")
    for result in results:
        ratio = result["quiet_p99_ratio_burst_vs_baseline"]
        per_message = result["aws_requests_per_delivered_message"]
        recovery = result["recovery_s_after_burst"]
        lines.append(
            f"{result['config']:10s} quiet p99 burst/baseline = {'-' if ratio is None else f'{ratio:.2f}x'}; "
            f"recovery after burst = {'not within the run' if recovery is None else f'{recovery:.0f} s'}; "
            f"AWS requests per delivered message = {'-' if per_message is None else f'{per_message:.1f}'}; "
            f"unaccounted = {result['accounting']['unaccounted']}"
        )
        scenario_line = _scenario_line(result)
        if scenario_line:
            lines.append(f"{result['config']:10s} {scenario_line}")
        parked = result.get("archive_and_replay")
        if parked and parked["archiver_runs"]:
            replay = parked["replay"] or {}
            lines.append(
                f"{result['config']:10s} archived (in S3, {parked['archiver_runs']} archiver runs) = "
                f"{parked['archived']}; replayed after the load = {replay.get('replayed', 0)} "
                f"(read {replay.get('read', 0)}, deduplicated {replay.get('deduplicated', 0)}, "
                f"expired {replay.get('expired', 0)}, failed {replay.get('failed', 0)}; "
                f"job {replay.get('job_seconds', 0):.0f} s on local[2])"
            )
    if any("quiet_p99_max_ratio" in result for result in results):  # reports from before have none
        lines.extend(["", comparison_table(results)])
    limits = [
        line for result in results for line in limits_lines(str(result["config"]), result.get("aws_limits"))
    ]
    if limits:
        lines.extend(["", *limits])
    costs = cost_table(results)
    if costs:
        lines.extend(["", costs])
    return "\n".join(lines)


def comparison_table(results: list[dict[str, Any]]) -> str:
    """The measures that set the configurations apart (``local.scenarios.measures``), side by side."""
    rows = measure_rows(results)
    names = [str(result["config"]) for result in results]
    return aligned(names, rows)


def cost_table(results: list[dict[str, Any]]) -> str:
    """$ per million delivered messages by service, the configurations side by side (naive last)."""
    summaries = {str(r["config"]): r["cost"] for r in results if r.get("cost")}
    if not summaries:
        return ""
    scaled = next(iter(summaries.values())).get("scheduled_functions_scaled_by")
    note = (
        f"(us-east-1 on-demand prices, {next(iter(summaries.values()))['prices']}; the scheduled functions' "
        f"usage priced at the template's schedule, x{scaled:.3g} of what ran here)"
        if scaled
        else ""
    )
    return "\n".join(line for line in (side_by_side(summaries), note) if line)


def _scenario_line(result: dict[str, Any]) -> str:
    """The outage's or the poison scenario's own figures, when the report has them."""

    def seconds(value: float | None) -> str:
        return "not within the run" if value is None else f"{value:.1f} s"

    if "fresh_recovery_s" in result:
        return (
            f"outage {result['outage_s']:.0f} s: fresh recovery = {seconds(result['fresh_recovery_s'])} "
            f"(by first receive {seconds(result['fresh_recovery_first_receive_s'])}); "
            f"drain = {seconds(result['drain_s'])}; backlog at its end = {result['backlog_at_outage_end']}, "
            f"peak = {result['peak_backlog']}; dead-lettered because of it = {result['dlq_due_to_outage']}"
        )
    if "poison_sent" in result:
        fired = sorted({a["alarm"] for a in result.get("alarms_fired") or [] if a["state"] == "ALARM"})
        return (
            f"poison sent = {result['poison_sent']}; in the DLQs = {result['in_dlq']} "
            f"({result['in_dlq_poison']} poison, {result['in_dlq_other']} other); redriven = "
            f"{result['redrive_moved']}, processed after the fix = {result['redriven_processed']}; "
            f"processed twice = {result['processed_twice']}; alarms fired: {', '.join(fired) or 'none'}"
        )
    return ""


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Age of first attempt over time, quiet vs noisy, one panel per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.5), sharey=True, squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        scenario = result["scenario"]
        noisy = "tenant-01"
        rows = [r for r in result["series"]["first_attempts"] if r[3] == "live"]
        for group, colour in (("quiet", "tab:blue"), ("noisy", "tab:red")):
            points = [(t, age) for (t, tenant, age, _) in rows if (tenant == noisy) == (group == "noisy")]
            if points:
                ax.scatter(
                    [p[0] for p in points],
                    [max(p[1], 1.0) for p in points],
                    s=3,
                    alpha=0.4,
                    c=colour,
                    label=group,
                )
        ax.axvspan(
            scenario["baseline_s"],
            scenario["baseline_s"] + scenario["burst_s"],
            color="grey",
            alpha=0.15,
            label="burst",
        )
        ax.set_yscale("log")
        ax.set_title(f"{result['config']}: age of first attempt (live queues)")
        ax.set_xlabel("seconds since the load started")
        ax.legend(loc="upper left")
    axes[0][0].set_ylabel("ms")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
