"""The orders processor: is the order's item in stock? Record the order, exactly once, in the orders table."""

from __future__ import annotations

import os
from typing import Any

import httpx

from breakwater.envelope import Envelope
from breakwater.processor import DependencyUnavailableError, WorkContext

INVENTORY_URL = os.environ["INVENTORY_URL"]
ORDERS_TABLE = os.environ["ORDERS_TABLE"]
_inventory = httpx.Client(base_url=INVENTORY_URL, timeout=5.0)


def process(envelope: Envelope, work: WorkContext) -> dict[str, Any]:
    order = envelope.payload if isinstance(envelope.payload, dict) else {}
    order_id, sku = str(order["order_id"]), str(order["sku"])
    quantity = int(order.get("quantity", 1))
    try:
        answer = _inventory.get(f"/stock/{sku}")
    except httpx.TransportError as error:  # the inventory is down, not the order bad: set it aside
        raise DependencyUnavailableError(f"inventory unreachable: {error}") from error
    if answer.status_code >= 500:
        raise DependencyUnavailableError(f"inventory answered {answer.status_code}")
    answer.raise_for_status()
    in_stock = int(answer.json()["available"]) >= quantity
    work.check()  # past the deadline: stop before the write
    # Written with the message's idempotency record, in one transaction: once, and never for a failure.
    work.add_effect(
        {
            "Put": {
                "TableName": ORDERS_TABLE,
                "Item": {
                    "tenant": {"S": envelope.tenant},
                    "order_id": {"S": order_id},
                    "sku": {"S": sku},
                    "quantity": {"N": str(quantity)},
                    "status": {"S": "accepted" if in_stock else "backordered"},
                },
            }
        }
    )
    return {"order_id": order_id, "in_stock": in_stock}
