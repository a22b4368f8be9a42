"""Manage Breakwater tenants and their API keys (the tenants table; only key hashes are stored).

  bin/tenants add <tenant> [--tier standard]           create a tenant; prints its API key once
  bin/tenants enroll [<tenant> ...]                    (re)put tenants' keys in their usage plans
  bin/tenants rotate <tenant> [--overlap-seconds 3600]  new key; the old one works for the overlap
  bin/tenants disable <tenant> | enable <tenant>       403 for a disabled tenant's requests
  bin/tenants set-limits <tenant> rate=20 burst=40     override tier limits ("rate=" clears one)
  bin/tenants list                                     tenants, tiers, status, overrides

The table is --table NAME, or the TenantsTableName output of the stage's stack (--stage dev, the
stack Breakwater-dev; --stack NAME for another).
Each tenant also has an API Gateway API key in its tier's usage plan (the edge throttle, named by
the stack's EdgeUsagePlans output): `add` and `set-limits` keep it there; `enroll` repairs an
interrupted enrolment and enrols tenants created before the stack had usage plans. A tenant whose key
is in no plan gets 403 `not_enrolled`, so every tenant record must have its key enrolled.
AWS region and credentials come from the usual places (AWS_PROFILE, AWS_REGION, ...).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "functions"))

STACK_OUTPUT = "TenantsTableName"


def stack_output(stack: str, key: str) -> str | None:
    import boto3
    from botocore.exceptions import ClientError

    try:
        stacks = boto3.client("cloudformation").describe_stacks(StackName=stack)["Stacks"]
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "ValidationError":
            raise
        raise SystemExit(f"no stack {stack} here: deploy that stage, or pass --stage or --stack") from None
    for output in stacks[0].get("Outputs", []):
        if output["OutputKey"] == key:
            return str(output["OutputValue"])
    return None


def stack_name(args: argparse.Namespace) -> str:
    """``--stack``, else the example app's stack of ``--stage`` (app.py's ``stack_id``)."""
    return str(args.stack) if args.stack else f"Breakwater-{args.stage}"


def table_name(args: argparse.Namespace) -> str:
    if args.table:
        return str(args.table)
    stack = stack_name(args)
    name = stack_output(stack, STACK_OUTPUT)
    if name is None:
        raise SystemExit(f"stack {stack} has no {STACK_OUTPUT} output; pass --table")
    return name


def usage_plans(args: argparse.Namespace) -> Any:
    """The stack's usage plans (``breakwater.aws.usage_plans.UsagePlans``)."""
    from breakwater.aws.usage_plans import STACK_OUTPUT as PLANS_OUTPUT
    from breakwater.aws.usage_plans import EdgePlans, UsagePlans

    text = args.edge_plans or stack_output(stack_name(args), PLANS_OUTPUT)
    if text is None:
        raise SystemExit(f"stack {stack_name(args)} has no {PLANS_OUTPUT} output; deploy this version of it")
    return UsagePlans(EdgePlans.from_output(text))


def check_tier(tier: str) -> None:
    """Refuse a tier the blueprint's config (cdk.json next to this script) does not define."""
    config = Path(__file__).resolve().parent.parent / "cdk.json"
    if not config.exists():
        return
    tiers = json.loads(config.read_text()).get("context", {}).get("breakwater", {}).get("tiers", {})
    if tiers and tier not in tiers:
        raise SystemExit(f"tier {tier!r} is not in cdk.json; known tiers: {', '.join(sorted(tiers))}")


def parse_limits(pairs: list[str]) -> dict[str, float | None]:
    limits: dict[str, float | None] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"limit {pair!r} must be NAME=VALUE (or NAME= to clear)")
        try:
            limits[name] = float(value) if value else None
        except ValueError:
            raise SystemExit(f"limit {name} must be a number, got {value!r}") from None
    return limits


def _missing(tenant: str) -> Any:
    from breakwater.aws.tenants import TenantNotFoundError

    raise TenantNotFoundError(f"tenant {tenant!r} does not exist")


def show(item: dict[str, Any]) -> str:
    overrides = sorted((item.get("limits") or {}).items())
    limits = ",".join(f"{name}={float(value):g}" for name, value in overrides)
    rotating = " rotating" if item.get("previous_key_sha256") else ""
    return f"{item['tenant_id']}\t{item.get('tier', '')}\t{item.get('status', '')}{rotating}\t{limits or '-'}"


def main(argv: list[str] | None = None) -> int:
    from breakwater.auth import TenantStatus
    from breakwater.aws.tenants import TenantExistsError, TenantNotFoundError, TenantTable
    from breakwater.aws.usage_plans import EnrolmentError, add_tenant, enroll_record

    parser = argparse.ArgumentParser(prog="bin/tenants", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--table", help="tenants table name (default: the stack's TenantsTableName output)")
    parser.add_argument("--stage", default="dev", help="the stage (cdk.json breakwater_stages) to manage")
    parser.add_argument("--stack", help="stack to read the outputs from (default: Breakwater-<stage>)")
    parser.add_argument(
        "--edge-plans", help="the stack's EdgeUsagePlans output, as JSON (default: read from the --stack)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add", help="create a tenant and print its API key")
    add.add_argument("tenant")
    add.add_argument("--tier", default="standard")
    enroll = commands.add_parser(
        "enroll", help="put tenants' keys in their usage plans (all when none named)"
    )
    enroll.add_argument("tenants", nargs="*")
    rotate = commands.add_parser("rotate", help="issue a new key; the old one stays valid for the overlap")
    rotate.add_argument("tenant")
    rotate.add_argument("--overlap-seconds", type=float, default=3600.0)
    for name in ("disable", "enable"):
        commands.add_parser(name, help=f"{name} a tenant").add_argument("tenant")
    limits = commands.add_parser("set-limits", help="override tier limits: rate, burst, consumer_rate, ...")
    limits.add_argument("tenant")
    limits.add_argument("limits", nargs="+", metavar="NAME=VALUE")
    commands.add_parser("list", help="list tenants")
    # Options may come after the subcommand too (bin/tenants add acme --table T).
    for sub in (
        add,
        enroll,
        rotate,
        limits,
        *(commands.choices[name] for name in ("disable", "enable", "list")),
    ):
        sub.add_argument("--table", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        sub.add_argument("--stack", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        sub.add_argument("--stage", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        sub.add_argument("--edge-plans", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    table = TenantTable(table_name(args))
    try:
        if args.command == "add":
            check_tier(args.tier)
            key = add_tenant(table, usage_plans(args), args.tenant, args.tier)
            print(f"tenant {args.tenant} added (tier {args.tier}); its API key, once:", file=sys.stderr)
            print(key)
        elif args.command == "enroll":
            plans = usage_plans(args)
            items = (
                [table.get_item(tenant) or _missing(tenant) for tenant in args.tenants]
                if args.tenants
                else list(table.scan())
            )
            for item in items:
                plan = enroll_record(plans, item)
                print(f"tenant {item['tenant_id']}: in usage plan {plan}", file=sys.stderr)
        elif args.command == "rotate":
            key = table.rotate(args.tenant, args.overlap_seconds)
            print(
                f"tenant {args.tenant}: new API key below; the previous key stays valid for "
                f"{args.overlap_seconds:g} s. Shown only this once:",
                file=sys.stderr,
            )
            print(key)
        elif args.command in ("disable", "enable"):
            status = TenantStatus.DISABLED if args.command == "disable" else TenantStatus.ACTIVE
            table.set_status(args.tenant, status)
            print(f"tenant {args.tenant} is {status.value}", file=sys.stderr)
        elif args.command == "set-limits":
            table.set_limits(args.tenant, parse_limits(args.limits))
            item = table.get_item(args.tenant) or _missing(args.tenant)
            plan = enroll_record(usage_plans(args), item)
            print(f"tenant {args.tenant}: limits updated (usage plan {plan})", file=sys.stderr)
        else:
            for item in sorted(table.scan(), key=lambda item: str(item["tenant_id"])):
                print(show(item))
    except (TenantExistsError, TenantNotFoundError, EnrolmentError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
