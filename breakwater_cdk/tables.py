"""The three DynamoDB tables of docs/architecture.md: Tenants, State and Idempotency.

All on-demand (no capacity to plan), encrypted with the AWS-managed key, with point-in-time
recovery. Tenants holds what cannot be recreated (tenant records and key hashes), so it is retained
and protected from deletion; State and Idempotency hold derived, TTL-expiring data and go with the
stack.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from constructs import Construct

# What each function does to each table: the adapters' calls, and nothing more (no Scan or DeleteItem
# where a function never scans or deletes). Transactions need the per-item actions they contain.
BUCKET_ITEMS = ("dynamodb:UpdateItem",)  # leased token buckets (ingest, ordered ingest, events)
INGEST_STATE = (*BUCKET_ITEMS, "dynamodb:ConditionCheckItem")  # + counter tallies in transactions
WORKER_STATE = (
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:ConditionCheckItem",
)
CONTROLLER_STATE = (
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:UpdateItem",
    "dynamodb:Query",  # the changed tenants' index
)
DIRTY_INDEX_NAME = "dirty"  # the state table's index of changed tenants (breakwater.backlog)
REDRIVE_STATE = ("dynamodb:BatchGetItem", "dynamodb:BatchWriteItem", "dynamodb:PutItem")
# Ingest's idempotency-key claims: claim (conditional put), read the holder, accept, take over, give back.
INGEST_KEYS = ("dynamodb:PutItem", "dynamodb:GetItem", "dynamodb:UpdateItem", "dynamodb:DeleteItem")


def grant_items(
    table: dynamodb.ITable, grantee: iam.IGrantable, actions: Sequence[str], *, indexes: Sequence[str] = ()
) -> iam.Grant:
    """Exactly ``actions`` on the table's items (the table ARN, and only the named indexes; no streams)."""
    arns = [table.table_arn, *(f"{table.table_arn}/index/{name}" for name in indexes)]
    return iam.Grant.add_to_principal(grantee=grantee, actions=list(actions), resource_arns=arns)


def tls_only_policy() -> iam.PolicyDocument:
    """The table's resource policy: any request that is not over TLS is denied."""
    return iam.PolicyDocument(
        statements=[
            iam.PolicyStatement(
                sid="DenyPlainHttp",
                effect=iam.Effect.DENY,
                principals=[iam.AnyPrincipal()],
                actions=["dynamodb:*"],
                resources=["*"],
                conditions={"Bool": {"aws:SecureTransport": "false"}},
            )
        ]
    )


class Tables(Construct):
    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.tenants = build_table(
            self,
            "Tenants",
            partition_key="tenant_id",
            keep=True,
        )
        self.state = build_table(
            self,
            "State",
            partition_key="pk",
            sort_key="sk",
            ttl_attribute="ttl",
            keep=False,
        )
        # Sparse: only counters items of tenants that changed since the controller last looked carry
        # ``dirty_shard``, so the controller reads those and no other. Keys only: a counter write that
        # finds its tenant already marked changes nothing the index holds, so it costs the index nothing.
        self.dirty_index_name = DIRTY_INDEX_NAME
        self.state.add_global_secondary_index(
            index_name=DIRTY_INDEX_NAME,
            partition_key=dynamodb.Attribute(name="dirty_shard", type=dynamodb.AttributeType.STRING),
            sort_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING),
            projection_type=dynamodb.ProjectionType.KEYS_ONLY,
        )
        # Powertools idempotency layout: key "id", TTL "expiration".
        self.idempotency = build_table(
            self,
            "Idempotency",
            partition_key="id",
            ttl_attribute="expiration",
            keep=False,
        )


def build_table(
    scope: Construct,
    construct_id: str,
    *,
    partition_key: str,
    sort_key: str | None = None,
    ttl_attribute: str | None = None,
    keep: bool | None = None,
) -> dynamodb.Table:
    """An on-demand table of string keys, AWS-managed encryption and point-in-time recovery.

    ``keep=True`` retains it and protects it from deletion; otherwise it goes with the stack
    (``None`` leaves DeletionProtectionEnabled unset, as the workloads' tables always had it).
    """
    string = dynamodb.AttributeType.STRING
    return dynamodb.Table(
        scope,
        construct_id,
        partition_key=dynamodb.Attribute(name=partition_key, type=string),
        sort_key=dynamodb.Attribute(name=sort_key, type=string) if sort_key else None,
        time_to_live_attribute=ttl_attribute,
        billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
        encryption=dynamodb.TableEncryption.AWS_MANAGED,
        point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
            point_in_time_recovery_enabled=True
        ),
        deletion_protection=keep,
        removal_policy=RemovalPolicy.RETAIN if keep else RemovalPolicy.DESTROY,
        resource_policy=tls_only_policy(),
    )
