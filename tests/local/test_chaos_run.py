"""A short chaos run on the embedded runtime: keyed load, faults, drain, and the checker's verdicts.

The same code path as ``python -m local chaos`` (``local.scenarios.chaos.run_chaos``): the stack created
in moto with an effects table beside it, the keyed client in its own process, the checker on the
request log, the effects, the dead-letter queues and the worker's drops.
"""

from __future__ import annotations

from typing import Any

import pytest

from local.scenarios.chaos import ChaosConfig, run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:Tried to parse:UserWarning")]

CLEAN = ChaosConfig(messages=300, tenants=3, rate=40.0, seed=11, drain_s=60.0)


@pytest.fixture(scope="module")
def clean() -> dict[str, Any]:
    return run_chaos(CLEAN, name="test-chaos-clean", progress=False)


def test_without_faults_every_message_is_acknowledged_and_processed_once(clean: dict[str, Any]) -> None:
    assert clean["attempted"] == clean["acknowledged"] == CLEAN.messages
    assert clean["processed"] == clean["runs"] == CLEAN.messages
    assert clean["lost"] == clean["duplicated"] == clean["unexpected"] == 0
    assert clean["in_dlq"] == clean["still_queued"] == clean["server_errors"] == 0
    assert clean["faults_injected"] == {} and clean["fault_kinds_missing"] == []
