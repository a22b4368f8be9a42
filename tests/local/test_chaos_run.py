"""A short chaos run on the embedded runtime: keyed load, faults, drain, and the checker's verdicts.

The same code path as ``python -m local chaos`` (``local.scenarios.chaos.run_chaos``): the stack created
in moto with an effects table beside it, the keyed client in its own process, the faults at modest
rates, the checker on the request log, the effects, the dead-letter queues and the worker's drops.
"""

from __future__ import annotations

from typing import Any

import pytest

from local.scenarios.chaos import ChaosConfig, run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:Tried to parse:UserWarning")]

# Every fault kind on at a modest rate; the processor's faults pick their messages by the seed, so
# these rates pick some of the thousand every time.
SHORT = ChaosConfig(
    messages=1000,
    tenants=4,
    rate=40.0,
    seed=11,
    drain_s=90.0,
    kill_rate=0.03,
    transient_rate=0.03,
    permanent_share=0.01,
    long_share=0.01,
    duplicate_rate=0.02,
    lost_ack_rate=0.03,
    aws_throttle_rate=0.02,
    aws_error_rate=0.01,
    controller_crash_rate=0.7,
)


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    return run_chaos(SHORT, name="test-chaos", progress=False)


def test_nothing_is_lost_done_twice_or_unexpected(report: dict[str, Any]) -> None:
    assert report["attempted"] == SHORT.messages
    assert report["lost"] == report["duplicated"] == report["unexpected"] == 0, report["samples"]
    assert report["server_errors"] == report["id_mismatches"] == report["replayed_without_flag"] == 0


def test_every_acknowledged_message_is_processed_or_dead_lettered_and_every_permanent_failure_is(
    report: dict[str, Any],
) -> None:
    assert report["acknowledged"] == SHORT.messages  # nothing here refuses a request for good
    assert report["processed"] + report["in_dlq"] == report["acknowledged"]
    assert report["in_dlq_permanent"] == report["permanent_failures"] > 0
    assert report["permanent_not_in_dlq"] == report["permanent_processed"] == report["still_queued"] == 0
    # A message that does not fail for good may still reach a DLQ: the run's visibility timeout is far
    # below the worker's (see local/scenarios/chaos.py), so a copy that finds the lock of a killed
    # invocation comes back, and fails, several times before that lock expires. It is accounted for.


def test_every_fault_kind_was_injected(report: dict[str, Any]) -> None:
    assert set(report["faults_injected"]) == set(SHORT.injected())
    assert report["fault_kinds_missing"] == []
    assert all(count > 0 for count in report["faults_injected"].values()), report["faults_injected"]
    # the client's dropped answers were retried and answered again with the same id
    assert report["acknowledged_then_dropped"] == report["faults_injected"]["lost_ack"]
