"""The control plane: the controller on a one-minute schedule, and the redrive function.

The controller turns backlog into backpressure (a falling per-tenant inbound multiplier), grows
limits organically, and enables the sideline mappings only while the live queues are healthy. It
may update exactly those mappings. Redrive moves DLQ messages back to their source after a fix.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda_event_sources as sources
from constructs import Construct

from breakwater_cdk import environment
from breakwater_cdk.config import BlueprintConfig
from breakwater_cdk.functions import BreakwaterFunction, FunctionFactory
from breakwater_cdk.queue_set import QueueSet
from breakwater_cdk.tables import CONTROLLER_STATE, REDRIVE_STATE, Tables, grant_items

# Finishes well inside its minute, so two runs never overlap.
CONTROLLER_TIMEOUT_SECONDS = 50
REDRIVE_TIMEOUT_SECONDS = 300
CONTROL_MEMORY_MB = 512
# A whole vCPU (Lambda gives CPU in proportion to memory): a run that finds many changed tenants is
# bound by its Python as much as by its round trips (bench/controller.py).
CONTROLLER_MEMORY_MB = 1769


class ControlPlane(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: BlueprintConfig,
        functions: FunctionFactory,
        tables: Tables,
        queues: QueueSet,
        sideline_mappings: Sequence[sources.SqsEventSource],
    ) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self._functions = functions
        self._tables = tables
        self._queues = queues
        self.controller = self._build_controller(sideline_mappings)
        self.schedule = self._build_schedule()
        self.redrive = self._build_redrive()

    def _build_controller(self, sideline_mappings: Sequence[sources.SqsEventSource]) -> BreakwaterFunction:
        controller = self._functions.build(
            "Controller",
            handler="controller/handler.handler",
            description="Every minute: backpressure per tenant, organic growth, sideline drainers on/off",
            environment=environment.controller_environment(
                self._config,
                tables=self._tables,
                queues=self._queues,
                sideline_mapping_ids=[m.event_source_mapping_id for m in sideline_mappings],
            ),
            memory_mb=CONTROLLER_MEMORY_MB,
            timeout_seconds=CONTROLLER_TIMEOUT_SECONDS,
        )
        grant_items(
            self._tables.state, controller.role, CONTROLLER_STATE, indexes=[self._tables.dirty_index_name]
        )
        self._tables.tenants.grant_read_data(controller.role)
        for pair in [*self._queues.live, *self._queues.sideline, self._queues.surge]:
            pair.queue.grant(controller.role, "sqs:GetQueueAttributes")  # depth only: no receive, no delete
        if self._config.backpressure.controller_invocations > 1:
            self._allow_split_runs(controller)
        controller.role.add_to_principal_policy(
            iam.PolicyStatement(
                sid="ToggleSidelineDrainers",
                actions=["lambda:GetEventSourceMapping", "lambda:UpdateEventSourceMapping"],
                resources=[m.event_source_mapping_arn for m in sideline_mappings],
            )
        )
        return controller

    def _allow_split_runs(self, controller: BreakwaterFunction) -> None:
        """A run hands groups of shards to invocations of the same function and waits for them.

        A policy of its own, not the role's default one: the function waits for its default policy,
        and a default policy naming the function's ARN would wait for the function.
        """
        iam.Policy(
            self,
            "ControllerSplitRuns",
            roles=[controller.role],
            statements=[
                iam.PolicyStatement(
                    sid="InvokeItsOwnShards",
                    actions=["lambda:InvokeFunction"],
                    resources=[controller.function.function_arn],
                )
            ],
        )

    def _build_schedule(self) -> events.Rule:
        return events.Rule(
            self,
            "EveryMinute",
            description="runs the Breakwater controller",
            schedule=events.Schedule.rate(Duration.minutes(1)),
            # A late run is worthless: the next one is a minute away.
            targets=[
                targets.LambdaFunction(
                    self.controller.function, retry_attempts=2, max_event_age=Duration.minutes(1)
                )
            ],
        )

    def _build_redrive(self) -> BreakwaterFunction:
        redrive = self._functions.build(
            "Redrive",
            handler="redrive/handler.handler",
            description="Operator: move DLQ messages back to their source queue after a fix",
            environment=environment.redrive_environment(self, tables=self._tables, queues=self._queues),
            memory_mb=CONTROL_MEMORY_MB,
            timeout_seconds=REDRIVE_TIMEOUT_SECONDS,
        )
        grant_items(self._tables.state, redrive.role, REDRIVE_STATE)  # markers of the fallback move
        for pair in self._queues.all:
            # moved by hand, each message marked redriven: a move task's copies could not be told apart
            pair.dlq.grant_consume_messages(redrive.role)
            pair.queue.grant_send_messages(redrive.role)
        return redrive
