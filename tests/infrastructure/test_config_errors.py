"""An invalid ``breakwater`` context stops the synth with an error naming the key and the value."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app import build_app, cdk_json_context, merge_context
from breakwater_cdk.config import ConfigError
from breakwater_cdk.functions import processor_environment
from breakwater_cdk.processor import Processor

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"queue_set": {"size": 2, "shard_size": 3}}, ["breakwater.queue_set", "shard_size (3)", "size (2)"]),
        ({"queue_sets": {"size": 4}}, ["breakwater.queue_sets", "unknown key", "'size': 4"]),
        ({"default_tier": None}, ["breakwater.default_tier", "required key is missing"]),
        ({"default_tier": "gold"}, ["default_tier 'gold'", "premium, standard"]),
        ({"worker": {"batch_size": 0}}, ["breakwater.worker.batch_size = 0"]),
        (
            {"worker": {"batch_size": 100}},
            ["breakwater.worker", "batch_size 100 needs batching_window_seconds"],
        ),
        ({"worker": {"burst_share": 1.5}}, ["breakwater.worker.burst_share = 1.5"]),
        (
            {"ingest": {"idempotency_window_seconds": 10}},
            ["breakwater.ingest.idempotency_window_seconds = 10", "greater than or equal to 60"],
        ),
        ({"queue_set": {"size": 64}}, ["CloudFormation allows 500", "breakwater.queue_set.size (64"]),
        (
            {"worker": {"max_concurrency": None, "provisioned_pollers": {"minimum_pollers": 1}}},
            ["breakwater.worker.provisioned_pollers.minimum_pollers = 1", "greater than or equal to 2"],
        ),
        (
            {"worker": {"max_concurrency": None, "provisioned_pollers": {"minimum_pollers": 201}}},
            ["breakwater.worker.provisioned_pollers.minimum_pollers = 201", "less than or equal to 200"],
        ),
        (
            {"worker": {"max_concurrency": None, "provisioned_pollers": {"maximum_pollers": 1}}},
            ["breakwater.worker.provisioned_pollers.maximum_pollers = 1", "greater than or equal to 2"],
        ),
        (
            {"ordered": {"provisioned_pollers": {"maximum_pollers": 2001}}},
            ["breakwater.ordered.provisioned_pollers.maximum_pollers = 2001", "less than or equal to 2000"],
        ),
        (
            {
                "worker": {
                    "max_concurrency": None,
                    "provisioned_pollers": {"minimum_pollers": 30, "maximum_pollers": 20},
                }
            },
            [
                "breakwater.worker.provisioned_pollers",
                "minimum_pollers (30) must not exceed maximum_pollers (20)",
            ],
        ),
        (
            # cdk.json sets worker.max_concurrency: provisioned mode needs it removed, not ignored.
            {"worker": {"provisioned_pollers": {"minimum_pollers": 4}}},
            ["breakwater.worker", "max_concurrency (10) and provisioned_pollers are exclusive"],
        ),
        (
            {"processing": {"guarantee": "twice"}},
            ["breakwater.processing.guarantee = 'twice'", "exactly_once", "at_least_once"],
        ),
        (
            # What the processor may touch is its own grants now (breakwater_cdk.Processor).
            {"processing": {"effect_tables": ["orders"]}},
            ["breakwater.processing.effect_tables", "['orders']", "Processor(grants="],
        ),
        (
            {"ordered": {"max_concurrency": 5, "provisioned_pollers": {}}},
            ["breakwater.ordered", "max_concurrency (5) and provisioned_pollers are exclusive"],
        ),
        # The stage throttle every tenant shares must carry api.throttle_headroom premium tenants at
        # their usage plan (500/s x max_multiplier 2, burst 1000): the old defaults equalled one.
        (
            {"api": {"throttle_rate": 1000}},
            ["breakwater.api.throttle_rate = 1000", "'premium' tier's usage plan", "= 4000/s"],
        ),
        (
            {"api": {"throttle_burst": 2000}},
            ["breakwater.api.throttle_burst = 2000", "'premium' tier's burst (1000) = 4000"],
        ),
        (
            {"api": {"throttle_headroom": 6}},
            ["breakwater.api.throttle_rate = 5000", "api.throttle_headroom (6)", "= 6000/s"],
        ),
        # A tenant's ordered backlog item: a write per message, one per batch, the refusals.
        (
            {"ordered": {"enabled": True, "batch_size": 1}, "tiers": {"premium": {"rate": 600}}},
            ["breakwater.tiers.premium.rate = 600", "1,220 writes/s (batch_size 1)", "1,000 write units/s"],
        ),
        # One tenant's events reach one shard with partition_key tenant: 1,000 records/s and 1 MiB/s.
        (
            {"streaming": {"event_rate_multiplier": 10}},
            ["breakwater.streaming.event_rate_multiplier = 10", "5000 records/s", "1,000 records/s"],
        ),
        (
            {"streaming": {"max_event_bytes": 64 * 1024}},
            ["breakwater.streaming.max_event_bytes = 65536", "1,048,576 B/s"],
        ),
        (
            {"streaming": {"partition_key": "tenant_and_key", "shard_count": 2, "event_rate_multiplier": 5}},
            ["breakwater.streaming.event_rate_multiplier = 5", "2 shards", "2,000 records/s"],
        ),
        # A tenant's leases are entries of its counters item, which DynamoDB caps at 400 KB.
        (
            {"tiers": {"premium": {"concurrency": 1001}}},
            ["breakwater.tiers.premium", "concurrency (1001) must be at most 1000"],
        ),
        # More live containers than 100 health items take at a partition's write units each.
        (
            {
                "queue_set": {"size": 60},
                "worker": {"max_concurrency": None, "provisioned_pollers": {"maximum_pollers": 2000}},
            },
            ["breakwater.worker.provisioned_pollers.maximum_pollers = 2000", "queue_set.size = 60"],
        ),
    ],
)
def test_invalid_context_names_key_and_value(override: dict[str, object], expected: list[str]) -> None:
    with pytest.raises(ConfigError) as error:
        build_app({"breakwater": override})
    for fragment in expected:
        assert fragment in str(error.value)


def test_context_overrides_merge_key_by_key() -> None:
    merged = merge_context(cdk_json_context(), {"breakwater": {"mode": "naive", "queue_set": {"size": 3}}})
    assert merged["breakwater"]["mode"] == "naive"
    assert merged["breakwater"]["queue_set"]["size"] == 3
    assert merged["breakwater"]["queue_set"]["shard_size"] == 2  # kept from cdk.json
    assert merged["@aws-cdk/aws-sqs:dlqRedriveAllowPolicy"] is True


def test_the_cli_entry_point_prints_the_error_and_exits_non_zero(tmp_path: Path) -> None:
    context = cdk_json_context()
    context["breakwater"] = merge_context(context["breakwater"], {"queue_set": {"shard_size": 99}})
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps(context), "CDK_OUTDIR": str(tmp_path)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "functions"), str(ROOT)])  # as pyproject's pytest paths
    result = subprocess.run(  # noqa: S603 - the CLI runs the app exactly like this
        [sys.executable, "app.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1
    assert "breakwater.queue_set" in result.stderr
    assert "shard_size (99)" in result.stderr


def test_a_large_batch_with_a_batching_window_synthesizes() -> None:
    """Every limit CDK enforces on the SQS mapping is in the config model: what passes it synthesizes."""
    app = build_app({"breakwater": {"worker": {"batch_size": 100, "batching_window_seconds": 1}}})
    app.synth()


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"directory": "no-such-dir"}, ["processor.directory = 'no-such-dir'", "is not a directory"]),
        ({"handler": "process"}, ["processor.handler = 'process'", "'module.function'"]),
        ({"handler": "orders.process"}, ["processor.handler = 'orders.process'", "no module 'orders'"]),
        ({"environment": {"AWS_REGION": "x"}}, ["processor.environment 'AWS_REGION'", "AWS_"]),
        ({"environment": {"bad name": "x"}}, ["processor.environment 'bad name'"]),
    ],
)
def test_an_invalid_processor_names_its_argument_and_value(
    arguments: dict[str, Any], expected: list[str]
) -> None:
    defaults: dict[str, Any] = {"directory": ROOT / "processor", "handler": "sample.process"}
    with pytest.raises(ConfigError) as error:
        Processor(**(defaults | arguments))
    for fragment in expected:
        assert fragment in str(error.value)


def test_a_processor_variable_may_not_replace_a_workers_setting() -> None:
    processor = Processor(
        directory=ROOT / "processor", handler="sample.process", environment={"STATE_TABLE_NAME": "x"}
    )
    with pytest.raises(ConfigError, match=r"\['STATE_TABLE_NAME'\] would replace the workers' own settings"):
        processor_environment(processor, {"STATE_TABLE_NAME": "breakwater-state"})
