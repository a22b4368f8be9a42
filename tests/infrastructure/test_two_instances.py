"""Two ``Breakwater`` constructs in one stack, and two stages of the example app, never collide."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from app import PROCESSOR, build_app, cdk_json_context, merge_context, stack_id
from breakwater_cdk import Breakwater, load_config
from breakwater_cdk.nag import apply_nag_packs

pytestmark = pytest.mark.slow

# The properties that name a resource in the account and region (a second resource of the same type
# and name fails to create), by resource type.
ACCOUNT_NAMES = {
    "AWS::SQS::Queue": "QueueName",
    "AWS::Kinesis::Stream": "Name",
    "AWS::ApiGateway::RestApi": "Name",
    "AWS::ApiGateway::UsagePlan": "UsagePlanName",
    "AWS::CloudWatch::Dashboard": "DashboardName",
    "AWS::CloudWatch::InsightRule": "RuleName",
    "AWS::CloudWatch::Alarm": "AlarmName",
    "AWS::Logs::QueryDefinition": "Name",
    "AWS::Logs::LogGroup": "LogGroupName",
    "AWS::DynamoDB::Table": "TableName",
    "AWS::S3::Bucket": "BucketName",
    "AWS::Glue::Job": "Name",
    "AWS::Glue::Trigger": "Name",
    "AWS::Lambda::Function": "FunctionName",
    "AWS::Lambda::LayerVersion": "LayerName",
    "AWS::Events::Rule": "Name",
    "AWS::SSM::Parameter": "Name",
    "AWS::SNS::Topic": "TopicName",
    "AWS::IAM::Role": "RoleName",
}


def names(templates: list[dict[str, Any]]) -> Counter[tuple[str, str]]:
    """Every literal account-wide name the templates give (tokens resolve per resource: unique)."""
    found: Counter[tuple[str, str]] = Counter()
    for template in templates:
        for resource in template["Resources"].values():
            key = ACCOUNT_NAMES.get(resource["Type"])
            value = resource.get("Properties", {}).get(key) if key else None
            if isinstance(value, str):
                found[(resource["Type"], value)] += 1
    return found


def test_two_instances_in_one_stack_synthesize_without_a_shared_name(tmp_path: Path) -> None:
    context = merge_context(cdk_json_context(), {"breakwater": {"ordered": {"enabled": True}}})
    app = cdk.App(context=context, outdir=str(tmp_path))
    stack = cdk.Stack(app, "TwoServices")
    config = load_config(context["breakwater"])
    orders = Breakwater(stack, "Orders", config=config, processor=PROCESSOR)
    billing = Breakwater(stack, "Billing", config=config, processor=PROCESSOR)
    apply_nag_packs(app)
    app.synth()  # raises on a duplicate construct id or an unacknowledged cdk-nag error

    template = Template.from_stack(stack).to_json()
    assert orders.instance_name != billing.instance_name
    assert orders.instance_name.startswith(f"{config.service_name}-")
    shared = {name: count for name, count in names([template]).items() if count > 1}
    assert not shared, shared
    named = names([template])
    assert ("AWS::SQS::Queue", f"{orders.instance_name}-live-0") in named
    assert ("AWS::SQS::Queue", f"{billing.instance_name}-live-0") in named
    # Each instance's outputs are its own, under the construct's id.
    outputs = template["Outputs"]
    assert "OrdersApiUrl" in outputs and "BillingApiUrl" in outputs
    assert "OrdersTenantsTableName" in outputs and "BillingTenantsTableName" in outputs


def test_two_stages_of_the_example_app_share_no_name(tmp_path: Path) -> None:
    app = build_app(
        {"breakwater_stages": {"dev": {}, "prod": {"functions": {"log_retention_days": 365}}}},
        outdir=str(tmp_path),
    )
    assembly = app.synth()
    templates = [assembly.get_stack_by_name(stack_id(stage)).template for stage in ("dev", "prod")]
    shared = {name: count for name, count in names(templates).items() if count > 1}
    assert not shared, shared
