"""Counted usage priced: $ per million delivered messages, by service, from ``prices.json``.

Usage is a mapping of priced units (the keys of ``prices.json``: ``sqs.standard_requests``,
``dynamodb.write_request_units``, ``lambda.gb_seconds_arm64``, ...) to quantities, as the emulator
counts them (:mod:`local.pricing.usage`, the function pools, the local API) or as a simulator
computes them. :func:`cost_summary` is the one entry point every report uses: the usage of a run, its
delivered messages and the window it was measured over give $ per million delivered messages per
service and in total. What is billed by the hour (Kinesis shards, CloudWatch custom metrics) comes
in as hours over the window (:func:`hourly_usage`), so a faster run pays less of it per message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

PRICES_PATH = Path(__file__).resolve().parent / "prices.json"
HOURS_PER_MONTH = 730  # CloudWatch prorates a metric-month by the hour over 730 hours
# Counted but not priced: kept in a report's usage for comparison (so is every ``measured.*`` unit).
UNPRICED = frozenset({"dynamodb.reported_capacity_units"})
MEASURED = "measured."
AS_MEASURED_ROW = "(Lambda duration at emulator speed)"  # the cost tables' row of the measured duration


@dataclass(frozen=True)
class Price:
    unit: str
    service: str
    description: str
    price_usd: float
    per: float
    date: str
    source: str
    note: str = ""

    def cost(self, quantity: float) -> float:
        return quantity * self.price_usd / self.per


@cache
def load_prices(path: Path = PRICES_PATH) -> dict[str, Price]:
    """The price table, one :class:`Price` per unit."""
    table = json.loads(path.read_text(encoding="utf-8"))
    return {unit: Price(unit=unit, **entry) for unit, entry in table["prices"].items()}


@cache
def aws_call_latency_ms(path: Path = PRICES_PATH) -> dict[str, float]:
    """A round trip of an AWS call from a function, per service (``default`` for the others): what
    the function pools bill Lambda duration with in place of the emulator's round trips."""
    table = json.loads(path.read_text(encoding="utf-8"))["aws_call_latency_ms"]
    return {service: float(ms) for service, ms in table.items() if service not in ("note", "source")}


def services(prices: Mapping[str, Price] | None = None) -> list[str]:
    """The services of the price table, in its order."""
    seen: dict[str, None] = {}
    for price in (prices or load_prices()).values():
        seen.setdefault(price.service, None)
    return list(seen)


def lambda_duration_unit(architecture: str) -> str:
    """The price key of a function's GB-seconds on ``architecture`` (``arm64`` or ``x86_64``)."""
    return "lambda.gb_seconds_arm64" if architecture == "arm64" else "lambda.gb_seconds_x86_64"


def hourly_usage(
    window_s: float, *, shards: int = 0, on_demand_streams: int = 0, metrics: int = 0
) -> dict[str, float]:
    """What is billed by the hour, over a window of ``window_s`` seconds: provisioned Kinesis shards,
    on-demand streams and distinct custom metrics (each metric-month 730 hours)."""
    hours = max(0.0, window_s) / 3600
    usage = {
        "kinesis.shard_hours": shards * hours,
        "kinesis.stream_hours": on_demand_streams * hours,
        "cloudwatch.metric_months": metrics * hours / HOURS_PER_MONTH,
    }
    return {unit: quantity for unit, quantity in usage.items() if quantity}


def price_usage(usage: Mapping[str, float], prices: Mapping[str, Price] | None = None) -> dict[str, float]:
    """$ per priced unit of ``usage``; a unit the table lacks is an error (a typo would cost nothing)."""
    table = prices or load_prices()
    out: dict[str, float] = {}
    for unit, quantity in usage.items():
        if unit in UNPRICED or unit.startswith(MEASURED):
            continue
        if unit not in table:
            raise KeyError(f"no price for {unit!r} in {PRICES_PATH.name}")
        out[unit] = table[unit].cost(quantity)
    return out


def by_service(costs: Mapping[str, float], prices: Mapping[str, Price] | None = None) -> dict[str, float]:
    """$ per unit summed per service, every service of the table present (0 when nothing was used)."""
    table = prices or load_prices()
    out = dict.fromkeys(services(table), 0.0)
    for unit, usd in costs.items():
        out[table[unit].service] += usd
    return out


def add(usages: Iterable[Mapping[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for usage in usages:
        for unit, quantity in usage.items():
            total[unit] = total.get(unit, 0.0) + quantity
    return total


def cost_summary(
    usage: Mapping[str, float],
    delivered: int,
    window_s: float,
    *,
    by_part: Mapping[str, Mapping[str, float]] | None = None,
    requests: int | None = None,
    prices: Mapping[str, Price] | None = None,
) -> dict[str, Any]:
    """A report's cost section: $ per million delivered messages, per service and in total.

    ``usage``: every priced unit counted over the run's window (hourly units included);
    ``delivered``: messages processed in it; ``by_part``: the same usage split by where it arose (a
    function, the Lambda service's pollers, the API), priced per million delivered messages too;
    ``requests``: AWS API requests counted, for the requests-per-message figure beside the price.
    """
    table = prices or load_prices()
    per_million = 1_000_000 / delivered if delivered else None

    def scaled(usd: float) -> float | None:
        return None if per_million is None else usd * per_million

    costs = price_usage(usage, table)
    services_usd = by_service(costs, table)
    summary: dict[str, Any] = {
        "delivered": delivered,
        "window_s": window_s,
        "usd_total": sum(costs.values()),
        "usd_per_million_delivered": scaled(sum(costs.values())),
        "usd_per_million_by_service": {name: scaled(usd) for name, usd in services_usd.items()},
        "usd_per_million_by_unit": {unit: scaled(usd) for unit, usd in sorted(costs.items())},
        "usage": {unit: round(quantity, 6) for unit, quantity in sorted(usage.items())},
        "units_per_delivered_message": {
            unit: (quantity / delivered if delivered else None) for unit, quantity in sorted(usage.items())
        },
        "aws_requests": requests,
        "aws_requests_per_delivered_message": (requests / delivered) if requests and delivered else None,
        "prices": str(PRICES_PATH.relative_to(PRICES_PATH.parents[2])),
    }
    duration_units = [unit for unit in costs if unit.startswith("lambda.gb_seconds")]
    billed_gb_s = sum(usage[unit] for unit in duration_units)
    measured_gb_s = usage.get(MEASURED + "lambda_gb_seconds")
    if measured_gb_s is not None and billed_gb_s:
        # Lambda's duration as the emulator measured it (its round trips, not AWS's), for comparison
        summary["usd_per_million_lambda_duration_as_measured"] = scaled(
            sum(costs[unit] for unit in duration_units) * measured_gb_s / billed_gb_s
        )
    if by_part is not None:
        summary["usd_per_million_by_part"] = {
            part: scaled(sum(price_usage(part_usage, table).values()))
            for part, part_usage in sorted(by_part.items())
        }
    return summary


def ratio(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else value / base


def side_by_side(summaries: Mapping[str, Mapping[str, Any]], *, base: str = "naive") -> str:
    """$ per million delivered messages by service, one column per configuration, and the ratio of
    each to ``base`` (when it is one of them)."""
    names = list(summaries)
    rows = services()
    width = max(len(name) for name in [*rows, AS_MEASURED_ROW]) + 2
    header = f"{'$ per million delivered':{width}s}" + "".join(f"{name:>14s}" for name in names)
    with_ratio = base in summaries and len(names) > 1
    others = [name for name in names if name != base]
    if with_ratio:
        header += "".join(f"{name + ' / ' + base:>22s}" for name in others)
    lines = [header, "-" * len(header)]

    def row(label: str, values: dict[str, float | None], fmt: str) -> str:
        text = f"{label:{width}s}" + "".join(
            f"{'-' if values[n] is None else format(values[n], fmt):>14s}" for n in names
        )
        if with_ratio:
            for name in others:
                r = ratio(values[name], values[base])
                text += f"{'-' if r is None else f'{r:.2f}x':>22s}"
        return text

    for service in rows:
        values = {n: summaries[n]["usd_per_million_by_service"].get(service) for n in names}
        if any(values.values()):
            lines.append(row(service, values, ",.2f"))
    lines.append(row("total", {n: summaries[n]["usd_per_million_delivered"] for n in names}, ",.2f"))
    measured = {n: summaries[n].get("usd_per_million_lambda_duration_as_measured") for n in names}
    if any(measured.values()):  # the duration above is billed at AWS's round trips
        lines.append(row(AS_MEASURED_ROW, measured, ",.2f"))
    lines.append(
        row(
            "requests / message",
            {n: summaries[n].get("aws_requests_per_delivered_message") for n in names},
            ".1f",
        )
    )
    return "\n".join(lines)
