"""ArchiveAndReplay composed into the stack as the stack would: the properties that matter, and cdk-nag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Match, Template

from app import PROCESSOR, cdk_json_context, merge_context
from breakwater_cdk.config import load_config
from breakwater_cdk.construct import Breakwater
from breakwater_cdk.nag import apply_nag_packs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def synth(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    outdir = tmp_path_factory.mktemp("cdk-archive")
    overrides = {
        "breakwater": {"archive": {"replay_schedule": "cron(0 3 * * ? *)", "expire_after_days": 120}}
    }
    app = cdk.App(context=merge_context(cdk_json_context(), overrides), outdir=str(outdir))
    config = load_config(app.node.try_get_context("breakwater"))
    stack = cdk.Stack(app, "Archive")
    breakwater = Breakwater(
        stack, "Breakwater", config=config, processor=PROCESSOR
    )  # composes ArchiveAndReplay as 'Archive'
    apply_nag_packs(app)
    assembly = app.synth()  # raises on any unacknowledged cdk-nag error
    return {"template": Template.from_stack(stack), "outdir": Path(assembly.directory), "stack": breakwater}


def _one(template: Template, resource_type: str) -> dict[str, Any]:
    (resource,) = template.find_resources(resource_type).values()
    return resource["Properties"]


def test_archive_bucket_is_encrypted_versioned_logged_and_expires(synth: dict[str, Any]) -> None:
    template: Template = synth["template"]
    template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "BucketEncryption": {
                "ServerSideEncryptionConfiguration": [
                    Match.object_like(
                        {"ServerSideEncryptionByDefault": Match.object_like({"SSEAlgorithm": "aws:kms"})}
                    )
                ]
            },
            "VersioningConfiguration": {"Status": "Enabled"},
            "LoggingConfiguration": Match.object_like({"LogFilePrefix": "archive-bucket/"}),
            "LifecycleConfiguration": {
                "Rules": [
                    Match.object_like(
                        {"ExpirationInDays": 120, "NoncurrentVersionExpiration": {"NoncurrentDays": 7}}
                    )
                ]
            },
            "PublicAccessBlockConfiguration": Match.object_like({"BlockPublicAcls": True}),
        },
    )
    policies = json.dumps(template.find_resources("AWS::S3::BucketPolicy"))
    assert '"aws:SecureTransport": "false"' in policies


def test_replay_job_is_glue_5_with_security_configuration_and_bookmarks(synth: dict[str, Any]) -> None:
    job = _one(synth["template"], "AWS::Glue::Job")
    assert job["GlueVersion"] == "5.0" and job["Command"]["Name"] == "glueetl"
    assert job["SecurityConfiguration"]
    assert job["MaxRetries"] == 0 and job["ExecutionProperty"]["MaxConcurrentRuns"] == 1
    arguments = job["DefaultArguments"]
    assert arguments["--job-bookmark-option"] == "job-bookmark-enable"
    assert "--extra-py-files" in arguments and "--queue_urls" in arguments and "--target_rate" in arguments
    security = _one(synth["template"], "AWS::Glue::SecurityConfiguration")["EncryptionConfiguration"]
    assert security["CloudWatchEncryption"]["CloudWatchEncryptionMode"] == "SSE-KMS"
    assert security["JobBookmarksEncryption"]["JobBookmarksEncryptionMode"] == "CSE-KMS"


def test_runtime_library_zip_holds_both_packages(synth: dict[str, Any]) -> None:
    job = _one(synth["template"], "AWS::Glue::Job")
    key = job["DefaultArguments"]["--extra-py-files"]["Fn::Join"][1][-1].lstrip("/")
    staged = synth["outdir"] / f"asset.{key.removesuffix('.zip')}"
    names = {path.relative_to(staged).as_posix() for path in staged.rglob("*.py")}
    assert {"breakwater/routing.py", "glue_jobs/replay_transforms.py", "glue_jobs/replay_save.py"} <= names
    assert not any("__pycache__" in name for name in names)


def test_triggers_on_demand_and_scheduled(synth: dict[str, Any]) -> None:
    triggers = synth["template"].find_resources("AWS::Glue::Trigger")
    kinds = sorted(trigger["Properties"]["Type"] for trigger in triggers.values())
    assert kinds == ["ON_DEMAND", "SCHEDULED"]


def test_archiver_environment_and_least_privilege(synth: dict[str, Any]) -> None:
    template: Template = synth["template"]
    functions = template.find_resources(
        "AWS::Lambda::Function", {"Properties": {"Handler": "archiver/handler.handler"}}
    )
    (archiver,) = functions.values()
    variables = archiver["Properties"]["Environment"]["Variables"]
    assert {
        "ARCHIVE_BUCKET_NAME",
        "ARCHIVE_PREFIX",
        "SOURCE_QUEUE_URLS",
        "RECEIVE_VISIBILITY_SECONDS",
        "STATE_TABLE_NAME",
    } <= set(variables)
    # Its only DynamoDB right: ADD to the tenants' counters items (what it archived leaves their backlog).
    statements = [
        statement
        for policy in template.find_resources("AWS::IAM::Policy").values()
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]
    ]
    counters = [
        statement
        for statement in statements
        if statement.get("Condition", {}).get("ForAllValues:StringLike", {}).get("dynamodb:LeadingKeys")
        == ["tenant#*"]
    ]
    assert [statement["Action"] for statement in counters] == ["dynamodb:UpdateItem"]
    policies = json.dumps(template.find_resources("AWS::IAM::Policy"))
    assert '"s3:*"' not in policies and '"sqs:*"' not in policies and '"glue:*"' not in policies
    # The replay is started by an operator (bin/replay) or the optional schedule: no role may start it.
    assert "glue:StartJobRun" not in policies


def test_controller_may_start_the_archiver_and_knows_its_budget(synth: dict[str, Any]) -> None:
    template: Template = synth["template"]
    stack: Any = synth["stack"]
    of = cdk.Stack.of(stack)
    controller_id = of.resolve(of.get_logical_id(stack.control.controller.function.node.default_child))
    archiver_id = of.resolve(of.get_logical_id(stack.archive.archiver.function.node.default_child))
    variables = template.to_json()["Resources"][controller_id]["Properties"]["Environment"]["Variables"]
    assert variables["ARCHIVER_FUNCTION_NAME"] == {"Ref": archiver_id}
    assert variables["SIDELINE_QUEUE_ROLES"] == "spillover,backlog"
    config = stack.config.sideline
    assert variables["ARCHIVE_AGE_SECONDS"] == str(config.archive_age_seconds)
    assert variables["ARCHIVE_DEPTH"] == str(config.archive_depth)
    role_id = of.resolve(of.get_logical_id(stack.control.controller.role.node.default_child))
    invokers = []
    for policy in template.find_resources("AWS::IAM::Policy").values():
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if statement["Action"] == "lambda:InvokeFunction" and archiver_id in json.dumps(
                statement["Resource"]
            ):
                invokers.extend(role["Ref"] for role in policy["Properties"]["Roles"])
    assert invokers == [role_id]  # only the controller may start the archiver
