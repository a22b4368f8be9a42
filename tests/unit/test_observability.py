"""The tracer is a Powertools Tracer only where it would trace; elsewhere X-Ray is never imported.

The Powertools switches the package reads itself come from one settings model, read from the environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from breakwater.observability import DisabledTracer, PowertoolsSettings, tracing_disabled

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("environment", "disabled"),
    [
        ({"POWERTOOLS_TRACE_DISABLED": "true"}, True),
        ({"POWERTOOLS_TRACE_DISABLED": "1", "LAMBDA_TASK_ROOT": "/var/task"}, True),
        ({"POWERTOOLS_TRACE_DISABLED": "false"}, True),  # outside Lambda: no daemon to talk to
        ({"POWERTOOLS_TRACE_DISABLED": "false", "LAMBDA_TASK_ROOT": "/var/task"}, False),
        ({"LAMBDA_TASK_ROOT": "/var/task", "AWS_SAM_LOCAL": "true"}, True),
    ],
)
def test_tracing_is_disabled_where_powertools_would_disable_it(
    environment: dict[str, str], disabled: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("POWERTOOLS_TRACE_DISABLED", "LAMBDA_TASK_ROOT", "AWS_SAM_LOCAL", "AWS_CHALICE_CLI_MODE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert tracing_disabled() is disabled


def test_the_disabled_tracer_leaves_the_decorated_functions_as_they_are() -> None:
    tracer = DisabledTracer()

    def handler(event: object, context: object) -> str:
        return "done"

    assert tracer.capture_lambda_handler(handler) is handler
    assert tracer.capture_lambda_handler(capture_response=False)(handler) is handler
    assert tracer.capture_method(handler) is handler
    assert tracer.capture_method(capture_error=False)(handler) is handler


def _imports_xray(environment: dict[str, str]) -> bool:
    code = (
        "import sys, breakwater.observability as o;"
        " print('aws_xray_sdk' in sys.modules, type(o.tracer).__name__)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "functions"), **environment}
    done = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)  # noqa: S603
    imported, kind = done.stdout.split()
    assert kind == ("Tracer" if imported == "True" else "DisabledTracer")
    return imported == "True"


def test_the_xray_sdk_is_imported_only_where_tracing_is_on() -> None:
    assert not _imports_xray({"POWERTOOLS_TRACE_DISABLED": "true", "LAMBDA_TASK_ROOT": "/var/task"})
    assert _imports_xray({"POWERTOOLS_TRACE_DISABLED": "false", "LAMBDA_TASK_ROOT": "/var/task"})


def test_powertools_settings_read_the_switches_as_powertools_does() -> None:
    assert PowertoolsSettings.from_env({}) == PowertoolsSettings(
        trace_disabled=False, in_lambda=False, emulated=False, idempotency_disabled=False
    )
    settings = PowertoolsSettings.from_env(
        {
            "POWERTOOLS_TRACE_DISABLED": "1",
            "LAMBDA_TASK_ROOT": "/var/task",
            "AWS_CHALICE_CLI_MODE": "true",
            "POWERTOOLS_IDEMPOTENCY_DISABLED": "Yes",
        }
    )
    assert settings == PowertoolsSettings(
        trace_disabled=True, in_lambda=True, emulated=True, idempotency_disabled=True
    )
    assert not PowertoolsSettings.from_env({"POWERTOOLS_IDEMPOTENCY_DISABLED": "off"}).idempotency_disabled


def test_a_switch_that_is_not_a_boolean_fails_at_once() -> None:
    with pytest.raises(ValueError, match="trace_disabled"):
        PowertoolsSettings.from_env({"POWERTOOLS_TRACE_DISABLED": "maybe"})


def test_tracing_is_judged_on_the_settings_given() -> None:
    in_lambda = PowertoolsSettings(in_lambda=True)
    assert not tracing_disabled(in_lambda)
    assert tracing_disabled(PowertoolsSettings(in_lambda=True, trace_disabled=True))
    assert tracing_disabled(PowertoolsSettings(in_lambda=True, emulated=True))
    assert tracing_disabled(PowertoolsSettings())
