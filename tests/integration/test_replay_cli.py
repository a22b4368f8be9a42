"""``bin/replay`` starts the deployed Glue job with the run's arguments (moto's Glue records them)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from local.emulator.replay import ReplayRequest

ROOT = Path(__file__).resolve().parents[2]


def _bin_replay() -> Any:
    loader = importlib.machinery.SourceFileLoader("bin_replay", str(ROOT / "bin" / "replay"))
    spec = importlib.util.spec_from_loader("bin_replay", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_only_the_arguments_given_override_the_job_defaults() -> None:
    request = ReplayRequest(window_start="2026-01-01", tenants=("a", "b"), target_rate=50.0, dry_run=True)
    assert request.job_arguments() == {
        "--window_start": "2026-01-01", "--tenants": "a,b", "--target_rate": "50.0", "--dry_run": "true",
    }  # fmt: skip
    assert ReplayRequest().job_arguments() == {}


def test_bin_replay_starts_the_job_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "testing")
    with mock_aws():
        glue = boto3.client("glue", region_name="us-east-1")
        glue.create_job(
            Name="replay", Role="role", Command={"Name": "glueetl", "ScriptLocation": "s3://b/s.py"}
        )
        code = _bin_replay().main(["--job", "replay", "--tenants", "noisy", "--cutoff", "1767225600000"])
        assert code == 0
        (run,) = glue.get_job_runs(JobName="replay")["JobRuns"]
        assert run["Arguments"] == {"--tenants": "noisy", "--cutoff": "1767225600000"}
    assert run["Id"] in capsys.readouterr().out
