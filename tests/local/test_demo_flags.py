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
    from local.scenarios import html_report

    ran: list[tuple[str, str]] = []
    pages: list[object] = []
    monkeypatch.setattr(cli, "ROOT", tmp_path)
    monkeypatch.setattr(
        demo_module, "main", lambda scenario, out, progress, limits: ran.append((scenario.kind, out))
    )
    monkeypatch.setattr(html_report, "write_html_report", lambda root: pages.append(root) or root)
    assert cli.demo(build_parser().parse_args(["demo", "--scenario", "all", "--quiet"])) == 0
    assert ran == [
        ("noisy", tmp_path / "out"),
        ("slow", tmp_path / "out" / "slow"),
        ("outage", tmp_path / "out" / "outage"),
        ("poison", tmp_path / "out" / "poison"),
    ]
    assert pages == [tmp_path / "out"]  # one page with every scenario


def test_the_outage_lasts_its_own_flag_and_every_tenant_keeps_its_rate() -> None:
    args = build_parser().parse_args(["demo", "--scenario", "outage", "--outage-seconds", "12"])
    scenario = scenario_of(args)
    assert (scenario.kind, scenario.burst_s) == ("outage", 12.0)
    assert scenario.rate(scenario.noisy, scenario.baseline_s + 1) == scenario.quiet_rate


def test_the_poison_share_of_the_poison_tenant_s_messages_is_poison() -> None:
    args = build_parser().parse_args(["demo", "--scenario", "poison", "--poison-share", "0.1"])
    scenario = scenario_of(args)
    poison = scenario.noisy
    assert scenario.rate(poison, 0.0) == 5  # the tier's consumer rate, all along
    sends = [n / scenario.rate(poison, 0.0) for n in range(200)]
    poisoned = [t for t in sends if scenario.payload(poison, t).get("poison")]
    assert len(poisoned) == 20
    assert not any(scenario.payload("tenant-02", t).get("poison") for t in sends)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--outage-seconds", "0"], "argument --outage-seconds: 0 is outside 1 to 600"),
        (["--poison-share", "0.9"], "argument --poison-share: 0.9 is outside 0.001 to 0.5"),
        (["--scenario", "flood"], "argument --scenario: invalid choice: 'flood'"),
    ],
)
def test_a_bad_scenario_knob_names_the_flag_and_the_value(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", *flags])
    assert message in capsys.readouterr().err
