#!/usr/bin/env python3
"""An app of its own that uses Breakwater from the installed wheel: orders checked against an inventory API.

The processor (``processor/orders.py``, with ``httpx`` in its requirements.txt) asks the inventory
service whether an order's items are in stock and records the order in this app's own DynamoDB
table. ``-c inventory_url=...`` points it at the inventory service; ``-c stage=...`` picks the
stage (its stack is ``Orders-<stage>``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import aws_cdk as cdk
from aws_cdk import aws_dynamodb as dynamodb

from breakwater_cdk import Breakwater, ConfigError, Processor, load_config
from breakwater_cdk.nag import apply_nag_packs

HERE = Path(__file__).resolve().parent


class OrdersStack(cdk.Stack):
    def __init__(self, scope: cdk.App, construct_id: str, *, inventory_url: str) -> None:
        super().__init__(scope, construct_id)
        orders = dynamodb.Table(
            self,
            "Orders",
            partition_key=dynamodb.Attribute(name="tenant", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="order_id", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            removal_policy=cdk.RemovalPolicy.DESTROY,
        )
        self.breakwater = Breakwater(
            self,
            "Intake",
            config=load_config(self.node.try_get_context("breakwater")),
            processor=Processor(
                directory=HERE / "processor",
                handler="orders.process",
                environment={"INVENTORY_URL": inventory_url, "ORDERS_TABLE": orders.table_name},
                grants=[orders.grant_read_write_data],
            ),
        )
        cdk.CfnOutput(self, "OrdersTableName", value=orders.table_name)


def main() -> int:
    # cdk.json's context, also when the app runs as ``python app.py`` (the CDK CLI passes it itself).
    app = cdk.App(context=json.loads((HERE / "cdk.json").read_text(encoding="utf-8"))["context"])
    stage = app.node.try_get_context("stage") or "dev"
    try:
        OrdersStack(app, f"Orders-{stage}", inventory_url=app.node.try_get_context("inventory_url"))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    apply_nag_packs(app)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
