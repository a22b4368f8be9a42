"""The user's processor: its code bundled for the workers, its variables, secrets and grants on them only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_ssm as ssm

from app import cdk_json_context, merge_context
from breakwater_cdk import Breakwater, Processor, load_config

pytestmark = pytest.mark.slow

WORKERS = ("LiveWorker", "SidelineWorker", "FifoWorker")


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    directory = tmp_path_factory.mktemp("orders-processor")
    (directory / "orders.py").write_text("def process(envelope, work):\n    return {}\n", encoding="utf-8")
    outdir = tmp_path_factory.mktemp("cdk-processor")
    context = merge_context(cdk_json_context(), {"breakwater": {"ordered": {"enabled": True}}})
    app = cdk.App(context=context, outdir=str(outdir))
    stack = cdk.Stack(app, "Orders")
    key = dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING)
    table = dynamodb.TableV2(stack, "CustomerOrders", partition_key=key)
    processor = Processor(
        directory=directory,
        handler="orders.process",
        environment={"DOWNSTREAM_URL": "https://inventory.example.com"},
        secrets={
            "API_TOKEN_PARAMETER": ssm.StringParameter.from_string_parameter_name(
                stack, "Token", "/orders/token"
            ),
            "DB_SECRET_ARN": secretsmanager.Secret.from_secret_name_v2(stack, "Db", "orders/db"),
        },
        grants=[table.grant_read_write_data],
    )
    Breakwater(stack, "Orders", config=load_config(context["breakwater"]), processor=processor)
    app.synth()
    return cdk.assertions.Template.from_stack(stack).to_json(), outdir


def _functions(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        logical_id: resource
        for logical_id, resource in template["Resources"].items()
        if resource["Type"] == "AWS::Lambda::Function"
    }


def _is_worker(logical_id: str) -> bool:
    return any(name in logical_id for name in WORKERS)


def _policy_of(template: dict[str, Any], function: dict[str, Any]) -> str:
    role = function["Properties"]["Role"]["Fn::GetAtt"][0]
    return json.dumps(
        [
            resource["Properties"]["PolicyDocument"]
            for resource in template["Resources"].values()
            if resource["Type"] == "AWS::IAM::Policy" and {"Ref": role} in resource["Properties"]["Roles"]
        ]
    )


def test_the_workers_run_the_processor_with_its_variables_and_secrets(
    synthesized: tuple[dict[str, Any], Path],
) -> None:
    template, _ = synthesized
    functions = _functions(template)
    assert sum(_is_worker(logical_id) for logical_id in functions) == 3
    for logical_id, function in functions.items():
        variables = function["Properties"]["Environment"]["Variables"]
        if _is_worker(logical_id):
            assert variables["PROCESSOR_HANDLER"] == "orders.process"
            assert variables["DOWNSTREAM_URL"] == "https://inventory.example.com"
            assert variables["API_TOKEN_PARAMETER"] == "/orders/token"
            assert "orders/db" in json.dumps(variables["DB_SECRET_ARN"])
        else:
            assert "PROCESSOR_HANDLER" not in variables and "DOWNSTREAM_URL" not in variables, logical_id


def test_the_workers_and_only_they_get_the_processors_grants(
    synthesized: tuple[dict[str, Any], Path],
) -> None:
    template, _ = synthesized
    for logical_id, function in _functions(template).items():
        policy = _policy_of(template, function)
        granted = ["CustomerOrders", "dynamodb:GetItem", "ssm:GetParameter", "secretsmanager:GetSecretValue"]
        if _is_worker(logical_id):
            for fragment in granted:  # reads included, not only writes
                assert fragment in policy, (logical_id, fragment)
        else:
            assert "CustomerOrders" not in policy and "orders/token" not in policy, logical_id


def test_the_workers_asset_holds_the_processor_and_their_handlers_only(
    synthesized: tuple[dict[str, Any], Path],
) -> None:
    template, outdir = synthesized
    for logical_id, function in _functions(template).items():
        code = outdir / f"asset.{function['Properties']['Code']['S3Key'].removesuffix('.zip')}"
        if _is_worker(logical_id):
            assert (code / "orders.py").is_file() and (code / "worker" / "handler.py").is_file()
            assert (code / "fifo_worker" / "handler.py").is_file()
            assert not (code / "breakwater").exists()  # the runtime library is the layer
        else:
            assert not (code / "orders.py").exists(), logical_id
