"""What the local runtime needs to know about the created stack: from CloudFormation, Lambda and the template.

Functions come with the environment CloudFormation resolved (``GetFunctionConfiguration``);
event source mappings from ``GetEventSourceMapping``; API routes and the authorizer, gateway
responses and the stage from the template (moto creates the REST API and its resources but not
stages or authorizers); schedules from ``AWS::Events::Rule``.
"""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from local.emulator.assembly import CloudAssembly
from local.emulator.deploy import Deployment, _substitute
from local.emulator.embedded_aws import EmbeddedAws
from local.emulator.functions import FunctionSpec

# Lambda documents one provisioned event poller of an SQS mapping as handling up to 10 concurrent
# invocations: what a poller may hold in flight in the emulator, and what it adds to its function's.
INVOCATIONS_PER_POLLER = 10


@dataclass(frozen=True)
class MappingSpec:
    uuid: str
    function_logical_id: str
    source_arn: str
    queue_url: str | None


@dataclass(frozen=True)
class AuthorizerSpec:
    function_logical_id: str
    identity_headers: tuple[str, ...]
    ttl_seconds: int


@dataclass(frozen=True)
class RouteSpec:
    method: str
    path: str  # resource path, e.g. /v1/messages
    function_logical_id: str
    authorizer: AuthorizerSpec | None
    request_schema: dict[str, Any] | None = None
    api_key_required: bool = False


@dataclass(frozen=True)
class ScheduleSpec:
    rule_logical_id: str
    expression: str
    period_seconds: float | None  # None: a cron expression (not emulated; reported)
    function_logical_ids: tuple[str, ...]
    enabled: bool


@dataclass
class ApiSpec:
    rest_api_id: str
    stage: str
    routes: list[RouteSpec]
    gateway_responses: dict[str, dict[str, Any]] = field(default_factory=dict)  # type -> {status, template}
    throttle_rate: float | None = None
    throttle_burst: int | None = None
    api_key_source: str = "HEADER"  # the RestApi's ApiKeySourceType: HEADER (x-api-key) or AUTHORIZER


def _ref(value: Any) -> str | None:
    """The logical id a ``Ref`` or ``Fn::GetAtt`` points at, searched anywhere inside ``value``."""
    if isinstance(value, dict):
        if "Ref" in value and isinstance(value["Ref"], str):
            return str(value["Ref"])
        if "Fn::GetAtt" in value:
            return str(value["Fn::GetAtt"][0])
        for inner in value.values():
            found = _ref(inner)
            if found:
                return found
    if isinstance(value, list):
        for inner in value:
            found = _ref(inner)
            if found:
                return found
    return None


def _function_refs(value: Any, functions: set[str]) -> list[str]:
    found: list[str] = []
    if isinstance(value, dict):
        if "Fn::GetAtt" in value and value["Fn::GetAtt"][0] in functions:
            return [str(value["Fn::GetAtt"][0])]
        if "Ref" in value and value["Ref"] in functions:
            return [str(value["Ref"])]
        for inner in value.values():
            found += _function_refs(inner, functions)
    elif isinstance(value, list):
        for inner in value:
            found += _function_refs(inner, functions)
    return found


def _extracted(s3: Any, code: dict[str, Any], code_root: Path) -> Path:
    """The zip an asset's ``S3Bucket``/``S3Key`` names, extracted once under ``code_root``."""
    bucket = _substitute(
        code["S3Bucket"]["Fn::Sub"] if isinstance(code["S3Bucket"], dict) else code["S3Bucket"]
    )
    key = code["S3Key"]
    code_dir = code_root / Path(key).stem
    if not code_dir.exists():
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        staging = code_dir.with_name(code_dir.name + ".partial")
        with zipfile.ZipFile(io.BytesIO(body)) as archive:
            archive.extractall(staging)
        staging.rename(code_dir)
    return code_dir


def functions(
    aws: EmbeddedAws, assembly: CloudAssembly, deployment: Deployment, code_root: Path
) -> dict[str, FunctionSpec]:
    """Each function's resolved configuration, its code and the stack's own layers it uses, extracted.

    A layer from outside the stack (Powertools') is a stand-in (``deploy.publish_layer_stand_ins``):
    what it holds comes from the virtualenv.
    """
    lam, s3 = aws.client("lambda"), aws.client("s3")
    layers = assembly.resources("AWS::Lambda::LayerVersion")
    specs: dict[str, FunctionSpec] = {}
    for logical_id, resource in assembly.resources("AWS::Lambda::Function").items():
        name = deployment.physical_ids[logical_id]
        config = lam.get_function_configuration(FunctionName=name)
        properties = resource["Properties"]
        own_layers = [_ref(layer) for layer in properties.get("Layers", [])]
        specs[logical_id] = FunctionSpec(
            logical_id=logical_id,
            name=name,
            arn=config["FunctionArn"],
            handler=config["Handler"],
            timeout_s=int(config.get("Timeout", 3)),
            memory_mb=int(config.get("MemorySize", 128)),
            environment=dict(config.get("Environment", {}).get("Variables", {})),
            code_dir=_extracted(s3, properties["Code"], code_root),
            layer_dirs=tuple(
                _extracted(s3, layers[layer]["Properties"]["Content"], code_root)
                for layer in own_layers
                if layer in layers
            ),
        )
    return specs


def mapping_concurrency(assembly: CloudAssembly) -> dict[str, int]:
    """Per function (logical id): how many invocations its SQS mappings may run at once.

    The sum over the function's mappings of the template's ``ScalingConfig.MaximumConcurrency``, or
    for a mapping in provisioned mode, of what its ``MaximumPollers`` run (``INVOCATIONS_PER_POLLER``
    each; 200 pollers when the bound is left out, as in Lambda). A mapping with neither (a Kinesis
    stream's, or an SQS mapping left to scale) adds nothing.
    """
    out: dict[str, int] = {}
    for resource in assembly.resources("AWS::Lambda::EventSourceMapping").values():
        properties = resource.get("Properties", {})
        function = _ref(properties.get("FunctionName"))
        limit = (properties.get("ScalingConfig") or {}).get("MaximumConcurrency")
        pollers = properties.get("ProvisionedPollerConfig")
        if isinstance(pollers, dict):
            maximum = pollers.get("MaximumPollers", 200)
            limit = maximum * INVOCATIONS_PER_POLLER if isinstance(maximum, int) else None
        if function is not None and isinstance(limit, int):
            out[function] = out.get(function, 0) + limit
    return out


def mappings(aws: EmbeddedAws, assembly: CloudAssembly, deployment: Deployment) -> list[MappingSpec]:
    by_name = {
        deployment.physical_ids[logical_id]: logical_id
        for logical_id in assembly.resources("AWS::Lambda::Function")
    }
    lam, sqs = aws.client("lambda"), aws.client("sqs")
    specs = []
    for logical_id in assembly.resources("AWS::Lambda::EventSourceMapping"):
        uuid = deployment.physical_ids.get(logical_id)
        if uuid is None:
            continue
        config = lam.get_event_source_mapping(UUID=uuid)
        function_name = config["FunctionArn"].split(":function:")[-1].split(":")[0]
        source = config["EventSourceArn"]
        queue_url = None
        if ":sqs:" in source:
            queue_url = sqs.get_queue_url(QueueName=source.rsplit(":", 1)[-1])["QueueUrl"]
        specs.append(MappingSpec(uuid, by_name[function_name], source, queue_url))
    return specs


def _resource_path(resources: dict[str, Any], logical_id: str | None) -> str:
    parts = []
    while logical_id and logical_id in resources:
        properties = resources[logical_id]["Properties"]
        parts.append(properties["PathPart"])
        logical_id = _ref(properties.get("ParentId")) if "Ref" in properties.get("ParentId", {}) else None
    return "/" + "/".join(reversed(parts))


def api(assembly: CloudAssembly, deployment: Deployment) -> ApiSpec | None:
    apis = assembly.resources("AWS::ApiGateway::RestApi")
    if not apis:
        return None
    api_logical = next(iter(apis))
    template_resources = assembly.template["Resources"]
    function_ids = set(assembly.resources("AWS::Lambda::Function"))
    path_resources = assembly.resources("AWS::ApiGateway::Resource")
    models = assembly.resources("AWS::ApiGateway::Model")
    routes = []
    for method in assembly.resources("AWS::ApiGateway::Method").values():
        props = method["Properties"]
        if props.get("HttpMethod") == "OPTIONS":
            continue
        resource_ref = props.get("ResourceId", {})
        path = _resource_path(path_resources, resource_ref.get("Ref")) if "Ref" in resource_ref else "/"
        targets = _function_refs(props.get("Integration", {}).get("Uri"), function_ids)
        if not targets:
            continue
        authorizer = None
        if props.get("AuthorizationType") == "CUSTOM":
            auth_props = template_resources[_ref(props["AuthorizerId"]) or ""]["Properties"]
            identity = [
                part.strip().removeprefix("method.request.header.")
                for part in str(auth_props.get("IdentitySource", "")).split(",")
                if part.strip().startswith("method.request.header.")
            ]
            authorizer = AuthorizerSpec(
                function_logical_id=_function_refs(auth_props["AuthorizerUri"], function_ids)[0],
                identity_headers=tuple(identity),
                ttl_seconds=int(auth_props.get("AuthorizerResultTtlInSeconds", 300)),
            )
        schema = None
        for model_ref in (props.get("RequestModels") or {}).values():
            model = models.get(_ref(model_ref) or "")
            if model:
                schema = model["Properties"].get("Schema")
        routes.append(
            RouteSpec(
                props["HttpMethod"],
                path,
                targets[0],
                authorizer,
                schema,
                api_key_required=str(props.get("ApiKeyRequired", False)).lower() == "true",
            )
        )
    responses = {}
    for response in assembly.resources("AWS::ApiGateway::GatewayResponse").values():
        props = response["Properties"]
        responses[props["ResponseType"]] = {
            "status": int(props.get("StatusCode", 0)) or None,
            "template": (props.get("ResponseTemplates") or {}).get("application/json"),
            "headers": props.get("ResponseParameters") or {},
        }
    stage_name, rate, burst = "prod", None, None
    for stage in assembly.resources("AWS::ApiGateway::Stage").values():
        props = stage["Properties"]
        stage_name = props.get("StageName", stage_name)
        for setting in props.get("MethodSettings", []):
            if setting.get("HttpMethod") == "*" and setting.get("ResourcePath") in ("/*", "/*/*"):
                rate = setting.get("ThrottlingRateLimit", rate)
                burst = setting.get("ThrottlingBurstLimit", burst)
    return ApiSpec(
        rest_api_id=deployment.physical_ids.get(api_logical, "local"),
        stage=stage_name,
        routes=routes,
        gateway_responses=responses,
        throttle_rate=float(rate) if rate is not None else None,
        throttle_burst=int(burst) if burst is not None else None,
        api_key_source=str(apis[api_logical]["Properties"].get("ApiKeySourceType") or "HEADER"),
    )


_RATE = re.compile(r"^rate\((\d+)\s+(minute|minutes|hour|hours|day|days)\)$")
_UNIT_SECONDS = {"minute": 60, "hour": 3600, "day": 86400}


def schedules(assembly: CloudAssembly) -> list[ScheduleSpec]:
    function_ids = set(assembly.resources("AWS::Lambda::Function"))
    specs = []
    for logical_id, rule in assembly.resources("AWS::Events::Rule").items():
        props = rule["Properties"]
        expression = props.get("ScheduleExpression")
        if not expression:
            continue
        match = _RATE.match(expression.strip())
        period = float(int(match[1]) * _UNIT_SECONDS[match[2].rstrip("s")]) if match else None
        targets = tuple(
            t for target in props.get("Targets", []) for t in _function_refs(target.get("Arn"), function_ids)
        )
        specs.append(
            ScheduleSpec(logical_id, expression, period, targets, props.get("State", "ENABLED") == "ENABLED")
        )
    return specs
