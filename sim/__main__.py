"""``python -m sim``: run a scenario for naive, fair-queues-only and Breakwater in virtual time.

Examples::

    python -m sim --scenario noisy                 # seed scale: 1,000 tenants, a 30-minute surge, 5.5 h after
    python -m sim --scenario all                   # noisy, outage, slow and poison (make simulate)
    python -m sim --scenario scale                 # 10,000 tenants, 20,000 messages/s, the hottest items
    python -m sim --scenario scale --limit-scale 20    # a partition's rates divided by 20
    python -m sim --scenario noisy --surge-factor 10 --event-minutes 30   # "X sends 10x for 30 min?"
    python -m sim --set worker.max_concurrency=20 --overrides my-fork.json
    python -m sim --scenario all --concurrency-variants 2   # and again at 2 per live queue's mapping,
                                                   # in out/sim/max_concurrency_2/
    python -m sim --validate                       # the embedded default's noisy run, against its report
    python -m sim --jobs 1                         # the configurations one after the other (default: in
                                                   # parallel, one process per core; the same results)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import sim  # noqa: F401  (puts the runtime library on the path)
from breakwater_cdk.config import BlueprintConfig, ConfigError
from local.aws_limits import AwsLimits
from sim.config import (
    CDK_JSON,
    CONFIGURATIONS,
    REPO,
    ConfigName,
    blueprint,
    load_context,
    parse_assignment,
    setups,
)
from sim.report import hottest_table, plot, table, write_json
from sim.run import default_jobs, run_scenario
from sim.scale import TENANTS, TOTAL_RATE, WORK_MS, scale_scenario, sizing
from sim.scenarios import KINDS, Kind, seed_scale
from sim.validation import REFERENCE, compare, run_validation
from sim.worker import Costs


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="noisy", choices=[*KINDS, "all", "scale"])
    parser.add_argument(
        "--cdk-json", type=Path, default=CDK_JSON, help="where the breakwater configuration is"
    )
    parser.add_argument(
        "--overrides",
        type=Path,
        action="append",
        default=[],
        help="a JSON file merged into the configuration (repeatable)",
    )
    parser.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one setting, e.g. worker.max_concurrency=20 (the value read as JSON; repeatable)",
    )
    parser.add_argument(
        "--configurations",
        default=",".join(CONFIGURATIONS),
        help="comma-separated subset of naive,fair,breakwater",
    )
    parser.add_argument("--tenants", type=int, default=None, help="default: 1,000 (scale: 10,000)")
    parser.add_argument(
        "--total-rate",
        type=float,
        default=TOTAL_RATE,
        help="scale: messages per second offered at full load (the fleet is sized for it)",
    )
    parser.add_argument(
        "--limit-scale",
        type=float,
        default=1.0,
        help="AWS's per-partition rates divided by this (1: AWS's own figures)",
    )
    parser.add_argument(
        "--quiet-share",
        type=float,
        default=0.10,
        help="everyone's usual traffic as a share of the fleet's capacity",
    )
    parser.add_argument(
        "--surge-factor",
        type=float,
        default=10.0,
        help="noisy: the subject's rate during the event, as a multiple of capacity",
    )
    parser.add_argument(
        "--work-ms",
        type=float,
        default=None,
        help="mean processing time per message (default 1000; scale: 100)",
    )
    parser.add_argument("--baseline-minutes", type=float, default=None, help="default 30 (scale: 2)")
    parser.add_argument(
        "--event-minutes", type=float, default=None, help="default 30 (scale: 10 at full load)"
    )
    parser.add_argument("--after-hours", type=float, default=None, help="default 5.5 (scale: 2 minutes)")
    parser.add_argument("--ttl-seconds", type=float, default=None, help="expires_at on every message")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--separate-fleets",
        action="store_true",
        help="naive and fair keep one queue's max_concurrency instead of the live set's",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=default_jobs(),
        help="configurations run at once, each in a process of its own (1: one after the other in this "
        "process; the results are the same); default: the number of CPUs",
    )
    parser.add_argument(
        "--concurrency-variants",
        default="",
        metavar="N[,N...]",
        help="also run every scenario with worker.max_concurrency=N (each live queue's mapping; naive and "
        "fair get the live set's total on their one mapping), written to OUT/max_concurrency_N/",
    )
    parser.add_argument("--out", type=Path, default=REPO / "out" / "sim")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--validate",
        action="store_true",
        help=f"run the embedded default's noisy scenario and compare it with {REFERENCE.name}",
    )
    return parser.parse_args(argv)


def _config_overrides(args: argparse.Namespace) -> list[dict[str, Any]]:
    overrides: list[dict[str, Any]] = [json.loads(path.read_text()) for path in args.overrides]
    overrides += [parse_assignment(text) for text in args.assignments]
    return overrides


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


def _variants(text: str) -> list[int]:
    """``--concurrency-variants``: each live queue's mapping concurrency to run again at."""
    values = [part.strip() for part in text.split(",") if part.strip()]
    if not all(value.isdigit() for value in values):
        raise ValueError(f"--concurrency-variants takes whole numbers separated by commas, got {text!r}")
    return [int(value) for value in values]


def _run_kinds(
    args: argparse.Namespace,
    config: BlueprintConfig,
    out: Path,
    names: list[ConfigName],
    kinds: list[Kind],
    costs: Costs,
    limits: AwsLimits,
) -> None:
    """Each scenario of ``kinds`` for ``names`` with ``config``: a table, ``out/<scenario>.json``, a plot."""
    # each configuration's mapping concurrency (a live queue's for Breakwater, the one queue's for naive
    # and fair), stated in the JSON so that a variant shows its fleet
    made = setups(config, same_fleet=not args.separate_fleets)
    mapping_concurrency = {name: made[name].live_max_concurrency for name in names}
    for kind in kinds:
        if kind == "scale":
            scenario = scale_scenario(
                config,
                tenants=int(_or(args.tenants, TENANTS)),
                total_rate=args.total_rate,
                work_ms=_or(args.work_ms, WORK_MS),
                baseline_s=_or(args.baseline_minutes, 2.0) * 60,
                event_s=_or(args.event_minutes, 10.0) * 60,
                after_s=_or(args.after_hours, 2 / 60) * 3600,
                costs=costs,
                seed=args.seed,
            )
        else:
            scenario = seed_scale(
                kind,
                config,
                tenants=int(_or(args.tenants, 1000)),
                quiet_share=args.quiet_share,
                surge_factor=args.surge_factor,
                work_ms=_or(args.work_ms, 1000.0),
                baseline_s=_or(args.baseline_minutes, 30.0) * 60,
                event_s=_or(args.event_minutes, 30.0) * 60,
                after_s=_or(args.after_hours, 5.5) * 3600,
                costs=costs,
                seed=args.seed,
            )
        if args.ttl_seconds is not None:
            from dataclasses import replace

            scenario = replace(scenario, ttl_s=args.ttl_seconds)
        run = run_scenario(
            scenario,
            config,
            costs=costs,
            configurations=names,
            same_fleet=not args.separate_fleets,
            jobs=args.jobs,
            limits=limits,
        )
        results, wall = run.results, run.wall_s
        simulated = sum(result["simulated_messages"] for result in results.values())
        print(
            f"\n== {kind}: {scenario.describe()['tenants']} tenants, capacity {scenario.capacity:.1f} msg/s, "
            f"{scenario.end_s / 3600:.1f} virtual hours, {wall:.1f} s wall ({run.jobs} "
            f"{'process' if run.jobs == 1 else 'processes'}), {simulated / wall:,.0f} simulated messages "
            "per wall second =="
        )
        print(
            "mapping concurrency: "
            + ", ".join(f"{name} {value}" for name, value in mapping_concurrency.items())
            + f" (worker.max_concurrency {config.worker.max_concurrency})"
        )
        print(table(results))
        print()
        print(hottest_table(results))
        path = out / f"{kind}.json"
        write_json(
            path,
            scenario,
            results,
            {
                "wall_s": round(wall, 2),
                "simulated_messages": simulated,
                "jobs": run.jobs,
                "limits": limits.describe(),
                "limits_detail": limits.as_dict(),
                "workers_peak_rss_mb": [round(peak, 1) for peak in run.workers_peak_rss_mb],
                "worker_max_concurrency": config.worker.max_concurrency,
                "mapping_concurrency": mapping_concurrency,
            },
        )
        if not args.no_plot:
            plot(
                out / f"{kind}.png",
                scenario.describe(),
                results,
                f"{kind}: {len(scenario.tenants)} tenants, quiet p99 AgeOfFirstAttempt and the backlog "
                "(grey: the event)",
            )
        print(f"{path}")


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.validate:
        outcome = run_validation()
        print(outcome["table"])
        print()
        for check in compare(outcome):
            print(("ok    " if check.passed else "FAIL  ") + check.describe())
        path = args.out / "validation.json"
        write_json(path, outcome["scenario"], outcome["results"], {"reference": outcome["reference"]})
        print(f"\n{path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
        return 0 if all(check.passed for check in compare(outcome)) else 1
    costs = Costs()
    scale = args.scenario == "scale"
    try:
        limits = AwsLimits(scale=args.limit_scale)
        # the scale scenario's fleet as a platform team sizes it for the load; the user's settings on top
        sized = (
            [sizing(total_rate=args.total_rate, work_ms=_or(args.work_ms, WORK_MS), costs=costs)]
            if scale
            else []
        )
        overrides = [*sized, *_config_overrides(args)]
        variants = _variants(args.concurrency_variants)
        # the configuration as given, then each variant: the same settings at another mapping concurrency
        runs = [(args.out, blueprint(load_context(args.cdk_json), overrides))]
        for per_queue in variants:
            at = {"worker": {"max_concurrency": per_queue}}
            runs.append(
                (
                    args.out / f"max_concurrency_{per_queue}",
                    blueprint(load_context(args.cdk_json), [*overrides, at]),
                )
            )
    except (ConfigError, ValueError) as exc:  # a bad setting: the synth's own message, no traceback
        print(exc, file=sys.stderr)
        return 2
    names: list[ConfigName] = [name for name in CONFIGURATIONS if name in args.configurations.split(",")]
    kinds: list[Kind] = list(KINDS) if args.scenario == "all" else [args.scenario]
    for out, config in runs:
        out.mkdir(parents=True, exist_ok=True)
        _run_kinds(args, config, out, names, kinds, costs, limits)
    return 0


if __name__ == "__main__":
    sys.exit(main())
