"""The simulator's run of the embedded default's noisy scenario agrees with the recorded runtime report."""

from __future__ import annotations

import sim  # noqa: F401
from sim.validation import REFERENCE, compare, load_reference, run_validation


def test_the_reference_is_a_runtime_report_of_both_configurations() -> None:
    reference = load_reference()
    assert set(reference["configurations"]) == {"naive", "breakwater"}
    assert reference["scenario"]["kind"] == "noisy"
    assert REFERENCE.name == "noisy.json"


def test_the_simulation_agrees_with_the_runtime_report() -> None:
    checks = compare(run_validation())
    failed = [check.describe() for check in checks if not check.passed]
    assert not failed, failed
    assert len(checks) == 5
