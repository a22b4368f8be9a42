"""CloudFormation resource types moto's CloudFormation cannot create, created through moto's own APIs.

moto 5.2.5 has a CloudWatch backend with alarms but no ``AWS::CloudWatch::Alarm`` CloudFormation
model, so a stack whose dashboard refers to an alarm's ``Arn`` fails to create. This model
creates the alarm with the CloudWatch backend's ``put_metric_alarm`` (the same call
``PutMetricAlarm`` makes), so alarms exist in the embedded AWS (``DescribeAlarms``) instead of
being skipped. Register with :func:`register` before the first ``CreateStack``.

moto has API Gateway stages and usage plans but no CloudFormation model for either; the usage
plans (the edge throttle per tier) must exist for onboarding to put tenants' keys in them, and
their ``ApiStages`` refer to the stage. Both are created through the API Gateway backend's own
``create_stage`` / ``create_usage_plan``. The stage's settings (throttle, logging) are still
applied by ``local.emulator.api`` from the template.
"""

from __future__ import annotations

from typing import Any, ClassVar

from moto.apigateway.models import apigateway_backends
from moto.cloudformation import parsing
from moto.cloudwatch.models import Dimension, Metric, MetricDataQuery, MetricStat, cloudwatch_backends
from moto.core.common_models import CloudFormationModel


def _queries(metrics: list[dict[str, Any]]) -> list[MetricDataQuery] | None:
    if not metrics:
        return None
    queries = []
    for query in metrics:
        stat = query.get("MetricStat")
        metric_stat = None
        if stat:
            metric = stat.get("Metric", {})
            metric_stat = MetricStat(
                metric=Metric(
                    metric_name=metric.get("MetricName"),
                    namespace=metric.get("Namespace"),
                    dimensions=[
                        Dimension(d.get("Name"), d.get("Value")) for d in metric.get("Dimensions", [])
                    ],
                ),
                period=stat.get("Period"),
                stat=stat.get("Stat"),
                unit=stat.get("Unit"),
            )
        queries.append(
            MetricDataQuery(
                query_id=query["Id"],
                label=query.get("Label", ""),
                period=str(query.get("Period", "")),
                return_data=str(query.get("ReturnData", "true")).lower(),
                expression=query.get("Expression"),
                metric_stat=metric_stat,
            )
        )
    return queries


class _CreatedThroughBackend:
    """What the models below share: moto finds them as direct subclasses of ``CloudFormationModel``,
    so this is a mixin; each model names its type and creates its resource in :meth:`create`."""

    TYPE: ClassVar[str]
    NAME_TYPE: ClassVar[str]

    def __init__(self, physical_id: str, resource: Any = None) -> None:
        self._physical_id, self.resource = physical_id, resource

    @classmethod
    def cloudformation_type(cls) -> str:
        return cls.TYPE

    @classmethod
    def cloudformation_name_type(cls) -> str:
        return cls.NAME_TYPE

    @property
    def physical_resource_id(self) -> str:
        return self._physical_id

    @classmethod
    def create_from_cloudformation_json(
        cls,
        resource_name: str,
        cloudformation_json: dict[str, Any],
        account_id: str,
        region_name: str,
        **kwargs: Any,
    ) -> Any:
        physical_id, resource = cls.create(
            resource_name, cloudformation_json["Properties"], account_id, region_name
        )
        return cls(physical_id, resource)

    @classmethod
    def create(cls, name: str, props: Any, account_id: str, region_name: str) -> tuple[str, Any]:
        raise NotImplementedError


class CloudWatchAlarm(_CreatedThroughBackend, CloudFormationModel):
    TYPE, NAME_TYPE = "AWS::CloudWatch::Alarm", "AlarmName"

    @classmethod
    def has_cfn_attr(cls, attr: str) -> bool:
        return attr == "Arn"

    def get_cfn_attribute(self, attribute_name: str) -> str:
        return str(self.resource.alarm_arn)

    @classmethod
    def create(cls, name: str, props: Any, account_id: str, region_name: str) -> tuple[str, Any]:
        backend = cloudwatch_backends[account_id][region_name]
        alarm = backend.put_metric_alarm(
            name=props.get("AlarmName") or name,
            namespace=props.get("Namespace"),
            metric_name=props.get("MetricName"),
            metric_data_queries=_queries(props.get("Metrics", [])),
            comparison_operator=props["ComparisonOperator"],
            evaluation_periods=int(props["EvaluationPeriods"]),
            datapoints_to_alarm=props.get("DatapointsToAlarm"),
            period=props.get("Period"),
            threshold=float(props["Threshold"]) if "Threshold" in props else 0.0,
            statistic=props.get("Statistic"),
            extended_statistic=props.get("ExtendedStatistic"),
            description=props.get("AlarmDescription", ""),
            dimensions=props.get("Dimensions", []),
            alarm_actions=props.get("AlarmActions", []),
            ok_actions=props.get("OKActions", []),
            insufficient_data_actions=props.get("InsufficientDataActions", []),
            unit=props.get("Unit"),
            actions_enabled=bool(props.get("ActionsEnabled", True)),
            treat_missing_data=props.get("TreatMissingData"),
            threshold_metric_id=props.get("ThresholdMetricId"),
        )
        return str(alarm.name), alarm


class ApiGatewayStage(_CreatedThroughBackend, CloudFormationModel):
    TYPE, NAME_TYPE = "AWS::ApiGateway::Stage", "StageName"

    @classmethod
    def create(cls, name: str, props: Any, account_id: str, region_name: str) -> tuple[str, Any]:
        stage = apigateway_backends[account_id][region_name].create_stage(
            props["RestApiId"],
            props.get("StageName") or name,
            props["DeploymentId"],
            variables=props.get("Variables"),
            description=props.get("Description", ""),
            tracing_enabled=props.get("TracingEnabled"),
        )
        return str(stage.name), stage


class ApiGatewayUsagePlan(_CreatedThroughBackend, CloudFormationModel):
    TYPE, NAME_TYPE = "AWS::ApiGateway::UsagePlan", "UsagePlanName"

    @classmethod
    def create(cls, name: str, props: Any, account_id: str, region_name: str) -> tuple[str, Any]:
        payload: dict[str, Any] = {
            "name": props.get("UsagePlanName") or name,
            "description": props.get("Description"),
            "apiStages": [{"apiId": s["ApiId"], "stage": s["Stage"]} for s in props.get("ApiStages", [])],
        }
        if "Throttle" in props:
            throttle = props["Throttle"]
            payload["throttle"] = {
                "rateLimit": float(throttle.get("RateLimit", 0)),
                "burstLimit": int(throttle.get("BurstLimit", 0)),
            }
        if "Quota" in props:
            quota = props["Quota"]
            payload["quota"] = {
                "limit": int(quota["Limit"]),
                "period": quota["Period"],
                "offset": quota.get("Offset", 0),
            }
        plan = apigateway_backends[account_id][region_name].create_usage_plan(payload)
        return str(plan.id), plan


def register() -> None:
    """Make moto's CloudFormation see the models above (its model list is cached on first use)."""
    parsing.get_model_list.cache_clear()
    parsing.get_model_map.cache_clear()
    parsing.get_name_type_map.cache_clear()
