"""The simulator reads the blueprint's configuration as the synth does, with overrides."""

from __future__ import annotations

import pytest

import sim  # noqa: F401
from breakwater_cdk.config import ConfigError
from sim.config import blueprint, load_context, parse_assignment, setups


def test_a_setting_on_the_command_line_overrides_cdk_json() -> None:
    assert parse_assignment("worker.max_concurrency=20") == {"worker": {"max_concurrency": 20}}
    assert parse_assignment("breakwater.mode=naive") == {"mode": "naive"}
    config = blueprint(
        load_context(), [parse_assignment("worker.max_concurrency=20"), {"queue_set": {"size": 4}}]
    )
    assert (config.worker.max_concurrency, config.queue_set.size) == (20, 4)
    assert config.worker.batch_size == load_context()["worker"]["batch_size"]  # the rest stays


def test_a_bad_setting_is_refused_with_the_synths_message() -> None:
    with pytest.raises(ConfigError, match=r"worker\.max_concurrency = 5000"):
        blueprint(load_context(), [parse_assignment("worker.max_concurrency=5000")])
    with pytest.raises(ValueError, match=r"key\.path=value"):
        parse_assignment("nonsense")


def test_the_three_configurations_share_the_fleet_unless_told_otherwise() -> None:
    config = blueprint(load_context())
    fleet = config.queue_set.size * config.worker.max_concurrency
    same = setups(config, same_fleet=True)
    assert (same["naive"].queue_count, same["naive"].live_max_concurrency, same["naive"].group_ids) == (
        1,
        fleet,
        False,
    )
    assert (same["fair"].group_ids, same["fair"].practices) == (True, False)
    assert (same["breakwater"].queue_count, same["breakwater"].practices) == (config.queue_set.size, True)
    assert setups(config, same_fleet=False)["naive"].live_max_concurrency == config.worker.max_concurrency
