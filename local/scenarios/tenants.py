"""Tenants added to the emulated stack as an operator adds them."""

from __future__ import annotations

from local.emulator.runtime import LocalRuntime


def create_tenants(runtime: LocalRuntime, tenant_ids: list[str], tier: str = "standard") -> dict[str, str]:
    """Demo tenants, added as an operator adds them (``bin/tenants add``: ``usage_plans.add_tenant``)."""
    from breakwater.aws.tenants import TenantTable
    from breakwater.aws.usage_plans import STACK_OUTPUT, EdgePlans, UsagePlans, add_tenant

    table = TenantTable(
        runtime.output("TenantsTableName"), client=runtime.aws.client("dynamodb", counted=False)
    )
    plans = UsagePlans(
        EdgePlans.from_output(runtime.output(STACK_OUTPUT)),
        client=runtime.aws.client("apigateway", counted=False),
    )
    return {tenant: add_tenant(table, plans, tenant, tier) for tenant in tenant_ids}
