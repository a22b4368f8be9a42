"""Run a scenario for each configuration and gather the results, one process per configuration at a time.

The configurations of a scenario share nothing while they run (each :class:`System` has its own clock,
queues, state and random generator, seeded from the scenario), so they run in parallel processes
(``jobs``) and give exactly what they give one after the other. Each process summarizes its own
recording and sends back the summary, never the recording (millions of first attempts).
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from breakwater_cdk.config import BlueprintConfig
from local.aws_limits import AwsLimits
from sim.config import ConfigName, Setup, setups
from sim.report import summarize
from sim.scenarios import Scenario
from sim.system import System
from sim.worker import Costs


def default_jobs() -> int:
    """One process per core, at most one per configuration (the caller caps it)."""
    return os.cpu_count() or 1


@dataclass
class ScenarioRun:
    """A scenario's configurations, run: their summaries by name, the wall time, the processes' peaks."""

    results: dict[str, dict[str, Any]]
    wall_s: float
    jobs: int
    # each worker process's peak resident memory (MB); empty when the configurations ran in this process
    workers_peak_rss_mb: list[float] = field(default_factory=list)


def run_one(
    scenario: Scenario,
    setup: Setup,
    costs: Costs,
    function_concurrency: int | None,
    limits: AwsLimits | None = None,
) -> dict[str, Any]:
    """One configuration, run to the end and summarized (``limits``: AWS's own figures when None)."""
    system = System(scenario, setup, costs, function_concurrency=function_concurrency, limits=limits)
    return summarize(system.run(), scenario)


def _run_in_worker(
    scenario: Scenario,
    setup: Setup,
    costs: Costs,
    function_concurrency: int | None,
    limits: AwsLimits | None,
) -> tuple[dict[str, Any], int, float]:
    result = run_one(scenario, setup, costs, function_concurrency, limits)
    return result, os.getpid(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_scenario(
    scenario: Scenario,
    config: BlueprintConfig,
    *,
    costs: Costs,
    configurations: Sequence[ConfigName] = ("naive", "fair", "breakwater"),
    same_fleet: bool = True,
    function_concurrency: int | None = None,
    jobs: int = 1,
    limits: AwsLimits | None = None,
) -> ScenarioRun:
    """Every configuration of ``scenario``; ``jobs`` above 1 runs up to that many at once in processes.

    The results come back in the order of ``configurations`` whatever finished first; the costliest
    configuration (the one with every practice: the front door's buckets, the gates and the controller
    cost more per message than the queues) starts first, so the others share the remaining processes.
    """
    made = setups(config, same_fleet=same_fleet)
    names = list(configurations)
    workers = max(1, min(jobs, len(names)))
    started = time.perf_counter()
    if workers == 1:
        results: dict[str, dict[str, Any]] = {
            name: run_one(scenario, made[name], costs, function_concurrency, limits) for name in names
        }
        return ScenarioRun(results, time.perf_counter() - started, 1)
    first = sorted(names, key=lambda name: not made[name].practices)
    peaks: dict[int, float] = {}
    done: dict[str, dict[str, Any]] = {}
    # A process per configuration, ended when it is done: what it held (its recording, its queues' last
    # messages) goes back to the system, so the processes' memory adds up to at most ``workers`` runs.
    with ProcessPoolExecutor(max_workers=workers, max_tasks_per_child=1) as pool:
        futures = {
            name: pool.submit(_run_in_worker, scenario, made[name], costs, function_concurrency, limits)
            for name in first
        }
        for name, future in futures.items():
            result, pid, peak = future.result()
            done[name] = result
            peaks[pid] = max(peaks.get(pid, 0.0), peak)
    return ScenarioRun(
        {name: done[name] for name in names}, time.perf_counter() - started, workers, list(peaks.values())
    )
