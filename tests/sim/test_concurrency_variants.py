"""``python -m sim --concurrency-variants N``: the scenarios again at a small mapping concurrency."""

from __future__ import annotations

import json
from pathlib import Path

import sim  # noqa: F401
from sim.__main__ import main
from sim.config import CDK_JSON, blueprint, load_context, setups
from sim.scenarios import seed_scale
from sim.system import System
from sim.worker import Costs

TINY = [
    "--scenario",
    "noisy",
    "--tenants",
    "40",
    "--baseline-minutes",
    "1",
    "--event-minutes",
    "1",
    "--after-hours",
    "0.02",
    "--jobs",
    "1",
    "--no-plot",
]


def test_every_configurations_pollers_shrink_with_the_mapping_concurrency() -> None:
    config = blueprint(load_context(CDK_JSON), [{"worker": {"max_concurrency": 2}}])
    costs = Costs()
    scenario = seed_scale("noisy", config, tenants=40, costs=costs)
    live_queues = config.queue_set.size
    for name, setup in setups(config, same_fleet=True).items():
        system = System(scenario, setup, costs)
        mappings = [*system.mappings, *system.sideline_mappings.values()]
        most = live_queues * 2 if name in ("naive", "fair") else 2
        assert all(mapping.max_concurrency <= most for mapping in mappings), name
        assert all(mapping.active <= most for mapping in mappings), name


def test_a_variant_writes_its_results_beside_the_default_with_the_same_keys(tmp_path: Path) -> None:
    assert main([*TINY, "--concurrency-variants", "2", "--out", str(tmp_path)]) == 0
    default = json.loads((tmp_path / "noisy.json").read_text())
    small = json.loads((tmp_path / "max_concurrency_2" / "noisy.json").read_text())
    assert list(small["configurations"]) == list(default["configurations"]) == ["naive", "fair", "breakwater"]
    for name, result in default["configurations"].items():
        assert set(small["configurations"][name]) == set(result)
    config = blueprint(load_context(CDK_JSON))
    per_queue, live = config.worker.mapping_concurrency, config.queue_set.size
    assert default["mapping_concurrency"] == {
        "naive": live * per_queue,
        "fair": live * per_queue,
        "breakwater": per_queue,
    }
    assert small["mapping_concurrency"] == {"naive": live * 2, "fair": live * 2, "breakwater": 2}
    assert small["worker_max_concurrency"] == 2


def test_a_variant_that_is_not_a_number_is_refused(tmp_path: Path) -> None:
    assert main([*TINY, "--concurrency-variants", "two", "--out", str(tmp_path)]) == 2
    assert main([*TINY, "--concurrency-variants", "1", "--out", str(tmp_path)]) == 2  # below the config's 2
