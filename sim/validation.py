"""The simulator against the embedded default: its noisy run, its configuration and rates, its report.

``sim/reference/noisy.json`` holds what the check needs of a real ``make demo`` report (the runtime
``out/report.json``): the scenario, the configuration context the demo applied, the emulator's
container cap and schedule speed-up, the rates the load clients achieved, and per configuration the
quiet tenants' p50/p99 AgeOfFirstAttempt, the quiet p99 ratio and the peak live backlog.

The check: the simulated quiet p50 of each configuration within 30 % of the runtime's, naive's peak
backlog within 25 %, and the configurations in the same order (quiet p50 and p99 ratio). Refresh the
reference after a ``make demo`` with ``python -m sim.validation --refresh out/report.json``.

The embedded default runs on two cores, not in AWS: its own overheads (moto's HTTP round trips, the
handler's Powertools work, a poll loop) are :data:`EMBEDDED_COSTS`, the one set of figures here that
describes the machine rather than the blueprint.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sim  # noqa: F401  (puts the runtime library on the path)
from sim.config import blueprint, load_context
from sim.report import table
from sim.run import run_scenario
from sim.scenarios import Scenario, embedded
from sim.worker import Costs

REFERENCE = Path(__file__).resolve().parent / "reference" / "noisy.json"

EMBEDDED_COSTS = Costs(
    enqueue_ms=25.0, invoke_ms=50.0, per_record_ms=3.0, gate_ms=20.0, move_ms=20.0, settle_ms=20.0
)
"""The emulator's own costs per invocation: moto and the container pool on two cores, not AWS."""

P50_TOLERANCE = 0.30
BACKLOG_TOLERANCE = 0.25


def load_reference(path: Path = REFERENCE) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def validation_scenario(reference: dict[str, Any]) -> tuple[Scenario, Any]:
    context, work_ms = emulator_work(reference["context"])
    config = blueprint(load_context(), [context])
    return embedded(reference, work_ms), config


def emulator_work(context: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """The run's context without the emulator's simulated work per message, and that work (ms).

    The emulator's own key (``breakwater_local.work_ms``) is no setting of the stack; a reference
    recorded before it was one names it as ``breakwater.worker.simulated_work_ms``.
    """
    context = json.loads(json.dumps(context))
    work = context.pop("breakwater_local", {}).get("work_ms")
    legacy = context.get("breakwater", {}).get("worker", {}).pop("simulated_work_ms", None)
    return context, float(work if work is not None else legacy if legacy is not None else 20)


def run_validation(reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """The embedded default's noisy scenario, naive and Breakwater, with the emulator's fleet and costs."""
    reference = reference or load_reference()
    scenario, config = validation_scenario(reference)
    results = run_scenario(
        scenario,
        config,
        costs=EMBEDDED_COSTS,
        configurations=("naive", "breakwater"),
        same_fleet=False,
        function_concurrency=int(reference["mapping_containers"]),
    ).results
    return {"scenario": scenario, "results": results, "reference": reference, "table": table(results)}


@dataclass(frozen=True)
class Check:
    name: str
    simulated: float | str
    runtime: float | str
    passed: bool

    def describe(self) -> str:
        return f"{self.name}: simulated {self.simulated}, runtime {self.runtime}"


def compare(outcome: dict[str, Any]) -> list[Check]:
    reference, results = outcome["reference"], outcome["results"]
    checks = []
    for name in ("naive", "breakwater"):
        simulated = results[name]["ages"]["quiet"]["p50_ms"]
        runtime = reference["configurations"][name]["quiet_p50_ms"]
        within = simulated is not None and abs(simulated - runtime) <= P50_TOLERANCE * runtime
        checks.append(Check(f"{name} quiet p50 AgeOfFirstAttempt (ms, ±30 %)", simulated, runtime, within))
    simulated_peak = results["naive"]["peak_live_backlog"]
    runtime_peak = reference["configurations"]["naive"]["peak_live_depth"]
    checks.append(
        Check(
            "naive peak live backlog (±25 %)",
            simulated_peak,
            runtime_peak,
            abs(simulated_peak - runtime_peak) <= BACKLOG_TOLERANCE * runtime_peak,
        )
    )
    for figure, key_sim, key_run in (
        ("quiet p50", lambda r: r["ages"]["quiet"]["p50_ms"], "quiet_p50_ms"),
        ("quiet p99 ratio", lambda r: r["quiet_p99_ratio"], "quiet_p99_ratio"),
    ):
        order_sim = sorted(("naive", "breakwater"), key=lambda n: key_sim(results[n]))
        order_run = sorted(("naive", "breakwater"), key=lambda n: reference["configurations"][n][key_run])
        checks.append(
            Check(
                f"order by {figure} (best first)",
                " < ".join(order_sim),
                " < ".join(order_run),
                order_sim == order_run,
            )
        )
    return checks


def reference_from_report(report: list[dict[str, Any]]) -> dict[str, Any]:
    """What the check needs of a runtime report (``out/report.json`` of ``make demo``)."""
    from local.scenarios.noisy_neighbour import DEMO_CONTEXT, runtime_options

    by_name = {entry["config"]: entry for entry in report}
    scenario = by_name["breakwater"]["scenario"]
    options = runtime_options(Path())
    noisy = by_name["breakwater"]["groups"]["noisy"]
    quiet = by_name["breakwater"]["groups"]["quiet"]
    outside = float(scenario["noisy_rate"]) * (float(scenario["baseline_s"]) + float(scenario["after_s"]))
    sent_in_burst = float(noisy["accepted"]) + float(noisy["throttled"]) + float(noisy["rejected"]) - outside
    duration = float(scenario["baseline_s"]) + float(scenario["burst_s"]) + float(scenario["after_s"])
    quiet_sent = float(quiet["accepted"]) + float(quiet["throttled"]) + float(quiet["rejected"])
    return {
        "refresh": "python -m sim.validation --refresh out/report.json (after make demo)",
        "scenario": {
            **scenario,
            # the rates the load clients reached (the demo sends a share of requests as events instead)
            "quiet_rate": round(quiet_sent / quiet["tenants"] / duration, 4),
        },
        "achieved_burst_rate": round(sent_in_burst / float(scenario["burst_s"]), 3),
        "context": DEMO_CONTEXT,
        "mapping_containers": options.mapping_containers,
        "schedule_speedup": options.schedule_speedup,
        "configurations": {
            name: {
                "quiet_p50_ms": entry["groups"]["quiet"]["age_p50_ms"],
                "quiet_p99_ms": entry["groups"]["quiet"]["age_p99_ms"],
                "quiet_p99_ratio": entry["quiet_p99_ratio"],
                "peak_live_depth": entry["peak_live_depth"],
                "noisy_peak_live_backlog": entry["groups"]["noisy"]["peak_live_backlog"],
            }
            for name, entry in by_name.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.validation")
    parser.add_argument(
        "--refresh", type=Path, metavar="REPORT", help="rewrite the reference from this report"
    )
    args = parser.parse_args(argv)
    if args.refresh:
        reference = reference_from_report(json.loads(args.refresh.read_text()))
        REFERENCE.parent.mkdir(parents=True, exist_ok=True)
        REFERENCE.write_text(json.dumps(reference, indent=1) + "\n")
        print(f"wrote {REFERENCE}")
        return 0
    outcome = run_validation()
    print(outcome["table"])
    checks = compare(outcome)
    for check in checks:
        print(("ok    " if check.passed else "FAIL  ") + check.describe())
    return 0 if all(check.passed for check in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
