"""The scenarios' goals: ``make scenarios`` timed, then each goal judged on the reports it wrote.

    .venv/bin/python bench/scenarios.py [--from-reports] [--out out/bench/scenarios.json]

Runs ``python -m local demo --scenario all --quiet`` (what ``make scenarios`` runs) and times it,
unless ``--from-reports`` judges the reports already under ``out/``. The goals:

- outage: Breakwater's fresh recovery within 5 s and nothing dead-lettered because of the outage
  (naive's fresh recovery and drain are printed beside it);
- slow: Breakwater's quiet p99 during the slowdown over before it at most 1.5 (naive's beside it);
- poison: every poison message in the dead-letter queues and nothing else, every one redriven and
  processed once, nothing unaccounted for;
- every report: ``unaccounted`` 0; the whole run (three configurations) under 25 minutes;
- issue 36, Breakwater against SQS fair queues alone (``fair``) on the embedded default: in every
  scenario its quiet tenants' p99 ratio (event / before) and their worst 10 s window over their baseline
  no worse than fair's, and that worst window at most 3x; in the noisy scenario its noisy tenant's fresh
  work (p99 age when run) younger than fair's; in the outage scenario no more dead-lettered than fair.
  Each row gives both figures.

Prints one row per goal and writes them as JSON. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REPORTS = {"noisy": "out/report.json", "slow": "out/slow/report.json", "outage": "out/outage/report.json"}
REPORTS["poison"] = "out/poison/report.json"


def load(kind: str) -> dict[str, dict[str, Any]]:
    results = json.loads((ROOT / REPORTS[kind]).read_text(encoding="utf-8"))
    return {result["config"]: result for result in results}


def goals(wall_s: float | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def goal(name: str, figure: Any, met: bool, beside: Any = None, against: str = "naive") -> None:
        rows.append({"goal": name, "figure": figure, "met": bool(met), "beside": beside, "against": against})

    outage, slow, poison = load("outage"), load("slow"), load("poison")
    bw, naive = outage["breakwater"], outage["naive"]
    recovery = bw["fresh_recovery_s"]
    goal(
        "outage: Breakwater fresh recovery <= 5 s",
        recovery,
        recovery is not None and recovery <= 5,
        {"fresh_recovery_s": naive["fresh_recovery_s"], "drain_s": naive["drain_s"]},
    )
    goal(
        "outage: 0 dead-lettered because of the outage",
        bw["dlq_due_to_outage"],
        bw["dlq_due_to_outage"] == 0,
        naive["dlq_due_to_outage"],
    )
    ratio = slow["breakwater"]["quiet_p99_ratio"]
    goal(
        "slow: quiet p99 ratio <= 1.5",
        ratio,
        ratio is not None and ratio <= 1.5,
        slow["naive"]["quiet_p99_ratio"],
    )
    for config, result in poison.items():
        sent = result["poison_sent"]
        goal(
            f"poison ({config}): every poison message in the DLQ and nothing else",
            f"{result['in_dlq_poison']} of {sent} (+{result['in_dlq_other']} other)",
            sent > 0 and result["in_dlq_poison"] == sent and result["in_dlq_other"] == 0,
        )
        goal(
            f"poison ({config}): every one redriven and processed once",
            f"{result['redriven_processed']} of {sent}, twice: {result['processed_twice']}",
            result["redriven_processed"] == sent and result["processed_twice"] == 0,
        )
    for kind in REPORTS:
        for config, result in load(kind).items():
            left = result["accounting"]["unaccounted"]
            goal(f"{kind} ({config}): 0 unaccounted", left, left == 0)
    rows.extend(fair_goals({kind: load(kind) for kind in REPORTS}))
    if wall_s is not None:
        goal("make scenarios under 25 minutes", f"{wall_s / 60:.1f} min", wall_s < 25 * 60)
    return rows


def fair_goals(reports: dict[str, dict[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Issue 36's rows: Breakwater's figure against fair's (a report without fair: not met, says so)."""
    rows: list[dict[str, Any]] = []

    def compare(kind: str, key: str, label: str, better: str, bound: float | None = None) -> None:
        configs = reports.get(kind, {})
        if "fair" not in configs or "breakwater" not in configs:
            rows.append(
                {
                    "goal": f"{kind}: {label}",
                    "figure": "fair not run",
                    "met": False,
                    "beside": None,
                    "against": "fair",
                }
            )
            return
        mine, theirs = configs["breakwater"].get(key), configs["fair"].get(key)
        met = mine is not None and (
            theirs is None or (mine < theirs if better == "lower" else mine <= theirs)
        )
        if bound is not None:
            met = met and mine is not None and mine <= bound
        rows.append(
            {
                "goal": f"{kind}: {label}",
                "figure": _round(mine),
                "met": met,
                "beside": _round(theirs),
                "against": "fair",
            }
        )

    for kind in REPORTS:
        compare(kind, "quiet_p99_ratio", "Breakwater quiet p99 ratio no worse than fair's", "no worse")
        compare(
            kind,
            "quiet_p99_max_ratio",
            "Breakwater quiet worst 10 s / baseline no worse than fair's, <= 3x",
            "no worse",
            bound=3.0,
        )
    compare("noisy", "noisy_fresh_p99_ms", "Breakwater noisy tenant's fresh p99 ms below fair's", "lower")
    compare("outage", "dlq_due_to_outage", "Breakwater dead-letters no more than fair", "no worse")
    return rows


def _round(value: Any) -> Any:
    return round(value, 2) if isinstance(value, float) else value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--from-reports", action="store_true", help="judge the reports under out/, run nothing"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench" / "scenarios.json")
    args = parser.parse_args()
    wall_s = None
    if not args.from_reports:
        began = time.time()
        subprocess.run(  # noqa: S603 - this interpreter, the repository's own module
            [sys.executable, "-m", "local", "demo", "--scenario", "all", "--quiet"], cwd=ROOT, check=True
        )
        wall_s = time.time() - began
    rows = goals(wall_s)
    for row in rows:
        beside = "" if row["beside"] is None else f"   {row['against']}: {row['beside']}"
        print(f"{'met ' if row['met'] else 'MISS'}  {row['goal']:66s} {row['figure']!s:>24s}{beside}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"wall_s": wall_s, "goals": rows}, indent=1), encoding="utf-8")
    return 0 if all(row["met"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
