"""The outage's figures from samples and effects, and the processor hooks that record the effects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from breakwater import processor
from breakwater.envelope import Envelope, new_envelope_id
from breakwater.processor import DependencyUnavailableError, WorkContext
from local.emulator import processor_hooks
from local.scenarios.noisy_neighbour import Scenario
from local.scenarios.outcomes import FaultSwitches, duplicated, outage_figures, read_effects

STARTED = 1_000.0
OUTAGE = Scenario(kind="outage", baseline_s=10.0, burst_s=10.0, after_s=10.0)


def effect(enqueued_t: float, age_s: float, key: str | None = None) -> dict[str, Any]:
    enqueued = int((STARTED + enqueued_t) * 1000)
    return {"id": key or f"m{enqueued_t}", "enqueued_at": enqueued, "at": enqueued + int(age_s * 1000)}


def test_fresh_traffic_recovers_when_its_p99_is_back_near_the_baseline() -> None:
    effects = [effect(t / 2, 0.1) for t in range(20)]  # baseline: served in 100 ms
    effects += [effect(20 + t / 2, 3.0 - t / 2 if t < 6 else 0.12) for t in range(20)]  # slow, then fast
    accepted = [(e["enqueued_at"] / 1000 - STARTED, "t") for e in effects]
    depths = [(float(t), 2, 0, 0) for t in range(10)] + [(20.0, 40, 10, 0), (23.0, 3, 0, 0)]

    figures = outage_figures(OUTAGE, STARTED, effects, accepted, depths, [])

    assert figures["fresh_recovery_s"] == 3.0  # from 23 s on every message is served in 120 ms
    assert figures["drain_s"] == 3.0 and figures["backlog_at_outage_end"] == 50
    assert figures["peak_backlog"] == 50


def test_a_fresh_message_accepted_and_never_served_keeps_recovery_open() -> None:
    effects = [effect(t / 2, 0.1) for t in range(20)] + [effect(21.0, 0.1)]
    accepted = [(e["enqueued_at"] / 1000 - STARTED, "t") for e in effects] + [(29.5, "t")]  # never served

    figures = outage_figures(OUTAGE, STARTED, effects, accepted, [(0.0, 0, 0, 0)], [])

    assert figures["fresh_recovery_s"] is None or figures["fresh_recovery_s"] >= 9.5
    assert figures["drain_s"] is None  # no sample after the outage


def test_effects_read_back_and_duplicates_count(tmp_path: Path) -> None:
    path = tmp_path / "effects.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in (effect(1, 0.1, "a"), effect(1, 0.1, "a"))))
    assert len(read_effects(path)) == 2 and duplicated(read_effects(path)) == 1
    assert read_effects(tmp_path / "none.jsonl") == []


def _envelope(payload: dict[str, Any]) -> Envelope:
    return Envelope.model_validate(
        {"id": new_envelope_id(), "tenant": "acme", "type": "t", "enqueued_at": 1, "payload": payload}
    )


def test_the_hooks_inject_the_scenario_s_faults_and_record_what_ran(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    switches = FaultSwitches(tmp_path / "faults.json")
    effects = tmp_path / "effects.jsonl"
    monkeypatch.setenv(processor_hooks.FAULTS_ENV, str(switches.path))
    monkeypatch.setenv(processor_hooks.EFFECTS_ENV, str(effects))
    monkeypatch.setattr(processor_hooks, "REREAD_S", 0.0)
    monkeypatch.setattr(processor, "process", lambda envelope, work: {"ok": envelope.id})
    assert processor_hooks.install()
    work = WorkContext()
    fine, poison = _envelope({}), _envelope({"poison": True})

    assert processor.process(fine, work) == {"ok": fine.id}
    with pytest.raises(ValueError, match="poison"):
        processor.process(poison, work)
    switches.set(dependency_down=True)
    with pytest.raises(DependencyUnavailableError):
        processor.process(fine, work)
    switches.set(dependency_down=False, poison_fixed=True)
    assert processor.process(poison, work) == {"ok": poison.id}

    recorded = read_effects(effects)
    assert [(e["id"], e["poison"]) for e in recorded] == [(fine.id, False), (poison.id, True)]


def test_without_the_variables_the_processor_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(processor_hooks.FAULTS_ENV, raising=False)
    monkeypatch.delenv(processor_hooks.EFFECTS_ENV, raising=False)
    monkeypatch.delenv(processor_hooks.WORK_MS_ENV, raising=False)
    assert not processor_hooks.install()
