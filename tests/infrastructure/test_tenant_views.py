"""The per-tenant views shipped as resources: Contributor Insights rules, saved Logs Insights queries
and their dashboard widgets, over the log groups of the functions whose lines they read."""

from __future__ import annotations

import json
import re
from typing import Any

from breakwater_cdk.functions import BreakwaterFunction
from breakwater_cdk.insights import TENANT_PLACEHOLDER
from tests.infrastructure.conftest import Synth


def resolve(value: Any) -> str:
    """A template string with its references written out: ``<Ref:LogicalId>``, ``<GetAtt:Id.Attr>``."""
    if isinstance(value, str):
        return value
    if "Ref" in value:
        return f"<Ref:{value['Ref']}>"
    if "Fn::GetAtt" in value:
        return "<GetAtt:{}.{}>".format(*value["Fn::GetAtt"])
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return str(separator).join(resolve(part) for part in parts)
    raise AssertionError(f"unexpected intrinsic {value}")


def ref(synth: Synth, function: BreakwaterFunction) -> str:
    """How a function's log group name appears in a resolved template string."""
    return f"<Ref:{synth.logical_id(function.log_group)}>"


def rule_bodies(synth: Synth) -> dict[str, dict[str, Any]]:
    """Every insight rule's parsed body, by rule name."""
    bodies = {}
    for rule in synth.of_type("AWS::CloudWatch::InsightRule").values():
        props = rule["Properties"]
        assert props["RuleState"] == "ENABLED"
        bodies[props["RuleName"]] = json.loads(resolve(props["RuleBody"]))
    return bodies


def queries(synth: Synth) -> dict[str, dict[str, Any]]:
    return {
        q["Properties"]["Name"]: q["Properties"] for q in synth.of_type("AWS::Logs::QueryDefinition").values()
    }


def dashboard(synth: Synth) -> dict[str, Any]:
    (board,) = synth.of_type("AWS::CloudWatch::Dashboard").values()
    body: dict[str, Any] = json.loads(resolve(board["Properties"]["DashboardBody"]))
    return body


def workers(synth: Synth) -> list[BreakwaterFunction]:
    return [synth.breakwater.consumers.live_worker, synth.breakwater.consumers.sideline_worker]


# --- per-tenant views ----------------------------------------------------------------------------------


def test_insight_rules_rank_tenants_by_the_fields_their_log_groups_write(synth: Synth) -> None:
    bodies = rule_bodies(synth)
    prefix = synth.config.service_name
    stack = synth.breakwater
    assert synth.breakwater.streaming is not None  # on in cdk.json: its events route refuses per tenant too
    expected = {  # log groups, keys, the value summed (None: lines counted), the field a line must have > 0
        f"{prefix}-tenants-first-attempt-age": (
            [ref(synth, stack.consumers.live_worker)],
            ["$.tenant"],
            "$.first_attempt_age_ms_max",
            "$.first_attempts",
        ),
        f"{prefix}-tenants-refusals": (
            [ref(synth, stack.ingest), ref(synth, stack.streaming.events)],
            ["$.tenant", "$.status"],
            None,
            None,
        ),
        f"{prefix}-tenants-dead-lettered": (
            [ref(synth, worker) for worker in workers(synth)],
            ["$.tenant"],
            "$.dead_lettered",
            "$.dead_lettered",
        ),
        f"{prefix}-tenants-set-aside": (
            [ref(synth, worker) for worker in workers(synth)],
            ["$.tenant"],
            "$.set_aside",
            "$.set_aside",
        ),
    }
    assert set(bodies) == set(expected)
    for name, (log_groups, keys, value_of, positive) in expected.items():
        body = bodies[name]
        assert body["Schema"] == {"Name": "CloudWatchLogRule", "Version": 1}
        assert body["LogFormat"] == "JSON"
        assert body["LogGroupNames"] == log_groups, name
        contribution = body["Contribution"]
        assert contribution["Keys"] == keys, name
        assert contribution.get("ValueOf") == value_of, name
        assert body["AggregateOn"] == ("Sum" if value_of else "Count")
        message_filter, *rest = contribution["Filters"]
        assert message_filter["Match"] == "$.message"
        if value_of:  # the worker's per-tenant lines that add something to the ranked field
            assert message_filter["In"] == ["tenant batch"]
            assert rest == [{"Match": positive, "GreaterThan": 0}], name
        else:
            assert message_filter["In"] == ["throttled", "rejected"] and rest == []


def test_naive_mode_ships_the_same_views(naive_synth: Synth) -> None:
    assert len(rule_bodies(naive_synth)) == 4 and len(queries(naive_synth)) == 3


def test_the_refusals_rule_reads_the_ordered_front_door_when_it_is_built(ordered_synth: Synth) -> None:
    assert ordered_synth.breakwater.ordered is not None
    refusals = rule_bodies(ordered_synth)[f"{ordered_synth.config.service_name}-tenants-refusals"]
    assert ref(ordered_synth, ordered_synth.breakwater.ordered.ingest) in refusals["LogGroupNames"]


def test_saved_queries_show_one_tenant_over_the_right_log_groups(synth: Synth) -> None:
    saved = queries(synth)
    prefix = synth.config.service_name
    stack = synth.breakwater
    assert stack.streaming is not None
    expected = {
        f"{prefix}/tenant first-attempt ages": (
            [ref(synth, stack.consumers.live_worker)],
            ["first_attempt_age_ms_max", "pct(", "first_attempts"],
        ),
        f"{prefix}/tenant refusals": (
            [ref(synth, stack.ingest), ref(synth, stack.streaming.events)],
            ['message in ["throttled", "rejected"]', "status", "code"],
        ),
        f"{prefix}/tenant recent failures": (
            [ref(synth, worker) for worker in workers(synth)],
            ["processing (failed|cancelled)", "failed > 0", "dead_lettered > 0", "envelope_id"],
        ),
    }
    assert set(saved) == set(expected)
    for name, (log_groups, fragments) in expected.items():
        props = saved[name]
        assert [resolve(group) for group in props["LogGroupNames"]] == log_groups, name
        query = props["QueryString"]
        assert f'tenant = "{TENANT_PLACEHOLDER}"' in query, name
        for fragment in fragments:
            assert fragment in query, (name, fragment)


def test_the_dashboard_graphs_each_rule_and_lists_its_top_tenants(synth: Synth) -> None:
    widgets = dashboard(synth)["widgets"]
    expressions = [
        metric[0]["expression"]
        for widget in widgets
        for metric in widget["properties"].get("metrics", [])
        if isinstance(metric[0], dict) and "INSIGHT_RULE_METRIC" in metric[0].get("expression", "")
    ]
    log_queries = [widget["properties"]["query"] for widget in widgets if widget["type"] == "log"]
    bodies = rule_bodies(synth)
    for name, body in bodies.items():
        for statistic in ("MaxContributorValue", "UniqueContributors"):
            assert f"INSIGHT_RULE_METRIC('{name}', '{statistic}')" in expressions
        # The rule's table: its log groups as the query's sources, ranked by tenant.
        sources = "".join(f"SOURCE '{group}' | " for group in body["LogGroupNames"])
        (query,) = [q for q in log_queries if q.startswith(sources) and _ranks_like(q, body)]
        assert re.search(r"\| limit 10$", query), query
    assert len(log_queries) == len(bodies)


def _ranks_like(query: str, body: dict[str, Any]) -> bool:
    """Whether a top-tenants query ranks tenants by what the rule ranks them (its value, or refusals)."""
    value_of = body["Contribution"].get("ValueOf")
    return "by tenant" in query and (value_of[2:] in query if value_of else "throttled" in query)
