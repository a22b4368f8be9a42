"""The scenarios' goals: ``make scenarios`` timed, then each goal judged on the reports it wrote.

    .venv/bin/python bench/scenarios.py [--from-reports] [--out out/bench/scenarios.json]

Runs ``python -m local demo --scenario all --quiet`` (what ``make scenarios`` runs) and times it,
unless ``--from-reports`` judges the reports already under ``out/``. The goals:

- outage: Breakwater's fresh recovery within 5 s and nothing dead-lettered because of the outage
  (naive's fresh recovery and drain are printed beside it);
- slow: Breakwater's quiet p99 during the slowdown over before it at most 1.5 (naive's beside it);
- poison: every poison message in the dead-letter queues and nothing else, every one redriven and
  processed once, nothing unaccounted for;
- every report: ``unaccounted`` 0; the whole run under 20 minutes.

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

    def goal(name: str, figure: Any, met: bool, beside: Any = None) -> None:
        rows.append({"goal": name, "figure": figure, "met": bool(met), "naive": beside})

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
    if wall_s is not None:
        goal("make scenarios under 20 minutes", f"{wall_s / 60:.1f} min", wall_s < 20 * 60)
    return rows


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
        naive = "" if row["naive"] is None else f"   naive: {row['naive']}"
        print(f"{'met ' if row['met'] else 'MISS'}  {row['goal']:62s} {row['figure']!s:>24s}{naive}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"wall_s": wall_s, "goals": rows}, indent=1), encoding="utf-8")
    return 0 if all(row["met"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
