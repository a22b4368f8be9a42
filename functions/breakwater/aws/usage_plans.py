"""The edge throttle: each tenant's API Gateway API key, in its tier's usage plan.

The REST API takes its API keys from the authorizer (``ApiKeySourceType.AUTHORIZER``): the
authorizer names the tenant's key (``breakwater.auth.usage_identifier_key``), and the key's usage
plan throttles the tenant before any Lambda runs, so a tenant's excess costs neither an ingest
invocation nor a shared-bucket read. The stack declares one plan per tier at the tier's ceiling
(``rate`` x ``backpressure.max_multiplier``, ``burst``): the edge never refuses what ingest's own
fairness gate (the exact, backpressure-scaled limit) would admit. A tenant whose ``rate`` or
``burst`` is overridden gets a plan of its own at its own ceiling.

Onboarding (``bin/tenants``, and the embedded default's demo tenants) calls :meth:`UsagePlans.enroll`;
it is idempotent, so running it again repairs a tenant whose enrolment was interrupted.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from breakwater.auth import usage_identifier_key, validate_tenant_id
from breakwater.aws import clients
from breakwater.aws.tenants import TenantExistsError, TenantTable

if TYPE_CHECKING:
    from mypy_boto3_apigateway import APIGatewayClient

STACK_OUTPUT = "EdgeUsagePlans"
"""The stack output naming the API, its stage, the tiers' plans and the ceiling (``EdgePlans``)."""


class EnrolmentError(RuntimeError):
    """A tenant cannot be put in a usage plan (unknown tier, a stack without the edge plans)."""


@dataclass(frozen=True)
class EdgePlans:
    rest_api_id: str
    stage: str
    ceiling: float  # backpressure.max_multiplier: a plan's rate is the tier's rate times this
    tiers: Mapping[str, str]  # tier -> usage plan id

    @classmethod
    def from_output(cls, text: str) -> EdgePlans:
        """The ``EdgeUsagePlans`` output (JSON) of the stack."""
        try:
            document = json.loads(text)
            return cls(
                rest_api_id=str(document["api"]),
                stage=str(document["stage"]),
                ceiling=float(document["ceiling"]),
                tiers={str(tier): str(plan) for tier, plan in dict(document["tiers"]).items()},
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise EnrolmentError(f"the stack's {STACK_OUTPUT} output is not valid: {text!r} ({exc})") from exc

    def plan_of(self, tier: str) -> str:
        try:
            return self.tiers[tier]
        except KeyError:
            raise EnrolmentError(
                f"tier {tier!r} has no usage plan in the stack; known tiers: {', '.join(sorted(self.tiers))}"
            ) from None


class UsagePlans:
    """Enrols tenants' API keys in the stack's usage plans (API Gateway's API, through boto3)."""

    def __init__(self, plans: EdgePlans, *, client: APIGatewayClient | None = None) -> None:
        self.plans = plans
        self._client: APIGatewayClient = client or clients.client("apigateway")

    def key_name(self, tenant_id: str) -> str:
        return f"breakwater-{self.plans.rest_api_id}-{validate_tenant_id(tenant_id)}"

    def own_plan_name(self, tenant_id: str) -> str:
        return f"breakwater-{self.plans.rest_api_id}-tenant-{validate_tenant_id(tenant_id)}"

    def enroll(self, tenant_id: str, tier: str, limits: Mapping[str, float] | None = None) -> str:
        """Create (or find) the tenant's key and put it in the one plan its limits call for; the plan's id.

        ``limits`` are the tenant's overrides (``TenantRecord.limits``): with a ``rate`` or ``burst``
        among them the tenant gets a plan of its own, else its tier's plan. Idempotent.
        """
        target_tier_plan = self.plans.plan_of(tier)
        key_id = self._key_id(tenant_id)
        own_name = self.own_plan_name(tenant_id)
        own = [plan for plan in self._stage_plans() if plan.get("name") == own_name]
        target = target_tier_plan
        overrides = {
            name: float(value) for name, value in (limits or {}).items() if name in ("rate", "burst")
        }
        throttle = self._throttle(target_tier_plan, overrides) if overrides else None
        if throttle is not None:
            same = [plan for plan in own if _throttle_of(plan) == throttle]
            target = same[0]["id"] if same else self._create_own_plan(own_name, throttle)
        current = [plan["id"] for plan in self._stage_plans(key_id=key_id)]
        # A key is in at most one plan of a stage: leave the old plan before joining the new one.
        for plan_id in current:
            if plan_id != target:
                self._client.delete_usage_plan_key(usagePlanId=plan_id, keyId=key_id)
        if target not in current:
            self._client.create_usage_plan_key(usagePlanId=target, keyId=key_id, keyType="API_KEY")
        for plan in own:
            if plan["id"] != target:
                self._delete_plan(str(plan["id"]))
        return target

    def plan_of_tenant(self, tenant_id: str) -> dict[str, Any] | None:
        """The usage plan the tenant's key is in on this API's stage (None: not enrolled)."""
        key_id = self._find_key(tenant_id)
        if key_id is None:
            return None
        plans = list(self._stage_plans(key_id=key_id))
        return plans[0] if plans else None

    # -- internals ---------------------------------------------------------------------------------

    def _throttle(self, tier_plan_id: str, overrides: Mapping[str, float]) -> dict[str, float] | None:
        """The throttle of a tenant's own plan; None when its tier's plan throttles nobody (naive mode)."""
        tier_plan = dict(self._client.get_usage_plan(usagePlanId=tier_plan_id))
        if not tier_plan.get("throttle"):
            return None
        tier_throttle = _throttle_of(tier_plan)
        rate = overrides.get("rate")
        burst = overrides.get("burst")
        return {
            "rateLimit": rate * self.plans.ceiling if rate is not None else tier_throttle["rateLimit"],
            "burstLimit": float(int(burst)) if burst is not None else tier_throttle["burstLimit"],
        }

    def _create_own_plan(self, name: str, throttle: Mapping[str, float]) -> str:
        created = self._client.create_usage_plan(
            name=name,
            description="a tenant's own edge throttle: its rate/burst overrides at the ceiling",
            apiStages=[{"apiId": self.plans.rest_api_id, "stage": self.plans.stage}],
            throttle={"rateLimit": throttle["rateLimit"], "burstLimit": int(throttle["burstLimit"])},
        )
        return str(created["id"])

    def _delete_plan(self, plan_id: str) -> None:
        """A tenant's own plan, once its key has left: API Gateway deletes a plan only without stages."""
        stage = f"{self.plans.rest_api_id}:{self.plans.stage}"
        self._client.update_usage_plan(
            usagePlanId=plan_id, patchOperations=[{"op": "remove", "path": "/apiStages", "value": stage}]
        )
        self._client.delete_usage_plan(usagePlanId=plan_id)

    def _find_key(self, tenant_id: str) -> str | None:
        value = usage_identifier_key(self.plans.rest_api_id, tenant_id)
        for key in _pages(
            self._client, "get_api_keys", "items", nameQuery=self.key_name(tenant_id), includeValues=True
        ):
            if key.get("value") == value:
                return str(key["id"])
        return None

    def _key_id(self, tenant_id: str) -> str:
        found = self._find_key(tenant_id)
        if found is not None:
            return found
        created = self._client.create_api_key(
            name=self.key_name(tenant_id),
            description=f"tenant {tenant_id}: its usage plan is its edge throttle (clients never send it)",
            enabled=True,
            value=usage_identifier_key(self.plans.rest_api_id, tenant_id),
        )
        return str(created["id"])

    def _stage_plans(self, key_id: str | None = None) -> Iterator[dict[str, Any]]:
        """The usage plans (of the key, if given) that cover this API's stage."""
        kwargs: dict[str, Any] = {"keyId": key_id} if key_id else {}
        for plan in _pages(self._client, "get_usage_plans", "items", **kwargs):
            stages = plan.get("apiStages") or []
            if any(
                s.get("apiId") == self.plans.rest_api_id and s.get("stage") == self.plans.stage
                for s in stages
            ):
                yield plan


def add_tenant(table: TenantTable, plans: UsagePlans, tenant_id: str, tier: str) -> str:
    """Onboard a tenant (``bin/tenants add``, the demo's tenants): its API key, shown once.

    An existing tenant is refused before its plan is touched; the edge key is enrolled before the
    record is written, so a tenant whose record exists is never left without its usage plan.
    """
    if table.get_item(tenant_id) is not None:
        raise TenantExistsError(f"tenant {tenant_id!r} already exists")
    plans.enroll(tenant_id, tier)
    return table.create(tenant_id, tier)


def enroll_record(plans: UsagePlans, item: Mapping[str, Any]) -> str:
    """Put a tenant in the plan its tenants-table item (tier, overrides) calls for; the plan's id."""
    return plans.enroll(str(item["tenant_id"]), str(item["tier"]), item.get("limits") or {})


def _throttle_of(plan: Mapping[str, Any]) -> dict[str, float]:
    throttle = plan.get("throttle") or {}
    return {
        "rateLimit": float(throttle.get("rateLimit", 0)),
        "burstLimit": float(throttle.get("burstLimit", 0)),
    }


def _pages(client: Any, operation: str, items: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
    for page in client.get_paginator(operation).paginate(**kwargs):
        yield from page.get(items, [])
