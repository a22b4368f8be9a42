"""Synthesize the app once per configuration (synth takes tens of seconds) and share the result."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import Stack
from aws_cdk.assertions import Template

from app import DEFAULT_STAGE, build_app, stack_id
from breakwater_cdk.config import BlueprintConfig
from breakwater_cdk.construct import Breakwater


@dataclass(frozen=True)
class Synth:
    stack: Stack
    breakwater: Breakwater
    config: BlueprintConfig
    template: Template
    report: dict[str, Any]

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        resources: dict[str, dict[str, Any]] = self.template.to_json()["Resources"]
        return resources

    def of_type(self, resource_type: str) -> dict[str, dict[str, Any]]:
        return {key: value for key, value in self.resources.items() if value["Type"] == resource_type}

    def logical_id(self, construct: Any) -> str:
        """The logical id of an L2 construct's CloudFormation resource."""
        return str(self.stack.resolve(Stack.of(construct).get_logical_id(construct.node.default_child)))


def synthesize(outdir: Path, context: dict[str, Any] | None = None) -> Synth:
    app = build_app(context, outdir=str(outdir), stages=[DEFAULT_STAGE])
    assembly = app.synth()
    stack = app.node.find_child(stack_id(DEFAULT_STAGE))
    assert isinstance(stack, Stack)
    breakwater = stack.node.find_child("Breakwater")
    assert isinstance(breakwater, Breakwater)
    report = json.loads((Path(assembly.directory) / "validation-report.json").read_text())
    return Synth(
        stack=stack,
        breakwater=breakwater,
        config=breakwater.config,
        template=Template.from_stack(stack),
        report=report,
    )


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The configuration of cdk.json, as `make synth` builds it."""
    return synthesize(tmp_path_factory.mktemp("cdk-default"))


@pytest.fixture(scope="session")
def naive_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """The naive baseline the demo compares against, selected through the same context mechanism."""
    return synthesize(tmp_path_factory.mktemp("cdk-naive"), {"breakwater": {"mode": "naive"}})


@pytest.fixture(scope="session")
def ordered_synth(tmp_path_factory: pytest.TempPathFactory) -> Synth:
    """cdk.json's configuration with the ordered workload (SQS FIFO, POST /v1/ordered) turned on."""
    return synthesize(tmp_path_factory.mktemp("cdk-ordered"), {"breakwater": {"ordered": {"enabled": True}}})
