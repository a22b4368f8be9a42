"""Per-tenant views, shipped as resources: Contributor Insights rules and Logs Insights saved queries.

A metric per tenant would cost per tenant and per dimension value; these read the JSON lines the
functions already write instead. The workers write one ``tenant batch`` line per tenant per batch
(its first-attempt ages and outcomes, as scalar fields), the front door one ``throttled`` or
``rejected`` line per refused request (its ``tenant``, ``status`` and ``code``). Each rule ranks the
tenants by one of those fields; each saved query shows one tenant in detail (replace
:data:`TENANT_PLACEHOLDER` with its id). The dashboard graphs each rule and lists its top tenants
(``Monitoring.show_tenant_insights``).

Field names here are the handlers' log fields; tests/integration/test_tenant_log_fields.py checks
every one the rules and queries name against lines the worker and ingest really print.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_logs as logs
from constructs import Construct

from breakwater_cdk.config import BlueprintConfig

# The messages of the lines the views read (functions/breakwater/worker/batch.py, breakwater/api.py).
TENANT_BATCH = "tenant batch"
REFUSALS = ("throttled", "rejected")
# What an operator replaces in a saved query with the tenant's id.
TENANT_PLACEHOLDER = "<tenant>"


@dataclass(frozen=True)
class TenantRule:
    """One Contributor Insights rule, what its contributors' value means, and the Logs Insights query
    that lists the same top tenants by name (the dashboard's table beside the rule's graph)."""

    name: str
    title: str
    value: str  # what MaxContributorValue is, for the graph's label
    log_groups: tuple[logs.ILogGroup, ...]
    top_tenants_query: str
    resource: cloudwatch.CfnInsightRule


def _query(*lines: str) -> str:
    """Logs Insights commands, one per line, piped."""
    return "\n| ".join(lines)


def _in(values: Sequence[str]) -> str:
    return "[" + ", ".join(json.dumps(value) for value in values) + "]"


class TenantInsights(Construct):
    """The rules (``.rules``) and saved queries (``.queries``) over the functions' log groups.

    ``live_worker``: the live worker's log group, the only one whose first-attempt ages the latency
    goal is about; ``workers``: every worker log group (live and sideline); ``front_door``: the log
    groups of the functions behind the API (ingest, and ordered ingest and events when built).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: BlueprintConfig,
        live_worker: logs.ILogGroup,
        workers: Sequence[logs.ILogGroup],
        front_door: Sequence[logs.ILogGroup],
    ) -> None:
        super().__init__(scope, construct_id)
        self._prefix = config.service_name
        tenant_batch = f"message = {json.dumps(TENANT_BATCH)}"
        refused = f"message in {_in(REFUSALS)}"
        self.rules = [
            self._rule(
                "FirstAttemptAge",
                "tenants-first-attempt-age",
                title="Tenants by first-attempt age (live worker)",
                value="worst first-attempt age of one tenant in one batch (ms)",
                log_groups=[live_worker],
                keys=["tenant"],
                value_of="first_attempt_age_ms_max",
                filters=[_batch_filter(), {"Match": "$.first_attempts", "GreaterThan": 0}],
                top_tenants_query=_query(
                    f"filter {tenant_batch} and first_attempts > 0",
                    "stats max(first_attempt_age_ms_max) as worst_ms, sum(first_attempts) as messages "
                    "by tenant",
                    "sort worst_ms desc",
                    "limit 10",
                ),
            ),
            self._rule(
                "Refusals",
                "tenants-refusals",
                title="Tenants by refused requests (429 and 4xx)",
                value="refused requests of the top tenant and status",
                log_groups=front_door,
                keys=["tenant", "status"],
                value_of=None,
                filters=[{"Match": "$.message", "In": list(REFUSALS)}],
                top_tenants_query=_query(
                    f"filter {refused}",
                    "stats count() as refused by tenant, status",
                    "sort refused desc",
                    "limit 10",
                ),
            ),
            self._rule(
                "DeadLettered",
                "tenants-dead-lettered",
                title="Tenants by dead-lettered messages",
                value="dead-lettered messages of the top tenant",
                log_groups=workers,
                keys=["tenant"],
                value_of="dead_lettered",
                filters=[_batch_filter(), {"Match": "$.dead_lettered", "GreaterThan": 0}],
                top_tenants_query=_query(
                    f"filter {tenant_batch} and dead_lettered > 0",
                    "stats sum(dead_lettered) as dead_lettered_messages, sum(failed) as failures by tenant",
                    "sort dead_lettered_messages desc",
                    "limit 10",
                ),
            ),
            self._rule(
                "SetAside",
                "tenants-set-aside",
                title="Tenants by messages set aside (sidelined, spilled, deferred)",
                value="messages of the top tenant moved to backlog, spillover or surge",
                log_groups=workers,
                keys=["tenant"],
                value_of="set_aside",
                filters=[_batch_filter(), {"Match": "$.set_aside", "GreaterThan": 0}],
                top_tenants_query=_query(
                    f"filter {tenant_batch} and set_aside > 0",
                    "stats sum(set_aside) as moved, sum(sidelined) as too_old, sum(spilled) as over_rate, "
                    "sum(deferred) as over_concurrency by tenant",
                    "sort moved desc",
                    "limit 10",
                ),
            ),
        ]
        one_tenant = f"tenant = {json.dumps(TENANT_PLACEHOLDER)}"
        self.queries = [
            self._saved_query(
                "TenantFirstAttemptAges",
                "tenant first-attempt ages",
                [live_worker],
                # Each line holds the tenant's worst first-attempt age in one batch: percentiles over
                # batches lean pessimistic against the per-message p99 the alarm reads.
                _query(
                    f"filter {tenant_batch} and {one_tenant} and first_attempts > 0",
                    "stats sum(first_attempts) as messages, "
                    "pct(first_attempt_age_ms_max, 50) as p50_ms, "
                    "pct(first_attempt_age_ms_max, 90) as p90_ms, "
                    "pct(first_attempt_age_ms_max, 99) as p99_ms, "
                    "max(first_attempt_age_ms_max) as worst_ms by bin(5m)",
                ),
            ),
            self._saved_query(
                "TenantRefusals",
                "tenant refusals",
                front_door,
                _query(
                    f"filter {refused} and {one_tenant}",
                    "stats count() as refused by bin(5m), status, code",
                ),
            ),
            self._saved_query(
                "TenantRecentFailures",
                "tenant recent failures",
                workers,
                _query(
                    "fields @timestamp, message, envelope_id, exception_name, failed, dead_lettered",
                    f"filter {one_tenant} and (message like /^processing (failed|cancelled)/ or "
                    f"({tenant_batch} and (failed > 0 or dead_lettered > 0)))",
                    "sort @timestamp desc",
                    "limit 100",
                ),
            ),
        ]

    def _rule(
        self,
        construct_id: str,
        name: str,
        *,
        title: str,
        value: str,
        log_groups: Sequence[logs.ILogGroup],
        keys: list[str],
        value_of: str | None,
        filters: list[dict[str, Any]],
        top_tenants_query: str,
    ) -> TenantRule:
        """A rule over ``log_groups``' JSON lines: contributors are ``keys``; each matching line adds
        ``value_of`` (a Sum), or one (a Count) without it."""
        contribution: dict[str, Any] = {"Keys": [f"$.{key}" for key in keys], "Filters": filters}
        if value_of is not None:
            contribution["ValueOf"] = f"$.{value_of}"
        body = {
            "Schema": {"Name": "CloudWatchLogRule", "Version": 1},
            "LogGroupNames": [group.log_group_name for group in log_groups],
            "LogFormat": "JSON",
            "Contribution": contribution,
            "AggregateOn": "Sum" if value_of is not None else "Count",
        }
        rule_name = f"{self._prefix}-{name}"
        resource = cloudwatch.CfnInsightRule(
            self,
            construct_id,
            rule_name=rule_name,
            rule_state="ENABLED",
            rule_body=Stack.of(self).to_json_string(body),
        )
        return TenantRule(
            name=rule_name,
            title=title,
            value=value,
            log_groups=tuple(log_groups),
            top_tenants_query=top_tenants_query,
            resource=resource,
        )

    def _saved_query(
        self, construct_id: str, name: str, log_groups: Sequence[logs.ILogGroup], query: str
    ) -> logs.CfnQueryDefinition:
        """A saved query in the console's folder named after the service."""
        return logs.CfnQueryDefinition(
            self,
            construct_id,
            name=f"{self._prefix}/{name}",
            query_string=query,
            log_group_names=[group.log_group_name for group in log_groups],
        )


def _batch_filter() -> dict[str, Any]:
    return {"Match": "$.message", "In": [TENANT_BATCH]}
