"""Every scenario report carries what the run cost: $ per million delivered messages by service."""

from __future__ import annotations

from typing import Any

import pytest

from local.pricing import cost
from local.scenarios.demo import CONFIGURATIONS, configuration_context, run_config
from local.scenarios.html_report import cost_table as html_cost_table
from local.scenarios.noisy_neighbour import Scenario
from local.scenarios.report import table

# Steady and short: three tenants within their limits, no burst, nothing parked for a replay.
STEADY = Scenario(
    tenants=3,
    quiet_rate=2.0,
    noisy_rate=2.0,
    burst_rate=2.0,
    baseline_s=3.0,
    burst_s=1.0,
    after_s=2.0,
    drain_s=20.0,
    senders=3,
    replay=False,
)


def fabricated(config: str, sqs_requests: float) -> dict[str, Any]:
    summary = cost.cost_summary(
        {"sqs.standard_requests": sqs_requests, "lambda.requests": 100},
        delivered=1000,
        window_s=60,
        requests=5,
    )
    summary["scheduled_functions_scaled_by"] = 1 / 12
    return {
        "config": config,
        "groups": {},
        "quiet_p99_ratio_burst_vs_baseline": None,
        "recovery_s_after_burst": None,
        "aws_requests_per_delivered_message": 0.005,
        "accounting": {"unaccounted": 0},
        "cost": summary,
    }


def test_the_printed_table_and_the_html_page_put_each_configuration_beside_naive() -> None:
    results = [fabricated("breakwater", 3000), fabricated("naive", 1000)]
    printed = table(results)
    assert "$ per million delivered" in printed
    sqs_row = next(line for line in printed.splitlines() if line.startswith("SQS"))
    assert "1.20" in sqs_row and "0.40" in sqs_row and "3.00x" in sqs_row
    html = html_cost_table(results)
    assert "breakwater / naive" in html and "$1.20" in html and "3.00x" in html


def test_fair_queues_alone_are_priced_beside_naive_too() -> None:
    results = [fabricated("breakwater", 3000), fabricated("naive", 1000), fabricated("fair", 2000)]
    sqs_row = next(line for line in table(results).splitlines() if line.startswith("SQS"))
    assert sqs_row.split()[1:] == ["1.20", "0.40", "0.80", "3.00x", "2.00x"]
    html = html_cost_table(results)
    assert "<th>breakwater / naive</th><th>fair / naive</th>" in html


def test_a_report_without_costs_prints_no_cost_table() -> None:
    result = fabricated("naive", 1)
    del result["cost"]
    assert "$ per million" not in table([result])
    assert html_cost_table([result]) == ""


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Tried to parse:UserWarning")
def test_a_short_run_s_report_prices_what_it_counted() -> None:
    name, extra = CONFIGURATIONS[0]
    report = run_config(f"test-cost-{name}", configuration_context(STEADY, extra), STEADY, progress=False)
    section = report["cost"]
    delivered = report["accounting"]["processed"]
    assert delivered > 0 and section["delivered"] == delivered
    by_service = section["usd_per_million_by_service"]
    for service in ("API Gateway", "Lambda", "SQS", "DynamoDB", "CloudWatch Logs"):
        assert by_service[service] > 0, service
    assert section["usd_per_million_delivered"] == pytest.approx(sum(v for v in by_service.values() if v))
    assert section["usage"]["apigateway.rest_requests"] >= delivered  # a request per message, at least
    assert "lambda.gb_seconds_arm64" in section["usage"]  # the template's architecture
    assert section["aws_requests_per_delivered_message"] == pytest.approx(
        report["aws_requests_per_delivered_message"]
    )
    assert {"lambda-service", "api-gateway", "hourly"} <= set(section["usd_per_million_by_part"])
