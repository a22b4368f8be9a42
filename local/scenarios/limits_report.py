"""What AWS's limits did in a run, for its report: the limits and their scale, DynamoDB's throttles by
item kind, transaction conflicts, the hottest items, and the limits the emulator does not scale."""

from __future__ import annotations

from typing import Any

from local.emulator.runtime import LocalRuntime

# The API's throttles are the template's own figures (the stage's, the usage plans'): the emulator
# applies them as configured, so a scaled run keeps them at AWS's rates.
API_THROTTLES = "API Gateway stage and usage-plan throttles at the template's rates (not scaled)"


def limits_section(runtime: LocalRuntime) -> dict[str, Any]:
    """The run's limits and what they refused, read from the embedded AWS before it stops."""
    if runtime.options.limits is None:
        return {"limits": "off (moto's own answers: nothing throttled, no transaction conflicts)"}
    return {**runtime.aws.limits_report(), "api_gateway": API_THROTTLES}


def limits_lines(name: str, section: dict[str, Any] | None, hottest: int = 10) -> list[str]:
    """The console lines of one configuration's :func:`limits_section`."""
    if not section:
        return []
    lines = [f"{name:10s} {section['limits']}"]
    if "dynamodb_throttles" not in section:
        return lines
    lines.append(f"{name:10s} {section.get('api_gateway', API_THROTTLES)}")
    throttles = section["dynamodb_throttles"]
    conflicts = section.get("transaction_conflicts") or {}
    lines.append(
        f"{name:10s} DynamoDB throttled calls = {sum(throttles.values())} "
        f"({', '.join(f'{k} {v}' for k, v in throttles.items()) or 'none'}); "
        f"transaction conflicts = {sum(conflicts.values())} "
        f"({', '.join(f'{k} {v}' for k, v in conflicts.items()) or 'none'}); "
        f"Kinesis records throttled = {section.get('kinesis_throttled_records', 0)}; "
        f"other refusals = {section.get('refused') or 'none'}"
    )
    by_kind = section.get("dynamodb_write_units_by_kind") or {}
    if by_kind:
        totals = ", ".join(f"{kind} {units:g}" for kind, units in by_kind.items() if units)
        lines.append(f"{name:10s} DynamoDB write units by item kind: {totals}")
    items = section.get("hottest_items") or []
    if items:
        lines.append(f"{name:10s} hottest items: {'item':60s} {'WCU/s':>7s} {'RCU/s':>7s} {'throttled':>9s}")
        for item in items[:hottest]:
            label = item["item"] if len(item["item"]) <= 60 else "..." + item["item"][-57:]
            lines.append(
                f"{'':10s} {item['kind']:>14s} {label:60s} {item['peak_wcu_per_s']:7.1f} "
                f"{item['peak_rcu_per_s']:7.1f} {item['throttled']:9d}"
            )
    return lines
