"""Configurations run in parallel processes give exactly what they give one after the other."""

from __future__ import annotations

from typing import Any

import sim  # noqa: F401
from sim.config import blueprint, load_context
from sim.run import run_scenario
from sim.scenarios import seed_scale
from sim.worker import Costs

COSTS = Costs()
SMALL = {"worker": {"max_concurrency": 2}}
# what depends on the machine, not on the run
WALL = ("wall_s", "messages_per_wall_s")


def _without_wall(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: {k: v for k, v in result.items() if k not in WALL} for name, result in results.items()}


def test_parallel_configurations_give_the_sequential_results_in_the_same_order() -> None:
    config = blueprint(load_context(), [SMALL])
    scenario = seed_scale(
        "outage",
        config,
        tenants=50,
        baseline_s=120,
        event_s=120,
        after_s=300,
        costs=COSTS,
    )
    sequential = run_scenario(scenario, config, costs=COSTS, jobs=1)
    parallel = run_scenario(scenario, config, costs=COSTS, jobs=2)
    assert (sequential.jobs, parallel.jobs) == (1, 2)
    assert list(parallel.results) == list(sequential.results) == ["naive", "fair", "breakwater"]
    assert _without_wall(parallel.results) == _without_wall(sequential.results)
    assert sequential.workers_peak_rss_mb == []
    # a process per configuration, two at a time, each ended when its configuration is done
    assert len(parallel.workers_peak_rss_mb) == 3 and all(p > 0 for p in parallel.workers_peak_rss_mb)
