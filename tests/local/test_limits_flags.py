"""The commands' limit flags: AWS's limits on by default at AWS's rates, scaled, or off."""

from __future__ import annotations

import pytest

from local.__main__ import build_parser, chaos_config, limits_of
from local.aws_limits import AwsLimits


@pytest.mark.parametrize("command", ["serve", "demo", "chaos"])
def test_limits_are_on_at_aws_rates_by_default_scaled_or_off(command: str) -> None:
    parser = build_parser()
    assert limits_of(parser.parse_args([command])) == AwsLimits()
    assert limits_of(parser.parse_args([command, "--limit-scale", "20"])) == AwsLimits(scale=20)
    assert limits_of(parser.parse_args([command, "--no-limits"])) is None


def test_the_chaos_run_carries_its_limits() -> None:
    assert chaos_config(build_parser().parse_args(["chaos", "--limit-scale", "5"])).limits == AwsLimits(
        scale=5
    )


def test_a_scale_below_one_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--limit-scale", "0.5"])
    assert "--limit-scale" in capsys.readouterr().err
