"""A factory for the construct's Lambda functions.

Every function ships the handlers' asset (``functions/`` without the runtime library, as it is: no
Docker bundling) with two layers: the runtime library ``breakwater``, versioned with this package,
and Powertools from its public layer. Each gets its own encrypted log group with a retention, its
own role holding only what the caller grants, explicit memory and timeout, and the Powertools
environment.
"""

from __future__ import annotations

from aws_cdk import Aws, CfnResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from breakwater_cdk.assets import HANDLERS, VERSION, stage_runtime_layer
from breakwater_cdk.config import BlueprintConfig, ConfigError
from breakwater_cdk.processor import Processor

# The runtime library comes from the layer, never from the handlers' asset.
ASSET_EXCLUDE = [
    "**/__pycache__", "**/*.pyc", "tests", "**/tests", ".mypy_cache", ".pytest_cache", "breakwater",
]  # fmt: skip
POWERTOOLS_ACCOUNT = "017000801446"
PROCESSOR_HANDLER = "PROCESSOR_HANDLER"  # breakwater.settings: the workers' processor, module.function

RETENTION = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    120: logs.RetentionDays.FOUR_MONTHS,
    150: logs.RetentionDays.FIVE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
    400: logs.RetentionDays.THIRTEEN_MONTHS,
    545: logs.RetentionDays.EIGHTEEN_MONTHS,
    731: logs.RetentionDays.TWO_YEARS,
    1827: logs.RetentionDays.FIVE_YEARS,
    3653: logs.RetentionDays.TEN_YEARS,
}

_RUNTIMES = {
    "python3.11": lambda_.Runtime.PYTHON_3_11,
    "python3.12": lambda_.Runtime.PYTHON_3_12,
    "python3.13": lambda_.Runtime.PYTHON_3_13,
}
_ARCHITECTURES = {"arm64": lambda_.Architecture.ARM_64, "x86_64": lambda_.Architecture.X86_64}


def powertools_layer_arn(config: BlueprintConfig) -> str:
    """The public Powertools layer for the configured runtime and architecture, in the stack's region."""
    fn = config.functions
    name = f"AWSLambdaPowertoolsPythonV3-{fn.runtime.replace('.', '')}-{fn.architecture}"
    layer = f"layer:{name}:{fn.powertools_layer_version}"
    return f"arn:{Aws.PARTITION}:lambda:{Aws.REGION}:{POWERTOOLS_ACCOUNT}:{layer}"


def encrypted_log_group(
    scope: Construct, construct_id: str, *, config: BlueprintConfig, key: kms.IKey
) -> logs.LogGroup:
    return logs.LogGroup(
        scope,
        construct_id,
        retention=RETENTION[config.functions.log_retention_days],
        encryption_key=key,
        removal_policy=RemovalPolicy.DESTROY,
    )


class BreakwaterFunction(Construct):
    """One function with its role and log group (``.function``, ``.role``, ``.log_group``)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        factory: FunctionFactory,
        handler: str,
        description: str,
        environment: dict[str, str],
        memory_mb: int,
        timeout_seconds: int,
        runs_processor: bool = False,
    ) -> None:
        super().__init__(scope, construct_id)
        config = factory.config
        if runs_processor:
            environment = {**environment, **processor_environment(factory.processor, environment)}
        self.name = construct_id
        self.log_group = encrypted_log_group(self, "Logs", config=config, key=factory.key)
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"{config.service_name} {construct_id}: only the grants its handler needs",
        )
        self.log_group.grant_write(self.role)
        self.function = lambda_.Function(
            self,
            "Function",
            description=description,
            code=factory.processor_code if runs_processor else factory.code,
            handler=handler,
            runtime=_RUNTIMES[config.functions.runtime],
            architecture=_ARCHITECTURES[config.functions.architecture],
            layers=[factory.runtime, factory.powertools],
            memory_size=memory_mb,
            timeout=Duration.seconds(timeout_seconds),
            role=self.role,
            log_group=self.log_group,
            tracing=lambda_.Tracing.ACTIVE if config.functions.tracing else lambda_.Tracing.DISABLED,
            environment={**factory.powertools_environment, **environment},
        )
        if runs_processor:
            factory.processor.grant(self.role)
        self._depend_on_policy_only()

    def _depend_on_policy_only(self) -> None:
        """Depend on the role's policy only: the role is a GetAtt already (cfn-lint W3005)."""
        policy = self.role.node.find_child("DefaultPolicy").node.default_child
        function = self.function.node.default_child
        assert isinstance(policy, CfnResource) and isinstance(function, CfnResource)
        function.add_override("DependsOn", [Stack.of(self).get_logical_id(policy)])


def processor_environment(processor: Processor, own: dict[str, str]) -> dict[str, str]:
    """What a worker adds for the processor: which function to run, its variables and secrets."""
    values = {PROCESSOR_HANDLER: processor.handler, **processor.variables()}
    clash = sorted(set(values) & set(own))
    if clash:
        raise ConfigError(f"processor.environment {clash} would replace the workers' own settings")
    return values


class FunctionFactory(Construct):
    """Shares the code assets and the layers between the functions it builds.

    The workers run ``processor``: their asset is its directory bundled with its requirements and
    the workers' handlers (:meth:`Processor.code`); every other function runs the handlers' asset.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: BlueprintConfig,
        key: kms.IKey,
        processor: Processor,
    ) -> None:
        super().__init__(scope, construct_id)
        self.config = config
        self.key = key
        self.processor = processor
        self.code = lambda_.Code.from_asset(str(HANDLERS), exclude=ASSET_EXCLUDE)
        self.processor_code = processor.code(
            runtime=config.functions.runtime, architecture=config.functions.architecture
        )
        self.runtime = lambda_.LayerVersion(
            self,
            "Runtime",
            code=lambda_.Code.from_asset(str(stage_runtime_layer())),
            description=f"Breakwater runtime library {VERSION}",
            compatible_runtimes=[_RUNTIMES[config.functions.runtime]],
            compatible_architectures=[_ARCHITECTURES[config.functions.architecture]],
            removal_policy=RemovalPolicy.RETAIN,  # a function still deployed may run on an older version
        )
        self.powertools = lambda_.LayerVersion.from_layer_version_arn(
            self, "Powertools", powertools_layer_arn(config)
        )
        self.powertools_environment = {
            "POWERTOOLS_SERVICE_NAME": config.service_name,
            "POWERTOOLS_METRICS_NAMESPACE": config.metrics_namespace,
            "POWERTOOLS_LOG_LEVEL": config.functions.log_level,
        }
        if not config.functions.tracing:
            self.powertools_environment["POWERTOOLS_TRACE_DISABLED"] = "true"
        self.built: list[BreakwaterFunction] = []

    def build(
        self,
        construct_id: str,
        *,
        handler: str,
        description: str,
        environment: dict[str, str],
        memory_mb: int,
        timeout_seconds: int,
        runs_processor: bool = False,
    ) -> BreakwaterFunction:
        built = BreakwaterFunction(
            self,
            construct_id,
            factory=self,
            handler=handler,
            description=description,
            environment=environment,
            memory_mb=memory_mb,
            timeout_seconds=timeout_seconds,
            runs_processor=runs_processor,
        )
        self.built.append(built)
        return built
