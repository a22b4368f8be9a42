"""The demo's knobs are flags; a bad value is refused naming the flag and the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from local.__main__ import CONFIGURATIONS, build_parser, configurations_of, scenario_of
from local.scenarios.noisy_neighbour import Scenario


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

    ran: list[tuple[str, Path]] = []
    pages: list[Path] = []
    configurations_run: list[tuple[str, ...]] = []

    def run(
        scenario: Scenario, out: Path, progress: bool, limits: object, configurations: tuple[str, ...]
    ) -> None:
        ran.append((scenario.kind, out))
        configurations_run.append(configurations)

    def write_page(root: Path) -> Path:
        pages.append(root)
        return root

    monkeypatch.setattr(cli, "ROOT", tmp_path)
    monkeypatch.setattr(demo_module, "main", run)
    monkeypatch.setattr(html_report, "write_html_report", write_page)
    assert cli.demo(build_parser().parse_args(["demo", "--scenario", "all", "--quiet"])) == 0
    assert ran == [
        ("noisy", tmp_path / "out"),
        ("slow", tmp_path / "out" / "slow"),
        ("outage", tmp_path / "out" / "outage"),
        ("poison", tmp_path / "out" / "poison"),
    ]
    assert pages == [tmp_path / "out"]  # one page with every scenario
    # every scenario runs the three configurations side by side, in the demo's order
    assert configurations_run == [("breakwater", "naive", "fair")] * 4


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ([], ("breakwater", "naive")),  # make demo: the two it needs, within its time budget
        (["--scenario", "slow"], ("breakwater", "naive")),
        (["--scenario", "all"], ("breakwater", "naive", "fair")),  # make scenarios: all three
        (["--configurations", "naive,fair,breakwater"], ("breakwater", "naive", "fair")),
        (["--configurations", "fair, naive"], ("naive", "fair")),  # run in the demo's order
        (["--configurations", "fair"], ("fair",)),
        (["--scenario", "all", "--configurations", "breakwater,fair"], ("breakwater", "fair")),
    ],
)
def test_the_configurations_flag_picks_which_run(flags: list[str], expected: tuple[str, ...]) -> None:
    assert configurations_of(build_parser().parse_args(["demo", *flags])) == expected


def test_the_cli_s_configurations_are_the_demo_s() -> None:
    from local.scenarios import demo as demo_module

    assert CONFIGURATIONS == demo_module.CONFIGURATION_NAMES
    assert configurations_of(build_parser().parse_args(["demo"])) == demo_module.DEFAULT_CONFIGURATIONS


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            "naive,fifo",
            "argument --configurations: 'naive,fifo' is not a comma-separated subset of "
            "naive,fair,breakwater (unknown: fifo)",
        ),
        (",", "argument --configurations: ',' is not a comma-separated subset of naive,fair,breakwater"),
    ],
)
def test_a_bad_configuration_names_the_flag_and_the_value(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--configurations", value])
    assert message in capsys.readouterr().err


def test_the_demo_refuses_a_configuration_it_does_not_have(tmp_path: Path) -> None:
    from local.scenarios import demo as demo_module

    with pytest.raises(ValueError, match="configurations must be some of breakwater, naive, fair, not fifo"):
        demo_module.main(out=tmp_path, configurations=("fifo",))


def test_fair_is_the_naive_stack_with_the_tenant_as_message_group() -> None:
    from app import cdk_json_context, merge_context
    from breakwater_cdk.config import load_config
    from local.scenarios.demo import CONFIGURATIONS as RUNS
    from local.scenarios.demo import configuration_context

    # As the runtime synthesizes it: cdk.json's context, then the configuration's.
    contexts = {
        name: merge_context(cdk_json_context(), configuration_context(Scenario(), extra))
        for name, extra in RUNS
    }
    configs = {name: load_config(context["breakwater"]) for name, context in contexts.items()}
    assert (configs["fair"].mode, configs["fair"].queue_set.fair_queues) == ("naive", True)
    assert (configs["naive"].mode, configs["naive"].queue_set.fair_queues) == ("naive", False)
    assert (configs["breakwater"].mode, configs["breakwater"].queue_set.fair_queues) == ("breakwater", True)
    assert configs["fair"].effective_queue_count == configs["naive"].effective_queue_count == 1


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
