"""Simulator benchmark: the seed-scale goals, its speed, memory and linearity, one figure per line.

    .venv/bin/python bench/sim.py              # every figure (a few minutes on two cores)
    .venv/bin/python bench/sim.py --quick      # the goals on a smaller fleet, for a look
    .venv/bin/python bench/sim.py --jobs 1     # each scenario's configurations one after the other
    .venv/bin/python bench/sim.py --scale      # the scale scenario alone: its goals, hot items, speed

Each scenario runs in a child process of its own (``python -m sim``), so its peak memory is its own;
its configurations run in parallel processes of that one (``--jobs``, default one per core), and
the peak memory reported is the child's and its workers' peaks added up (they overlap in time, so
that is a bound, not a measurement of one moment). Figures:

- the practices' arithmetic: naive's recovery after a 30-minute surge at 10x capacity with the quiet
  load at 10 % of it, against ``event x (surge + quiet - 1) / (1 - quiet)`` (about 300 minutes);
- Breakwater at the same surge: the quiet tenants' p99 AgeOfFirstAttempt during and after the surge
  over the baseline's (and the worst minute's), the fresh traffic's recovery; fair-queues-only beside it;
- speed: messages moved through the simulated queues per second of wall time (the load's and every
  copy a worker moved), the wall time and peak memory of every scenario (noisy, outage, slow,
  poison), and each configuration's own wall time;
- linearity: the naive noisy scenario with messages ten times as expensive (a tenth of the messages,
  the same virtual dynamics) against the usual one: time per message should stay the same.

``--scale`` runs the scale scenario instead (10,000 tenants, 20,000 messages/s for 10 virtual
minutes, AWS's limits on): its wall time (goal under 10 minutes) and peak memory (under 4 GB), and
per configuration the hottest DynamoDB item's peak against a partition's write limit, the throttles
by kind, what they did to batches, and the quiet p99 ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


# python -m sim, then the process's own peak resident memory on stderr
RUN_SIM = (
    "import resource, runpy, sys\n"
    "sys.argv = ['sim', *sys.argv[1:]]\n"
    "try:\n    runpy.run_module('sim', run_name='__main__')\n"
    "except SystemExit as exit:\n    assert not exit.code\n"
    "print('peak_rss_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
)


def child(args: list[str], jobs: int | None = None) -> dict[str, Any]:
    """``python -m sim`` with ``args`` in a process of its own: its JSON, wall time and peak RSS."""
    with tempfile.TemporaryDirectory() as out:
        parallel = [] if jobs is None else ["--jobs", str(jobs)]
        command = [PYTHON, "-c", RUN_SIM, "--no-plot", "--out", out, *parallel, *args]
        started = time.perf_counter()
        done = subprocess.run(  # noqa: S603 - this interpreter and our own arguments
            command, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        wall = time.perf_counter() - started
        (path,) = Path(out).glob("*.json")
        document = json.loads(path.read_text())
    document["process_wall_s"] = wall
    peak = [int(row.split()[1]) for row in done.stderr.splitlines() if row.startswith("peak_rss_kb")]
    workers = sum(document.get("workers_peak_rss_mb") or [])
    document["peak_rss_mb"] = peak[0] / 1024 + workers if peak else None
    return document


def line(figure: str, value: str, goal: str = "", ok: bool | None = None) -> None:
    verdict = "" if ok is None else ("  ok" if ok else "  MISSED")
    print(f"{figure:<58} {value:>22}  {goal}{verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fleet of 8 x 2 and a 10-minute surge")
    parser.add_argument(
        "--jobs", type=int, default=None, help="configurations at once per scenario (python -m sim's default)"
    )
    parser.add_argument("--scale", action="store_true", help="the scale scenario alone (about 10 minutes)")
    args = parser.parse_args()
    if args.scale:
        return scale(args.jobs)
    small = (
        ["--set", "worker.max_concurrency=2", "--event-minutes", "10", "--after-hours", "2"]
        if args.quick
        else []
    )
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (start)")

    noisy = child(["--scenario", "noisy", *small], args.jobs)
    scenario, configs = noisy["scenario"], noisy["configurations"]
    quiet, surge = scenario["quiet_share"], scenario["surge_factor"]
    event_min = scenario["event_s"] / 60
    expected = event_min * (surge + quiet - 1) / (1 - quiet)
    naive = configs["naive"]["recovery_min"]
    target = expected if args.quick else 300.0  # the practices' figure for the seed-scale defaults
    print(
        f"noisy: {scenario['tenants']} tenants, capacity {scenario['capacity']:.1f} msg/s, "
        f"{event_min:.0f}-minute surge at {surge:g}x, quiet load {quiet:.0%}"
    )
    line(
        "naive recovery (min)",
        f"{naive}",
        f"arithmetic {expected:.0f}; goal {target:.0f} ± 10 %",
        naive is not None and abs(naive - target) <= 0.1 * target,
    )
    for name in ("fair", "breakwater"):
        result = configs[name]
        ok = name != "breakwater" or None
        ratio, worst = result["quiet_p99_ratio"], result["quiet_p99_max_ratio"]
        after = result["ages"]["quiet"]["after_p99_ms"]
        baseline = result["quiet_baseline_p99_ms"]
        line(
            f"{name}: quiet p99 during surge / baseline",
            f"{ratio}x",
            "goal <= 2" if name == "breakwater" else "",
            ratio is not None and ratio <= 2 if ok is None else None,
        )
        line(
            f"{name}: quiet p99 after surge / baseline",
            f"{after / baseline:.2f}x" if after and baseline else "-",
            "goal <= 2" if name == "breakwater" else "",
            after is not None and after <= 2 * baseline if ok is None else None,
        )
        line(f"{name}: quiet p99 worst minute / baseline", f"{worst}x (baseline {baseline:.0f} ms)")
        recovery = result["recovery_min"]
        line(
            f"{name}: fresh traffic recovered after the surge (min)",
            f"{recovery}",
            "goal <= 1" if name == "breakwater" else "",
            recovery is not None and recovery <= 1 if ok is None else None,
        )
        line(f"{name}: peak backlog", f"{result['peak_backlog']:,}")
    line("naive: peak backlog", f"{configs['naive']['peak_backlog']:,}")

    outage = child(["--scenario", "outage", *small], args.jobs)
    slow = child(["--scenario", "slow", *small], args.jobs)
    poison = child(["--scenario", "poison", *small], args.jobs)
    for label, document in (("noisy", noisy), ("outage", outage), ("slow", slow), ("poison", poison)):
        rate = document["simulated_messages"] / document["wall_s"]
        jobs = document.get("jobs", 1)
        line(
            f"{label}: simulated messages per wall second (3 configurations, {jobs} "
            f"{'process' if jobs == 1 else 'processes'})",
            f"{rate:,.0f}",
            "goal >= 50,000",
            rate >= 50_000,
        )
        line(f"{label}: simulated messages", f"{document['simulated_messages']:,}")
        line(f"{label}: the configurations' wall time (s)", f"{document['wall_s']:.1f}")
        for name, result in document["configurations"].items():
            line(f"{label} {name}: wall time (s)", f"{result['wall_s']:.1f}")
        line(
            f"{label}: wall time (s)",
            f"{document['process_wall_s']:.1f}",
            "goal < 180",
            document["process_wall_s"] < 180,
        )
        peak = document["peak_rss_mb"]
        line(
            f"{label}: peak memory (MB)",
            "-" if peak is None else f"{peak:,.0f}",
            "goal < 2,048",
            None if peak is None else peak < 2048,
        )
    for name, result in outage["configurations"].items():
        line(f"outage {name}: dead-lettered", f"{result['dead_lettered']:,}")
        line(f"outage {name}: fresh traffic recovered (min)", f"{result['recovery_min']}")

    # Linearity: the same virtual dynamics with fewer messages (each more expensive). A run has fixed
    # costs besides its messages (the load's ticks, the samples, idle polls): fit time = fixed + per
    # message x messages over three sizes, and compare ten times the messages with the usual.
    whole = noisy["configurations"]["naive"]
    points = [(whole["simulated_messages"], whole["wall_s"])]
    for work in ("3000", "10000"):
        part = child(["--scenario", "noisy", "--configurations", "naive", "--work-ms", work, *small])
        points.append(
            (part["configurations"]["naive"]["simulated_messages"], part["configurations"]["naive"]["wall_s"])
        )
    xs = [float(x) for x, _ in points]
    ys = [y for _, y in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x in xs)
    fixed = mean_y - slope * mean_x
    residual = max(abs(y - (fixed + slope * x)) / y for x, y in points)
    for messages, wall in sorted(points):
        line(f"linearity: naive noisy, {messages:,} messages (s)", f"{wall:.2f}")
    line("linearity: fit, microseconds per message", f"{slope * 1e6:.2f}")
    line("linearity: fit, fixed seconds per run", f"{fixed:.2f}")
    line("linearity: worst distance from the line", f"{residual:.1%}", "goal: a line", residual <= 0.1)
    (small_m, small_t), (big_m, big_t) = min(points), max(points)
    line(
        f"linearity: {big_m / small_m:.1f}x the messages takes",
        f"{big_t / small_t:.2f}x the time",
        f"{(big_t - fixed) / (small_t - fixed):.1f}x without the fixed part",
    )
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")
    return 0


def scale(jobs: int | None) -> int:
    """The scale scenario's goals and findings, one figure per line."""
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (start)")
    document = child(["--scenario", "scale"], jobs)
    print(f"scale: {document['scenario']['tenants']:,} tenants; {document['limits']}")
    wall = document["process_wall_s"]
    line("scale: wall time (s)", f"{wall:.1f}", "goal < 600", wall < 600)
    peak = document["peak_rss_mb"]
    line(
        "scale: peak memory (MB)",
        "-" if peak is None else f"{peak:,.0f}",
        "goal < 4,096",
        peak and peak < 4096,
    )
    for name, result in document["configurations"].items():
        line(f"scale {name}: offered / accepted", f"{result['offered']:,} / {result['accepted']:,}")
        line(
            f"scale {name}: simulated messages, wall (s)",
            f"{result['simulated_messages']:,}, {result['wall_s']}",
        )
        line(f"scale {name}: quiet p99 full load / baseline", f"{result['quiet_p99_ratio']}x")
        line(f"scale {name}: quiet p99 worst minute / baseline", f"{result['quiet_p99_max_ratio']}x")
        hottest = result["hottest_items"]
        if hottest:
            top = hottest[0]
            line(f"scale {name}: hottest item", f"{top['item']}")
            line(
                f"scale {name}: its peak WCU/s (limit 1,000), RCU/s",
                f"{top['peak_wcu_per_s']:,.0f}, {top['peak_rcu_per_s']:,.0f}",
            )
        throttles = result["dynamodb_throttles"]
        line(f"scale {name}: DynamoDB throttles", f"{sum(throttles.values()):,}")
        for kind, count in throttles.items():
            line(f"scale {name}: throttled {kind}", f"{count:,}")
        for effect, count in result["throttle_effects"].items():
            if count:
                line(f"scale {name}: {effect}", f"{count:,}")
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
