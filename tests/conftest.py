"""Fixtures shared by every tier. Fake credentials first, so nothing can ever reach a real account."""

from __future__ import annotations

import os

import pytest

FAKE_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SECURITY_TOKEN": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "POWERTOOLS_SERVICE_NAME": "breakwater-test",
    "POWERTOOLS_METRICS_NAMESPACE": "BreakwaterTest",
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_DEV": "false",
    "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    "SPARK_LOCAL_IP": "127.0.0.1",
}
# Set at import time as well: handler modules create their boto3 clients when first imported.
os.environ.update(FAKE_AWS_ENV)


@pytest.fixture(autouse=True)
def _fake_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in FAKE_AWS_ENV.items():
        monkeypatch.setenv(name, value)
