"""The front door: a REST API whose every method sits behind the tenant authorizer.

``POST /v1/messages`` is validated against a JSON schema before it costs a Lambda invocation; every
error API Gateway produces itself is a JSON body naming the problem; the stage throttles as
configured, traces and writes structured access logs to an encrypted, retained log group.
"""

from __future__ import annotations

import json

from aws_cdk import Duration, Fn, RemovalPolicy
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from stacks.config import BlueprintConfig
from stacks.functions import RETENTION, encrypted_log_group

STAGE_NAME = "prod"

_ACCESS_LOG_FIELDS = {
    "requestId": "$context.requestId",
    "requestTime": "$context.requestTime",
    "ip": "$context.identity.sourceIp",
    "httpMethod": "$context.httpMethod",
    "resourcePath": "$context.resourcePath",
    "status": "$context.status",
    "responseLength": "$context.responseLength",
    "latencyMs": "$context.responseLatency",
    "integrationLatencyMs": "$context.integrationLatency",
    "tenant": "$context.authorizer.principalId",
    "errorType": "$context.error.responseType",
    "error": "$context.error.message",
    "xrayTraceId": "$context.xrayTraceId",
}

# (response type, status, error code). Templates are simple substitution, not VTL:
# $context.error.messageString is already a quoted JSON string.
_GATEWAY_ERRORS = [
    (apigw.ResponseType.UNAUTHORIZED, "401", "unauthorized"),
    (apigw.ResponseType.ACCESS_DENIED, "403", "forbidden"),
    (apigw.ResponseType.REQUEST_TOO_LARGE, "413", "payload_too_large"),
    (apigw.ResponseType.THROTTLED, "429", "throttled"),
    (apigw.ResponseType.DEFAULT_4_XX, None, "bad_request"),
    (apigw.ResponseType.DEFAULT_5_XX, None, "internal_error"),
]


class Ingress(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: BlueprintConfig,
        key: kms.IKey,
        authorizer_function: lambda_.IFunction,
        ingest_function: lambda_.IFunction,
    ) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self.access_logs = encrypted_log_group(self, "AccessLogs", config=config, key=key)
        self.authorizer = apigw.RequestAuthorizer(
            self,
            "TenantAuthorizer",
            handler=authorizer_function,
            identity_sources=[apigw.IdentitySource.header("Authorization")],
            results_cache_ttl=Duration.seconds(config.api.authorizer_cache_seconds),
        )
        self.api = self._build_api()
        self._build_execution_log_group(key)
        self._build_gateway_responses()
        self._build_messages_route(ingest_function)

    @property
    def url(self) -> str:
        return self.api.url

    def _build_api(self) -> apigw.RestApi:
        return apigw.RestApi(
            self,
            "Api",
            rest_api_name=f"{self._config.service_name}-api",
            description="Breakwater ingest API: tenant-authenticated, validated, throttled",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            # Access logging needs the account-level CloudWatch role of API Gateway.
            cloud_watch_role=True,
            default_method_options=apigw.MethodOptions(
                authorizer=self.authorizer, authorization_type=apigw.AuthorizationType.CUSTOM
            ),
            deploy_options=apigw.StageOptions(
                stage_name=STAGE_NAME,
                throttling_rate_limit=self._config.api.throttle_rate,
                throttling_burst_limit=self._config.api.throttle_burst,
                tracing_enabled=self._config.functions.tracing,
                logging_level=apigw.MethodLoggingLevel.ERROR,
                data_trace_enabled=False,
                metrics_enabled=True,
                access_log_destination=apigw.LogGroupLogDestination(self.access_logs),
                access_log_format=apigw.AccessLogFormat.custom(json.dumps(_ACCESS_LOG_FIELDS)),
            ),
        )

    def _build_execution_log_group(self, key: kms.IKey) -> None:
        # API Gateway would create this group itself, unencrypted and kept forever; own it instead.
        group = logs.LogGroup(
            self,
            "ExecutionLogs",
            log_group_name=Fn.join(
                "", ["API-Gateway-Execution-Logs_", self.api.rest_api_id, f"/{STAGE_NAME}"]
            ),
            retention=RETENTION[self._config.functions.log_retention_days],
            encryption_key=key,
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.api.deployment_stage.node.add_dependency(group)

    def _build_gateway_responses(self) -> None:
        self.api.add_gateway_response(
            "InvalidBody",
            type=apigw.ResponseType.BAD_REQUEST_BODY,
            status_code="400",
            templates={
                "application/json": (
                    '{"error":"invalid_body","message":"$context.error.validationErrorString",'
                    '"request_id":"$context.requestId"}'
                )
            },
        )
        for response_type, status, code in _GATEWAY_ERRORS:
            headers = {"Retry-After": "'1'"} if status == "429" else None
            self.api.add_gateway_response(
                f"Error{code.title().replace('_', '')}",
                type=response_type,
                status_code=status,
                response_headers=headers,
                templates={
                    "application/json": (
                        f'{{"error":"{code}","message":$context.error.messageString,'
                        '"request_id":"$context.requestId"}'
                    )
                },
            )

    def _build_messages_route(self, ingest_function: lambda_.IFunction) -> None:
        validator = self.api.add_request_validator(
            "BodyValidator", validate_request_body=True, validate_request_parameters=True
        )
        model = self.api.add_model(
            "MessageModel",
            content_type="application/json",
            model_name="Message",
            schema=_message_schema(self._config.ingest.max_ttl_seconds),
        )
        messages = self.api.root.add_resource("v1").add_resource("messages")
        self.post_message = messages.add_method(
            "POST",
            apigw.LambdaIntegration(ingest_function, proxy=True, allow_test_invoke=False),
            request_validator=validator,
            request_models={"application/json": model},
        )


def _message_schema(max_ttl_seconds: int) -> apigw.JsonSchema:
    """The body of POST /v1/messages; the tenant never comes from the body (additionalProperties: false)."""
    string = apigw.JsonSchemaType.STRING
    return apigw.JsonSchema(
        schema=apigw.JsonSchemaVersion.DRAFT4,
        title="Message",
        type=apigw.JsonSchemaType.OBJECT,
        required=["type"],
        additional_properties=False,
        properties={
            "type": apigw.JsonSchema(type=string),
            "payload": apigw.JsonSchema(description="any JSON value"),
            "dedup_key": apigw.JsonSchema(type=string),
            "ordering_key": apigw.JsonSchema(type=string),
            "ttl_seconds": apigw.JsonSchema(
                type=apigw.JsonSchemaType.INTEGER, minimum=1, maximum=max_ttl_seconds
            ),
        },
    )
