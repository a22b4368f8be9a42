"""``processing``: the workers may write the processor's transactional effects to ``effect_tables`` and
do nothing else to those tables; ``guarantee`` reaches both workers."""

from __future__ import annotations

from typing import Any

from aws_cdk.assertions import Template

from app import DEFAULT_STAGE, build_app, stack_id
from breakwater_cdk.tables import EFFECT_ACTIONS
from tests.infrastructure.conftest import Synth


def _statements_on(template: dict[str, Any], table: str) -> dict[str, list[str]]:
    """Policy name -> the actions its statements allow on ``table`` (named by its ARN)."""
    found: dict[str, list[str]] = {}
    for name, resource in template["Resources"].items():
        if resource["Type"] != "AWS::IAM::Policy":
            continue
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]:
            resources = (
                statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
            )
            if any(f":table/{table}" in str(each) for each in resources):
                actions = (
                    statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
                )
                found.setdefault(name, []).extend(actions)
    return found


def test_the_workers_may_write_effects_to_the_named_tables_and_nothing_more() -> None:
    app = build_app(
        {"breakwater": {"processing": {"effect_tables": ["orders"]}, "ordered": {"enabled": True}}},
        stages=[DEFAULT_STAGE],
    )
    template = Template.from_stack(app.node.find_child(stack_id(DEFAULT_STAGE))).to_json()  # type: ignore[arg-type]

    granted = _statements_on(template, "orders")
    roles = {name.split("ServiceRole")[0] for name in granted}
    assert any("LiveWorker" in role for role in roles), roles
    assert any("SidelineWorker" in role for role in roles), roles
    assert any("FifoWorker" in role for role in roles), roles
    assert len(roles) == 3, roles  # ingest, the controller and the rest get nothing on it
    for actions in granted.values():
        assert sorted(actions) == sorted(EFFECT_ACTIONS)


def test_the_processing_guarantee_reaches_both_workers(synth: Synth) -> None:
    workers = [
        resource["Properties"]["Environment"]["Variables"]
        for resource in synth.of_type("AWS::Lambda::Function").values()
        if "WORKER_MODE" in resource["Properties"].get("Environment", {}).get("Variables", {})
    ]
    assert len(workers) == 2
    assert {env["PROCESSING_GUARANTEE"] for env in workers} == {synth.config.processing.guarantee}
