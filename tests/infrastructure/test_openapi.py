"""The published OpenAPI document (docs/openapi.json) is the API the stack builds.

It must be what ``make openapi`` writes now, a valid OpenAPI 3.1 document, and agree with the
synthesized template: the same methods on the same paths (a route added to the stack and not to
the document fails here), each body the schema of the method's API Gateway model, and every
status a gateway response can answer with listed, its body matching the gateway's error schema.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from openapi_spec_validator import validate

from breakwater_cdk.openapi import DOCUMENT, build_document, openapi_schema, render
from tests.infrastructure.conftest import Synth

pytestmark = pytest.mark.slow


def api_methods(synth: Synth) -> dict[tuple[str, str], dict[str, Any]]:
    """(path, lower-case method) -> the method's properties, for every AWS::ApiGateway::Method."""
    resources = synth.of_type("AWS::ApiGateway::Resource")

    def path_of(resource: Any) -> str:
        if not isinstance(resource, dict) or "Ref" not in resource:
            return ""  # the API's root resource (Fn::GetAtt RootResourceId)
        properties = resources[resource["Ref"]]["Properties"]
        return f"{path_of(properties['ParentId'])}/{properties['PathPart']}"

    return {
        (
            path_of(method["Properties"]["ResourceId"]) or "/",
            method["Properties"]["HttpMethod"].lower(),
        ): method["Properties"]
        for method in synth.of_type("AWS::ApiGateway::Method").values()
    }


def operations(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(path, method) for path, item in document["paths"].items() for method in item}


def test_the_committed_document_is_what_make_openapi_writes(synth: Synth) -> None:
    # make openapi documents cdk.json's settings: the service's name, not one instance's
    expected = render(build_document(synth.config.model_copy(update={"service_name": "breakwater"})))
    assert DOCUMENT.read_text(encoding="utf-8") == expected, "docs/openapi.json is stale: run make openapi"
    validate(json.loads(expected))  # OpenAPI 3.0, schemas included


@pytest.mark.parametrize("which", ["synth", "ordered_synth"])
def test_the_document_has_every_method_of_the_template_and_no_other(
    which: str, request: pytest.FixtureRequest
) -> None:
    synth: Synth = request.getfixturevalue(which)
    document = build_document(synth.config)
    methods = api_methods(synth)
    assert operations(document) == set(methods)


@pytest.mark.parametrize("which", ["synth", "ordered_synth"])
def test_each_body_is_the_schema_of_its_api_gateway_model(which: str, request: pytest.FixtureRequest) -> None:
    synth: Synth = request.getfixturevalue(which)
    document = build_document(synth.config)
    for (path, method), properties in api_methods(synth).items():
        (content_type, model_ref), *others = properties["RequestModels"].items()
        assert not others
        model = synth.resources[model_ref["Ref"]]["Properties"]
        body = document["paths"][path][method]["requestBody"]
        assert body["required"] is True
        ref = body["content"][content_type]["schema"]["$ref"]
        assert ref == f"#/components/schemas/{model['Name']}"
        in_template = {key: value for key, value in model["Schema"].items() if key != "$schema"}
        assert document["components"]["schemas"][model["Name"]] == openapi_schema(in_template)


def test_every_gateway_response_is_documented_and_matches_the_gateway_error_schema(synth: Synth) -> None:
    document = build_document(synth.config)
    gateway_error = document["components"]["schemas"]["GatewayError"]
    for response in synth.of_type("AWS::ApiGateway::GatewayResponse").values():
        properties = response["Properties"]
        # What API Gateway substitutes: $context.error.messageString is a quoted JSON string.
        body = (
            properties["ResponseTemplates"]["application/json"]
            .replace("$context.error.messageString", json.dumps("a message"))
            .replace("$context.error.validationErrorString", "[a validation error]")
            .replace("$context.requestId", "a-request-id")
        )
        jsonschema.validate(json.loads(body), gateway_error)
        status = properties.get("StatusCode")
        if status is None or status.startswith("5"):
            continue  # DEFAULT_4XX and DEFAULT_5XX take the status of what they stand for
        for path, item in document["paths"].items():
            for method, operation in item.items():
                answer = operation["responses"].get(status)
                assert answer is not None, (properties["ResponseType"], status, path, method)
                if "$ref" in answer:
                    answer = document["components"]["responses"][answer["$ref"].rsplit("/", 1)[1]]
                schema = answer["content"]["application/json"]["schema"]
                refs = [schema] if "$ref" in schema else schema["oneOf"]
                assert {"$ref": "#/components/schemas/GatewayError"} in refs, (status, path)
                if "ResponseParameters" in properties and "Retry-After" in json.dumps(properties):
                    assert "Retry-After" in answer["headers"], (status, path)
