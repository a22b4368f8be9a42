"""The demo's knobs are flags; a bad value is refused naming the flag and the value."""

from __future__ import annotations

import pytest

from local.__main__ import build_parser, scenario_of


def test_the_flags_describe_the_scenario() -> None:
    args = build_parser().parse_args(
        ["demo", "--tenants", "5", "--quiet-rate", "1.5", "--noisy-factor", "4", "--burst-seconds", "8"]
    )
    scenario = scenario_of(args)
    assert scenario.tenant_ids == ["tenant-01", "tenant-02", "tenant-03", "tenant-04", "tenant-05"]
    assert scenario.rate("tenant-03", 0.0) == 1.5
    assert scenario.rate(scenario.noisy, scenario.baseline_s + 1) == 4 * 5  # x the tier's consumer rate
    assert (scenario.baseline_s, scenario.burst_s, scenario.after_s) == (15.0, 8.0, 25.0)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tenants", "1"], "argument --tenants: 1 is outside 2 to 100"),
        (["--tenants", "two"], "argument --tenants: 'two' is not an integer"),
        (["--quiet-rate", "0"], "argument --quiet-rate: 0 is outside 0.01 to 5"),
        (["--noisy-factor", "500"], "argument --noisy-factor: 500 is outside 1 to 50"),
        (["--after-seconds", "-3"], "argument --after-seconds: -3 is outside 1 to 600"),
    ],
)
def test_a_bad_value_names_the_flag_and_the_value(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["demo", *flags])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_slow_scenario_keeps_the_rate_and_makes_the_burst_expensive() -> None:
    scenario = scenario_of(build_parser().parse_args(["demo", "--scenario", "slow", "--slow-factor", "20"]))
    slow, burst = scenario.noisy, scenario.baseline_s + 1
    assert scenario.rate(slow, burst) == scenario.rate(slow, 0.0) == scenario.quiet_rate
    assert scenario.payload(slow, burst) == {"tenant": slow, "work_factor": 20.0}
    assert scenario.payload(slow, 0.0) == {"tenant": slow}  # before the burst: the usual cost
    assert "work_factor" not in scenario.payload("tenant-02", burst)


def test_all_runs_every_scenario_in_turn(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import local.__main__ as cli
    from local.scenarios import demo as demo_module

    ran: list[tuple[str, str]] = []
    monkeypatch.setattr(cli, "ROOT", tmp_path)
    monkeypatch.setattr(demo_module, "main", lambda scenario, out, progress: ran.append((scenario.kind, out)))
    assert cli.demo(build_parser().parse_args(["demo", "--scenario", "all", "--quiet"])) == 0
    assert ran == [("noisy", tmp_path / "out"), ("slow", tmp_path / "out" / "slow")]
