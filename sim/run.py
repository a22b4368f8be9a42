"""Run a scenario for each configuration and gather the results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sim.config import ConfigName, setups
from sim.report import summarize
from sim.scenarios import Scenario
from sim.system import System
from sim.worker import Costs
from stacks.config import BlueprintConfig


def run_configurations(
    scenario: Scenario,
    config: BlueprintConfig,
    *,
    costs: Costs,
    configurations: Sequence[ConfigName] = ("naive", "fair", "breakwater"),
    same_fleet: bool = True,
    function_concurrency: int | None = None,
) -> dict[str, dict[str, Any]]:
    """One :class:`System` per configuration, each run to the end; their summaries by name."""
    made = setups(config, same_fleet=same_fleet)
    results: dict[str, dict[str, Any]] = {}
    for name in configurations:
        system = System(scenario, made[name], costs, function_concurrency=function_concurrency)
        results[name] = summarize(system.run(), scenario)
    return results
