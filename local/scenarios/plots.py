"""One figure per scenario run: what the tenants waited for, and what the queues held, over time.

:func:`plot_scenario` draws one column per configuration of a scenario's report (``report.json``, a
list with one dict per configuration): on top each first attempt's age on a live queue (log scale,
the first tenant apart from the others), below the live, sideline and DLQ depths the sampler saw.
The scenario's event window is shaded, the ALARM transitions the run recorded are marked, and each
column's title gives the figure that scenario is judged by and the measures that set the configurations
apart (naive, fair, breakwater side by side, ``local.scenarios.measures``). Every key beyond ``config``,
``scenario`` and ``series`` is optional: a report that lacks one draws without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The tenant the scenarios single out (it bursts, or its downstream slows); the others are the quiet ones.
FIRST_TENANT = "tenant-01"

# What the shaded window is, per scenario kind.
EVENT_LABELS = {
    "noisy": "burst",
    "slow": "slowed downstream",
    "outage": "dependency outage",
    "poison": "poison messages",
}


def event_window(scenario: dict[str, Any]) -> tuple[float, float] | None:
    """The window the scenario's event covers, in seconds since the load started (``None`` if unknown).

    A poison run carries poison messages from its start to its end, the others have their event
    between the baseline and the after phase.
    """
    baseline, burst = scenario.get("baseline_s"), scenario.get("burst_s")
    if baseline is None or burst is None:
        return None
    if scenario.get("kind") == "poison":
        return 0.0, float(baseline) + float(burst) + float(scenario.get("after_s") or 0.0)
    return float(baseline), float(baseline) + float(burst)


def number(result: dict[str, Any], key: str) -> float | None:
    """A figure of the report, or ``None`` when the report lacks it (absent, ``None`` or not a number)."""
    value = result.get(key)
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def quiet_ratio(result: dict[str, Any]) -> float | None:
    """The quiet tenants' p99 age during the event over before it (older reports name it by the burst)."""
    ratio = number(result, "quiet_p99_ratio")
    return ratio if ratio is not None else number(result, "quiet_p99_ratio_burst_vs_baseline")


def headline(result: dict[str, Any]) -> str:
    """The figure a scenario is judged by, for one configuration ("" when the report has none of it)."""
    kind = (result.get("scenario") or {}).get("kind", "noisy")
    parts: list[str] = []
    if kind in ("noisy", "slow"):
        ratio = quiet_ratio(result)
        if ratio is not None:
            parts.append(f"quiet p99 {ratio:.2f}x its baseline")
    elif kind == "outage":
        recovery, drain = number(result, "fresh_recovery_s"), number(result, "drain_s")
        if recovery is not None:
            parts.append(f"fresh recovery {recovery:.0f} s")
        if drain is not None:
            parts.append(f"drain {drain:.0f} s")
    elif kind == "poison":
        in_dlq, sent = number(result, "in_dlq"), number(result, "poison_sent")
        redriven = number(result, "redriven_processed")
        if in_dlq is not None:
            parts.append(f"in DLQ {in_dlq:.0f}" + (f" of {sent:.0f} poison sent" if sent is not None else ""))
        elif sent is not None:
            parts.append(f"poison sent {sent:.0f}")
        if redriven is not None:
            parts.append(f"redriven and processed {redriven:.0f}")
    return ", ".join(parts)


def measures_line(result: dict[str, Any]) -> str:
    """The measures that set the configurations apart, short enough for a plot's title ("" if none)."""
    parts: list[str] = []
    worst = number(result, "quiet_p99_max_ratio")
    if worst is not None:
        parts.append(f"quiet worst {number(result, 'quiet_p99_max_window_s') or 10:g} s {worst:.2f}x")
    fresh = number(result, "noisy_fresh_p99_ms")
    if fresh is not None:
        parts.append(f"{FIRST_TENANT} fresh p99 {fresh / 1000:.1f} s")
    peak, drain = number(result, "peak_backlog"), number(result, "drain_s")
    if peak is not None:
        parts.append(f"peak backlog {peak:,.0f}" + ("" if drain is None else f", drained in {drain:.0f} s"))
    return "; ".join(parts)


def alarm_transitions(result: dict[str, Any]) -> list[tuple[float, str]]:
    """When an alarm went into ALARM during the run, and which (none when the report has no alarms)."""
    marks = []
    for alarm in result.get("alarms_fired") or []:
        if not isinstance(alarm, dict) or alarm.get("state") != "ALARM":
            continue
        at = alarm.get("at_s")
        if isinstance(at, int | float):
            marks.append((float(at), str(alarm.get("alarm", "alarm"))))
    return sorted(marks)


def plot_scenario(results: list[dict[str, Any]], path: Path) -> None:
    """Draw a scenario's report (one column per configuration) to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = max(1, len(results))
    fig, axes = plt.subplots(
        2,
        columns,
        figsize=(6.5 * columns, 7.5),
        sharex="col",
        sharey="row",
        squeeze=False,
        gridspec_kw={"height_ratios": [3, 2]},
    )
    for column, result in enumerate(results):
        ages_ax, depths_ax = axes[0][column], axes[1][column]
        scenario = result.get("scenario") or {}
        kind = scenario.get("kind", "noisy")
        series = result.get("series") or {}

        rows = [row for row in series.get("first_attempts") or [] if len(row) >= 4 and row[3] == "live"]
        for label, colour, first in (("other tenants", "tab:blue", False), (FIRST_TENANT, "tab:red", True)):
            points = [(row[0], row[2]) for row in rows if (row[1] == FIRST_TENANT) == first]
            if points:
                ages_ax.scatter(
                    [t for t, _ in points],
                    # a first attempt within the millisecond still belongs on a log scale
                    [max(float(age), 1.0) for _, age in points],
                    s=3,
                    alpha=0.4,
                    c=colour,
                    label=label,
                )
        if rows:
            ages_ax.set_yscale("log")
        else:
            ages_ax.text(0.5, 0.5, "no first attempts recorded", ha="center", transform=ages_ax.transAxes)

        depths = [row for row in series.get("depths") or [] if len(row) >= 4]
        for index, label, colour in ((1, "live", "tab:blue"), (2, "sideline", "tab:orange"), (3, "DLQ", "k")):
            if depths:
                depths_ax.plot(
                    [row[0] for row in depths], [row[index] for row in depths], c=colour, label=label
                )
        if not depths:
            depths_ax.text(0.5, 0.5, "no depth samples recorded", ha="center", transform=depths_ax.transAxes)

        window = event_window(scenario)
        if window is not None:
            # labelled once: the top panel's legend names the window for both
            ages_ax.axvspan(*window, color="grey", alpha=0.15, label=EVENT_LABELS.get(kind, kind))
            depths_ax.axvspan(*window, color="grey", alpha=0.15)
        for index, (at, alarm) in enumerate(alarm_transitions(result)):
            for ax in (ages_ax, depths_ax):
                ax.axvline(
                    at,
                    color="tab:purple",
                    linestyle="--",
                    linewidth=0.8,
                    label="alarm to ALARM" if index == 0 and ax is ages_ax else None,
                )
            # staggered down the panel, so that alarms firing close together keep readable labels
            ages_ax.annotate(
                alarm,
                xy=(at, 1.0 - 0.06 * (index % 5)),
                xycoords=("data", "axes fraction"),
                xytext=(2, -2),
                textcoords="offset points",
                fontsize=6,
                color="tab:purple",
                va="top",
            )

        figure, measures = headline(result), measures_line(result)
        ages_ax.set_title(
            f"{result.get('config', '?')}"
            + (f": {figure}" if figure else "")
            + (f"\n{measures}" if measures else ""),
            fontsize=10 if len(results) < 3 else 9,
        )
        ages_ax.legend(loc="upper left", fontsize=7, markerscale=3)
        depths_ax.legend(loc="upper left", fontsize=7)
        depths_ax.set_xlabel("seconds since the load started")
    axes[0][0].set_ylabel("age of first attempt, live queues (ms)")
    axes[1][0].set_ylabel("messages waiting")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
