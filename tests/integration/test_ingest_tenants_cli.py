"""bin/tenants against moto: the key it prints once is the key the authorizer accepts, and every
tenant's edge key sits in the usage plan its tier and overrides call for."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
from pathlib import Path

import boto3
import pytest

from tests.integration.apigateway import ApiGateway

CLI = Path(__file__).resolve().parents[2] / "bin" / "tenants_cli.py"
CEILING = 2.0


@pytest.fixture
def cli():
    loader = importlib.machinery.SourceFileLoader("bin_tenants", str(CLI))
    spec = importlib.util.spec_from_loader("bin_tenants", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture
def edge_plans(aws) -> dict[str, object]:
    """The stack's EdgeUsagePlans output: an API, its stage, one plan per tier (as the stack sets them)."""
    apigw = boto3.client("apigateway")
    api_id = apigw.create_rest_api(name="breakwater-api")["id"]
    tiers = {}
    for tier, rate, burst in (("standard", 5, 10), ("premium", 50, 100)):
        tiers[tier] = apigw.create_usage_plan(
            name=f"breakwater-tier-{tier}",
            apiStages=[{"apiId": api_id, "stage": "prod"}],
            throttle={"rateLimit": rate * CEILING, "burstLimit": burst},
        )["id"]
    return {"api": api_id, "stage": "prod", "ceiling": CEILING, "tiers": tiers}


def run(cli, capsys, tenants_table, edge_plans, *args):
    code = cli.main([*args, "--table", tenants_table, "--edge-plans", json.dumps(edge_plans)])
    out, err = capsys.readouterr()
    return code, out.strip(), err


def plan_of(edge_plans, tenant: str) -> dict | None:
    from breakwater.aws.usage_plans import EdgePlans, UsagePlans

    return UsagePlans(EdgePlans.from_output(json.dumps(edge_plans))).plan_of_tenant(tenant)


def test_add_rotate_disable_enable_list(cli, capsys, tenants_table, edge_plans, api: ApiGateway, clock):
    code, key, err = run(cli, capsys, tenants_table, edge_plans, "add", "acme", "--tier", "premium")
    assert code == 0 and key.startswith("acme.") and "once" in err
    assert api.request(key, {"type": "t"}).status == 202

    code, _, err = run(cli, capsys, tenants_table, edge_plans, "add", "acme")
    assert code == 1 and "already exists" in err

    code, new_key, _ = run(
        cli, capsys, tenants_table, edge_plans, "rotate", "acme", "--overlap-seconds", "600"
    )
    assert code == 0 and new_key != key
    clock.advance(6)
    assert api.request(new_key, {"type": "t"}).status == 202
    assert (
        api.request(key, {"type": "t"}).status == 202
    )  # the overlap uses wall time in the CLI: 600 s from now

    assert run(cli, capsys, tenants_table, edge_plans, "set-limits", "acme", "rate=3", "burst=4")[0] == 0
    assert run(cli, capsys, tenants_table, edge_plans, "disable", "acme")[0] == 0
    code, listing, _ = run(cli, capsys, tenants_table, edge_plans, "list")
    assert listing == "acme\tpremium\tdisabled rotating\tburst=4,rate=3"

    clock.advance(61)
    assert api.request(new_key, {"type": "t"}).status == 403
    assert run(cli, capsys, tenants_table, edge_plans, "enable", "acme")[0] == 0
    clock.advance(61)
    assert api.request(new_key, {"type": "t"}).status == 202


def test_a_tenant_is_enrolled_in_its_tiers_plan_and_overrides_get_a_plan_of_their_own(
    cli, capsys, tenants_table, edge_plans
):
    tiers = edge_plans["tiers"]
    assert run(cli, capsys, tenants_table, edge_plans, "add", "acme")[0] == 0
    assert run(cli, capsys, tenants_table, edge_plans, "add", "globex", "--tier", "premium")[0] == 0
    assert plan_of(edge_plans, "acme")["id"] == tiers["standard"]
    assert plan_of(edge_plans, "globex")["id"] == tiers["premium"]
    # Adding an existing tenant again changes nothing, its plan included.
    assert run(cli, capsys, tenants_table, edge_plans, "add", "globex", "--tier", "standard")[0] == 1
    assert plan_of(edge_plans, "globex")["id"] == tiers["premium"]

    # A rate override: a plan of its own, at the override's ceiling; the tier's burst stays.
    assert run(cli, capsys, tenants_table, edge_plans, "set-limits", "acme", "rate=3")[0] == 0
    own = plan_of(edge_plans, "acme")
    assert own["id"] not in tiers.values()
    assert own["throttle"] == {"rateLimit": 3 * CEILING, "burstLimit": 10}
    # Another override replaces that plan; a consumer-side override alone needs none.
    assert run(cli, capsys, tenants_table, edge_plans, "set-limits", "acme", "burst=4")[0] == 0
    replaced = plan_of(edge_plans, "acme")
    assert replaced["throttle"] == {"rateLimit": 3 * CEILING, "burstLimit": 4}
    assert run(cli, capsys, tenants_table, edge_plans, "set-limits", "acme", "rate=", "burst=")[0] == 0
    assert plan_of(edge_plans, "acme")["id"] == tiers["standard"]
    assert run(cli, capsys, tenants_table, edge_plans, "set-limits", "acme", "consumer_rate=9")[0] == 0
    assert plan_of(edge_plans, "acme")["id"] == tiers["standard"]
    names = [plan["name"] for plan in boto3.client("apigateway").get_usage_plans()["items"]]
    assert sorted(names) == ["breakwater-tier-premium", "breakwater-tier-standard"]  # no plan left behind


def test_enroll_repairs_tenants_that_have_no_key(
    cli, capsys, tenants_table, edge_plans, tenant_table_adapter
):
    # Tenants made before the stack had usage plans (or whose enrolment was interrupted).
    tenant_table_adapter.create("acme", "standard")
    tenant_table_adapter.create("globex", "premium")
    assert plan_of(edge_plans, "acme") is None
    code, _, err = run(cli, capsys, tenants_table, edge_plans, "enroll")
    assert code == 0 and "acme" in err and "globex" in err
    assert plan_of(edge_plans, "acme")["id"] == edge_plans["tiers"]["standard"]
    assert plan_of(edge_plans, "globex")["id"] == edge_plans["tiers"]["premium"]
    # Idempotent: once more changes nothing (one key per tenant, one plan per key).
    assert run(cli, capsys, tenants_table, edge_plans, "enroll", "acme")[0] == 0
    assert len(boto3.client("apigateway").get_api_keys()["items"]) == 2
    assert run(cli, capsys, tenants_table, edge_plans, "enroll", "nobody")[0] == 1


def test_errors_are_reported_not_raised(cli, capsys, tenants_table, edge_plans):
    assert run(cli, capsys, tenants_table, edge_plans, "rotate", "nobody")[0] == 1
    assert run(cli, capsys, tenants_table, edge_plans, "set-limits", "nobody", "rate=1")[0] == 1
    with pytest.raises(SystemExit, match=r"not in cdk\.json"):
        cli.main(["add", "acme", "--tier", "gold", "--table", tenants_table])
    with pytest.raises(SystemExit, match="must be a number"):
        cli.main(["set-limits", "acme", "rate=fast", "--table", tenants_table])
    # A tier the stack has no plan for: named, and no tenant is created without its edge key.
    plans = {**edge_plans, "tiers": {"standard": edge_plans["tiers"]["standard"]}}
    code, _, err = run(cli, capsys, tenants_table, plans, "add", "acme", "--tier", "premium")
    assert code == 1 and "tier 'premium' has no usage plan" in err
    assert run(cli, capsys, tenants_table, plans, "list")[1] == ""
    assert cli.main(["enroll", "--table", tenants_table, "--edge-plans", "not json"]) == 1
    assert "EdgeUsagePlans output is not valid" in capsys.readouterr().err


def test_overrides_need_no_plan_of_their_own_when_the_tiers_plan_throttles_nobody(
    cli, capsys, tenants_table, edge_plans
):
    # Naive mode (the demo's baseline): the tiers' plans exist, without a throttle.
    apigw = boto3.client("apigateway")
    naive = apigw.create_usage_plan(
        name="breakwater-tier-standard", apiStages=[{"apiId": edge_plans["api"], "stage": "prod"}]
    )["id"]
    plans = {**edge_plans, "tiers": {"standard": naive}}
    assert run(cli, capsys, tenants_table, plans, "add", "acme")[0] == 0
    assert run(cli, capsys, tenants_table, plans, "set-limits", "acme", "rate=3")[0] == 0
    assert plan_of(plans, "acme")["id"] == naive


def test_the_stage_names_the_stack_whose_outputs_it_reads(cli, capsys, tenants_table, edge_plans):
    """``--stage prod`` reads the outputs of the stack Breakwater-prod (app.py's stack of that stage)."""
    template = {
        "Resources": {"Marker": {"Type": "AWS::SQS::Queue"}},
        "Outputs": {
            "TenantsTableName": {"Value": tenants_table},
            "EdgeUsagePlans": {"Value": json.dumps(edge_plans)},
        },
    }
    boto3.client("cloudformation").create_stack(
        StackName="Breakwater-prod", TemplateBody=json.dumps(template)
    )
    assert cli.main(["--stage", "prod", "add", "acme"]) == 0
    assert cli.main(["list", "--stage", "prod"]) == 0
    assert "acme" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="no stack Breakwater-dev here"):
        cli.main(["--stage", "dev", "list"])
