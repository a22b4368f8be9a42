"""One customer-managed KMS key for the log groups and the alarm topic.

SQS and DynamoDB use their service-side encryption (free or nearly so); CloudWatch Logs and an SNS
topic that CloudWatch alarms publish to need a key whose policy lets those services use it, which an
AWS-managed key cannot grant. One rotating key serves both, so the cost stays at one key.
"""

from __future__ import annotations

from aws_cdk import Aws, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from constructs import Construct

from breakwater_cdk.config import BlueprintConfig

# Explicit actions (no "kms:*"-style wildcards) for the services that encrypt with the key.
_SERVICE_ACTIONS = [
    "kms:Encrypt",
    "kms:Decrypt",
    "kms:ReEncryptFrom",
    "kms:ReEncryptTo",
    "kms:GenerateDataKey",
    "kms:GenerateDataKeyWithoutPlaintext",
    "kms:DescribeKey",
]


class StackKey(Construct):
    """The stack's key: rotation on; usable by CloudWatch Logs (this account and region) and alarms."""

    def __init__(self, scope: Construct, construct_id: str, *, config: BlueprintConfig) -> None:
        super().__init__(scope, construct_id)
        self.key = kms.Key(
            self,
            "Key",
            description=f"{config.service_name}: encrypts log groups and the alarm topic",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.RETAIN,
        )
        self._allow_logs()
        self._allow_alarms()

    def _allow_logs(self) -> None:
        region = Stack.of(self).region
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchLogsOfThisAccount",
                principals=[iam.ServicePrincipal(f"logs.{region}.amazonaws.com")],
                actions=_SERVICE_ACTIONS,
                resources=["*"],  # in a key policy "*" means this key
                conditions={
                    "ArnLike": {
                        "kms:EncryptionContext:aws:logs:arn": (
                            f"arn:{Aws.PARTITION}:logs:{region}:{Aws.ACCOUNT_ID}:log-group:*"
                        )
                    }
                },
            )
        )

    def _allow_alarms(self) -> None:
        # CloudWatch alarms publish to the encrypted topic: they need a data key (SNS docs, "Enable
        # compatibility between event sources from AWS services and encrypted topics").
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="CloudWatchAlarmsToEncryptedTopic",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey"],
                resources=["*"],  # in a key policy "*" means this key
                conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}},
            )
        )
