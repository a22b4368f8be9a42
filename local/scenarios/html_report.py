"""One self-contained HTML page over every scenario report the demo left under ``out/``.

:func:`write_html_report` reads the reports that exist (``out/report.json`` is the noisy scenario's,
``out/<kind>/report.json`` another's), draws each scenario's timeline (:func:`plot_scenario`) next
to its report as ``timeline.png`` unless an up-to-date one is there, and writes ``out/report.html``:
per scenario one statement of what it shows, the timeline embedded as a data URI, a table of the
measures that set the configurations apart (naive, fair, breakwater: a column each,
``local.scenarios.measures``), what each configuration costs in $ per million delivered messages by
service, beside the naive one (``local.pricing``), and per configuration its headline figures. The page loads
nothing from elsewhere, so it can be mailed or archived as one file; a small script writes into
``#render-status`` how many of its plots the browser decoded (the test opens the page in headless
Chromium and reads it).
"""

from __future__ import annotations

import base64
import json
from html import escape
from pathlib import Path
from typing import Any

from local.pricing.cost import ratio
from local.scenarios.limits_report import limits_lines
from local.scenarios.measures import measure_rows
from local.scenarios.plots import headline, number, plot_scenario, quiet_ratio

# In the order the page shows them; the noisy scenario's report is the one at the root of out/.
KINDS = ("noisy", "slow", "outage", "poison")

TITLES = {
    "noisy": "Noisy neighbour",
    "slow": "Slow downstream",
    "outage": "Dependency outage",
    "poison": "Poison messages",
}

# What each scenario asks, before the figures that answer it.
QUESTIONS = {
    "noisy": "tenant-01 bursts; do the other tenants' first attempts stay as prompt as before the burst?",
    "slow": "tenant-01's downstream slows down; do the other tenants' first attempts stay as prompt?",
    "outage": "The dependency is down for a while; how soon are fresh messages served again after it, "
    "and how long does the backlog take to drain?",
    "poison": "Poison messages arrive all through the run; do they end in the DLQ without holding up "
    "the rest, and are they processed once redriven?",
}

# The figures each kind is judged by, beyond the per-group ages: (report key, label, unit).
KIND_FIGURES: dict[str, tuple[tuple[str, str, str], ...]] = {
    "noisy": (("recovery_s_after_burst", "recovery after the burst", "s"),),
    "slow": (("recovery_s_after_burst", "recovery after the slowdown", "s"),),
    "outage": (
        ("fresh_recovery_s", "fresh messages served again after", "s"),
        ("drain_s", "backlog drained after", "s"),
        ("peak_backlog", "peak backlog", ""),
        ("backlog_at_outage_end", "backlog when the outage ended", ""),
        ("dlq_due_to_outage", "sent to the DLQ by the outage", ""),
    ),
    "poison": (
        ("poison_sent", "poison messages sent", ""),
        ("in_dlq", "in the DLQ", ""),
        ("redriven_processed", "redriven and processed", ""),
    ),
}

# The event window's name in a table's header, short enough for a column.
WINDOW_NAMES = {"noisy": "burst", "slow": "slowdown", "outage": "outage", "poison": "window"}

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 1500px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05em; margin: 0.4em 0; }
.statement { font-style: italic; }
img { max-width: 100%; display: block; }
.configs { display: flex; gap: 2em; flex-wrap: wrap; }
.config { flex: 1 1 40em; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ddd; padding: 2px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f4f4f4; }
.bad { background: #fdd; color: #900; font-weight: bold; }
.ok { color: #060; }
#render-status { padding: 4px 8px; display: inline-block; border: 1px solid #ccc; }
"""

# Runs after every image has loaded or failed: a data URI the browser cannot decode has no width.
SCRIPT = """
window.addEventListener("load", function () {
  var images = Array.prototype.slice.call(document.images);
  var rendered = images.filter(function (img) { return img.complete && img.naturalWidth > 0; });
  var status = document.getElementById("render-status");
  status.setAttribute("data-images", String(images.length));
  status.setAttribute("data-rendered", String(rendered.length));
  status.className = rendered.length === images.length ? "ok" : "bad";
  status.textContent = rendered.length + " of " + images.length + " plots rendered";
});
"""


def report_paths(out_root: Path) -> dict[str, Path]:
    """The scenario reports under ``out_root`` that exist, by kind, in :data:`KINDS` order."""
    candidates = {kind: out_root / ("" if kind == "noisy" else kind) / "report.json" for kind in KINDS}
    return {kind: path for kind, path in candidates.items() if path.is_file()}


def load_results(path: Path, kind: str) -> list[dict[str, Any]]:
    """A report's configurations, each with its scenario's ``kind`` (reports from before the kinds
    existed lack it; where the report lies says which it is)."""
    results = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(results, list):
        raise ValueError(f"{path} is not a list of configurations")
    return [
        {**result, "scenario": {"kind": kind, **(result.get("scenario") or {})}}
        for result in results
        if isinstance(result, dict)
    ]


def timeline(results: list[dict[str, Any]], report: Path) -> Path:
    """The scenario's ``timeline.png`` beside its report, drawn again when older than the report."""
    png = report.parent / "timeline.png"
    if not png.is_file() or png.stat().st_mtime < report.stat().st_mtime:
        plot_scenario(results, png)
    return png


def write_html_report(out_root: Path) -> Path:
    """Write ``out_root/report.html`` over every scenario report under ``out_root``; return its path."""
    found = report_paths(out_root)
    if not found:
        raise FileNotFoundError(
            f"no scenario report under {out_root} (report.json, or <scenario>/report.json for "
            f"{', '.join(KINDS[1:])})"
        )
    sections = []
    for kind, report in found.items():
        results = load_results(report, kind)
        png = timeline(results, report)
        sections.append(section(kind, results, base64.b64encode(png.read_bytes()).decode("ascii")))
    page = "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            "<title>Breakwater scenarios: naive, SQS fair queues alone, Breakwater</title>",
            f"<style>{STYLE}</style></head><body>",
            "<h1>Breakwater scenarios: naive, SQS fair queues alone, Breakwater</h1>",
            "<p>Each scenario ran its configurations on the embedded AWS (<code>python -m local demo "
            "--scenario NAME --configurations naive,fair,breakwater</code>): <em>naive</em>, one standard "
            "queue and nobody throttled; <em>fair</em>, the same queue with MessageGroupId = tenant (SQS "
            "fair queues alone); <em>breakwater</em>, the blueprint. Top of each plot: the age of every "
            "first attempt on a live queue; "
            "below: what the live, sideline and dead-letter queues held. The shaded band is the "
            "scenario's event; dashed lines are alarms going into ALARM.</p>",
            f'<p><span id="render-status" data-expected="{len(sections)}">'
            f"{len(sections)} plots, not checked yet</span></p>",
            *sections,
            f"<script>{SCRIPT}</script>",
            "</body></html>",
        ]
    )
    path = out_root / "report.html"
    path.write_text(page, encoding="utf-8")
    return path


def section(kind: str, results: list[dict[str, Any]], png_base64: str) -> str:
    configs = "".join(config_block(kind, result) for result in results)
    return (
        f'<section id="scenario-{escape(kind)}"><h2>{escape(TITLES.get(kind, kind))} '
        f"<small>(<code>--scenario {escape(kind)}</code>)</small></h2>"
        f'<p class="statement">{escape(statement(kind, results))}</p>'
        f'<img src="data:image/png;base64,{png_base64}" alt="{escape(kind)} scenario: age of first '
        f'attempt and queue depths over time, per configuration">'
        f"{comparison_table(results)}{cost_table(results)}"
        f'<div class="configs">{configs}</div></section>'
    )


def comparison_table(results: list[dict[str, Any]]) -> str:
    """The measures that set the configurations apart (``local.scenarios.measures``), a column per
    configuration in the report's order (none in a report from before they were measured)."""
    if not any("quiet_p99_max_ratio" in result for result in results):
        return ""
    header = "".join(f"<th>{escape(str(r.get('config', '?')))}</th>" for r in results)
    body = "".join(
        f"<tr><td>{escape(label)}</td>{''.join(f'<td>{escape(cell)}</td>' for cell in cells)}</tr>"
        for label, cells in measure_rows(results)
    )
    return f'<table class="comparison"><tr><th>what sets them apart</th>{header}</tr>{body}</table>'


def cost_table(results: list[dict[str, Any]]) -> str:
    """$ per million delivered messages by service, a column per configuration, and each one's ratio
    to the naive configuration's (reports from before the cost was counted have none: no table)."""
    costs = {str(r.get("config", "?")): r["cost"] for r in results if isinstance(r.get("cost"), dict)}
    if not costs:
        return ""
    names = list(costs)
    others = [name for name in names if name != "naive"] if "naive" in costs else []
    services = list(next(iter(costs.values())).get("usd_per_million_by_service") or {})

    def money(value: Any) -> str:
        return "-" if not isinstance(value, int | float) else f"${value:,.2f}"

    def line(label: str, values: dict[str, Any]) -> str:
        cells = "".join(f"<td>{escape(money(values[n]))}</td>" for n in names)
        for name in others:
            r = ratio(values[name], values["naive"])
            cells += f"<td>{'-' if r is None else f'{r:.2f}x'}</td>"
        return f"<tr><td>{escape(label)}</td>{cells}</tr>"

    header = "".join(f"<th>{escape(n)}</th>" for n in names) + "".join(
        f"<th>{escape(n)} / naive</th>" for n in others
    )
    body = "".join(
        line(service, {n: (costs[n].get("usd_per_million_by_service") or {}).get(service) for n in names})
        for service in services
        if any((costs[n].get("usd_per_million_by_service") or {}).get(service) for n in names)
    )
    body += line("total", {n: costs[n].get("usd_per_million_delivered") for n in names})
    return (
        '<table class="cost"><tr><th>$ per million delivered messages (us-east-1 on demand)</th>'
        f"{header}</tr>{body}</table>"
    )


def statement(kind: str, results: list[dict[str, Any]]) -> str:
    """The scenario's question, then each configuration's headline figure where the report has it."""
    answers = [f"{result.get('config', '?')}: {figure}" for result in results if (figure := headline(result))]
    return QUESTIONS.get(kind, kind) + (" " + "; ".join(answers) + "." if answers else "")


def config_block(kind: str, result: dict[str, Any]) -> str:
    return (
        f'<div class="config"><h3>{escape(str(result.get("config", "?")))}</h3>'
        f"{figures_table(kind, result)}{groups_table(kind, result)}"
        f"{accounting_table(result)}{alarms_table(result)}{limits_block(result)}</div>"
    )


def limits_block(result: dict[str, Any]) -> str:
    """AWS's limits in the run and what they refused, as the console prints them."""
    lines = limits_lines(str(result.get("config", "?")), result.get("aws_limits"))
    if not lines:
        return "<p>AWS limits: not recorded in this report</p>"
    return f'<pre class="limits">{escape(chr(10).join(lines))}</pre>'


def fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    text = f"{value:,}" if isinstance(value, int) else f"{value:,.1f}" if unit == "s" else f"{value:,.0f}"
    return f"{text} {unit}".strip()


def rows(pairs: list[tuple[str, str, str]]) -> str:
    """Table rows of (label, value, css class)."""
    return "".join(
        f'<tr><td>{escape(label)}</td><td class="{css}">{escape(value)}</td></tr>'
        for label, value, css in pairs
    )


def figures_table(kind: str, result: dict[str, Any]) -> str:
    pairs: list[tuple[str, str, str]] = []
    if kind in ("noisy", "slow"):
        ratio = quiet_ratio(result)
        during = "burst" if kind == "noisy" else "slowdown"
        pairs.append((f"quiet p99 age, {during} / before", "-" if ratio is None else f"{ratio:.2f}x", ""))
    for key, label, unit in KIND_FIGURES.get(kind, ()):
        if key in result:
            pairs.append((label, fmt(number(result, key), unit), ""))
    return f"<table><tr><th>headline</th><th></th></tr>{rows(pairs)}</table>" if pairs else ""


def groups_table(kind: str, result: dict[str, Any]) -> str:
    groups = result.get("groups") or {}
    if not groups:
        return ""
    event = WINDOW_NAMES.get(kind, "event")
    header = (
        "<tr><th>group</th><th>accepted</th><th>p50 age</th><th>p99 age</th>"
        f"<th>p99 before</th><th>p99 during {escape(event)}</th></tr>"
    )
    body = "".join(
        f"<tr><td>{escape(str(name))}</td><td>{escape(fmt(g.get('accepted')))}</td>"
        f"<td>{escape(fmt(g.get('age_p50_ms'), 'ms'))}</td><td>{escape(fmt(g.get('age_p99_ms'), 'ms'))}</td>"
        f"<td>{escape(fmt(g.get('age_p99_before_burst_ms'), 'ms'))}</td>"
        f"<td>{escape(fmt(g.get('age_p99_during_burst_ms'), 'ms'))}</td></tr>"
        for name, g in groups.items()
        if isinstance(g, dict)
    )
    return f"<table>{header}{body}</table>"


def accounting_table(result: dict[str, Any]) -> str:
    accounting = result.get("accounting") or {}
    if not accounting:
        return ""
    pairs = []
    for key, value in accounting.items():
        css = ""
        if key == "unaccounted":
            # every accepted message is processed, dropped, queued, dead-lettered or parked: a rest is lost
            css = "ok" if value == 0 else "bad"
        pairs.append((key.replace("_", " ").replace("dlq", "DLQ"), fmt(value), css))
    return f"<table><tr><th>accounting</th><th></th></tr>{rows(pairs)}</table>"


def alarms_table(result: dict[str, Any]) -> str:
    if "alarms_fired" not in result or result["alarms_fired"] is None:
        return "<p>alarms: not recorded in this report</p>"
    alarms = [a for a in result["alarms_fired"] if isinstance(a, dict)]
    if not alarms:
        return "<p>alarms: none fired</p>"
    body = "".join(
        f'<tr><td title="{escape(str(a.get("description", "")))}">{escape(str(a.get("alarm", "?")))}</td>'
        f'<td class="{"bad" if a.get("state") == "ALARM" else "ok"}">{escape(str(a.get("state", "?")))}</td>'
        f"<td>{escape(fmt(a.get('at_s'), 's'))}</td><td>{fmt_value(a.get('value'))}</td></tr>"
        for a in alarms
    )
    return f"<table><tr><th>alarm</th><th>state</th><th>at</th><th>value</th></tr>{body}</table>"


def fmt_value(value: Any) -> str:
    """An alarm's metric value: its own precision, the metrics are of every scale."""
    return f"{value:g}" if isinstance(value, int | float) and not isinstance(value, bool) else "-"
