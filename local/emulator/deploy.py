"""Create the synthesized stack in the embedded AWS through CloudFormation, as ``cdk deploy`` would.

What ``cdk bootstrap`` provides in a real account is provided here: the assets bucket
``cdk-hnb659fds-assets-<account>-<region>``, the bootstrap version parameter, and a stand-in for
the public Powertools layer (see :func:`publish_layer_stand_ins`). Nothing the template declares
is created by hand: the stack's resources come from ``CreateStack``; what moto skips is listed in
:attr:`Deployment.skipped`, never silently missing.

When DynamoDB has a moto process of its own (``EmbeddedAws.dynamodb``), the stack is created in each
process the same way, side by side, each from the same random seed (moto draws the generated names'
suffixes from it), and the DynamoDB process's tables must carry the names the main one gave them.
"""

from __future__ import annotations

import io
import re
import time
import zipfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from local.emulator import cfn_models
from local.emulator.assembly import CloudAssembly
from local.emulator.embedded_aws import ACCOUNT, REGION, EmbeddedAws

BOOTSTRAP_QUALIFIER = "hnb659fds"
BOOTSTRAP_VERSION = "27"
LAYER_ARN = re.compile(r":layer:(?P<name>[A-Za-z0-9_-]+):(?P<version>\d+)")
NAME_SEED = 20_261_122  # moto's random, seeded before CreateStack in every process: the same names


class DeployError(RuntimeError):
    pass


@dataclass
class Deployment:
    stack_name: str
    stack_id: str
    physical_ids: dict[str, str]  # logical id -> physical id, for every resource moto created
    outputs: dict[str, str]
    skipped: dict[str, list[str]] = field(
        default_factory=dict
    )  # resource type -> logical ids moto did not create
    layer_stand_ins: list[str] = field(default_factory=list)


def _substitute(text: str) -> str:
    return (
        text.replace("${AWS::AccountId}", ACCOUNT)
        .replace("${AWS::Region}", REGION)
        .replace("${AWS::Partition}", "aws")
    )


def _zip_directory(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, path.relative_to(directory).as_posix())
    return buffer.getvalue()


def bootstrap(aws: EmbeddedAws) -> str:
    """The assets bucket and version parameter ``cdk bootstrap`` would have created; returns the bucket."""
    bucket = f"cdk-{BOOTSTRAP_QUALIFIER}-assets-{ACCOUNT}-{REGION}"
    aws.client("s3").create_bucket(Bucket=bucket)
    aws.client("ssm").put_parameter(
        Name=f"/cdk-bootstrap/{BOOTSTRAP_QUALIFIER}/version",
        Value=BOOTSTRAP_VERSION,
        Type="String",
        Overwrite=True,
    )
    return bucket


def upload_assets(aws: EmbeddedAws, assembly: CloudAssembly) -> dict[str, str]:
    """Every file asset of the assembly at its destination (directories zipped, as the CDK CLI does)."""
    s3 = aws.client("s3")
    uploaded: dict[str, str] = {}
    for asset in assembly.assets.values():
        source = assembly.directory / asset["source"]["path"]
        packaging = asset["source"].get("packaging", "file")
        body = _zip_directory(source) if packaging == "zip" else source.read_bytes()
        for destination in asset["destinations"].values():
            bucket, key = _substitute(destination["bucketName"]), _substitute(destination["objectKey"])
            s3.put_object(Bucket=bucket, Key=key, Body=body)
            uploaded[key] = bucket
    return uploaded


def publish_layer_stand_ins(aws: EmbeddedAws, template: dict[str, Any]) -> list[str]:
    """Make the template's external layer ARNs resolvable in moto.

    The functions use the public Powertools layer (account 017000801446). moto's CreateFunction
    checks each layer ARN against its own layers, looking the layer up by *name and version only*,
    so ``PublishLayerVersion`` of a layer with the same name until its version number matches the
    pinned one makes the template deploy unmodified. The stand-in holds no code: in-process
    handlers import Powertools from this virtualenv, which pyproject.toml pins to the release the
    layer version carries.
    """
    lam = aws.client("lambda")
    wanted: dict[str, int] = {}
    for resource in template.get("Resources", {}).values():
        if resource.get("Type") != "AWS::Lambda::Function":
            continue
        for match in LAYER_ARN.finditer(repr(resource.get("Properties", {}).get("Layers", []))):
            wanted[match["name"]] = max(wanted.get(match["name"], 0), int(match["version"]))
    empty_zip = _zip_directory_bytes({"python/.breakwater-layer-stand-in": b""})
    published = []
    for name, version in sorted(wanted.items()):
        existing = lam.list_layer_versions(LayerName=name).get("LayerVersions", [])
        latest = max((v["Version"] for v in existing), default=0)
        while latest < version:
            latest = lam.publish_layer_version(
                LayerName=name,
                Description="local stand-in for the public layer; code comes from the virtualenv",
                Content={"ZipFile": empty_zip},
            )["Version"]
        published.append(f"{name}:{version}")
    return published


def _zip_directory_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def create_stack(aws: EmbeddedAws, assembly: CloudAssembly, *, timeout: float = 120.0) -> Deployment:
    """The stack in every moto process of ``aws`` (the main one, DynamoDB's); the main one's deployment."""
    cfn_models.register()
    targets = aws.processes()
    with ThreadPoolExecutor(max_workers=len(targets), thread_name_prefix="deploy") as pool:
        main, *others = list(pool.map(lambda target: _create_in(target, assembly, timeout), targets))
    tables = {
        logical_id: main.physical_ids.get(logical_id)
        for logical_id in assembly.resources("AWS::DynamoDB::Table")
    }
    for other in others:
        differ = {
            logical_id: (name, other.physical_ids.get(logical_id))
            for logical_id, name in tables.items()
            if other.physical_ids.get(logical_id) != name
        }
        if differ:
            raise DeployError(
                "the DynamoDB process's tables are not named as the main process's "
                f"(logical id: (main, DynamoDB process)): {differ}"
            )
    return main


def _create_in(aws: EmbeddedAws, assembly: CloudAssembly, timeout: float) -> Deployment:
    """Bootstrap, assets, layer stand-ins and ``CreateStack`` in one moto process."""
    bucket = bootstrap(aws)
    uploaded = upload_assets(aws, assembly)
    layers = publish_layer_stand_ins(aws, assembly.template)
    template_key = next((key for key in uploaded if key.endswith(".json")), None)
    cfn = aws.client("cloudformation")
    aws.seed_random(NAME_SEED)  # names drawn in CreateStack: the same in every process
    source: dict[str, str] = (
        {"TemplateURL": f"https://s3.{REGION}.amazonaws.com/{bucket}/{template_key}"}
        if template_key
        else {"TemplateBody": assembly.template_path.read_text(encoding="utf-8")}
    )
    stack_id = cfn.create_stack(
        StackName=assembly.stack_name,
        Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"],
        **source,
    )["StackId"]
    deadline = time.monotonic() + timeout
    while True:
        stack = cfn.describe_stacks(StackName=stack_id)["Stacks"][0]
        status = stack["StackStatus"]
        if status.endswith("_COMPLETE") or status.endswith("_FAILED"):
            break
        if time.monotonic() > deadline:
            raise DeployError(f"stack {assembly.stack_name} still {status} after {timeout:.0f}s")
        time.sleep(0.2)
    if status != "CREATE_COMPLETE":
        events = cfn.describe_stack_events(StackName=stack_id)["StackEvents"]
        reasons = [
            f"{e['LogicalResourceId']}: {e.get('ResourceStatusReason')}"
            for e in events
            if "FAILED" in e["ResourceStatus"]
        ]
        raise DeployError(f"stack {assembly.stack_name} ended {status}: {reasons}")
    physical: dict[str, str] = {}
    paginator = cfn.get_paginator("list_stack_resources")
    for page in paginator.paginate(StackName=stack_id):
        for summary in page["StackResourceSummaries"]:
            if summary.get("PhysicalResourceId"):
                physical[summary["LogicalResourceId"]] = summary["PhysicalResourceId"]
    skipped: dict[str, list[str]] = defaultdict(list)
    for logical_id, resource in assembly.template.get("Resources", {}).items():
        if logical_id not in physical:
            skipped[resource["Type"]].append(logical_id)
    outputs = {o["OutputKey"]: o.get("OutputValue", "") for o in stack.get("Outputs", [])}
    return Deployment(
        stack_name=assembly.stack_name,
        stack_id=stack_id,
        physical_ids=physical,
        outputs=outputs,
        skipped={kind: sorted(ids) for kind, ids in sorted(skipped.items())},
        layer_stand_ins=layers,
    )
