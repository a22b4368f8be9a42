"""The published OpenAPI document (docs/openapi.json) is the API the stack builds.

It must be what ``make openapi`` writes now, a valid OpenAPI 3.1 document, and agree with the
synthesized template: the same methods on the same paths (a route added to the stack and not to
the document fails here), each body the schema of the method's API Gateway model, and every
status a gateway response can answer with listed. Every error answer, a gateway response's and a
handler's alike, is the document's one problem details schema.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from openapi_spec_validator import validate

from breakwater.errors import PROBLEM_MEDIA_TYPE, BadRequestError, ThrottledError
from breakwater.events import StreamEvent
from breakwater.events_ingest import answer
from breakwater.ordered_ingest import GroupBacklogFullError
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


def problem_validator(document: dict[str, Any], schema: str) -> jsonschema.Draft4Validator:
    """A validator of the document's ``schema``, its references resolved within the document."""
    return jsonschema.Draft4Validator({"$ref": f"#/components/schemas/{schema}", **document})


def test_every_gateway_response_is_documented_and_is_a_problem(synth: Synth) -> None:
    document = build_document(synth.config)
    problem = problem_validator(document, "Problem")
    for response in synth.of_type("AWS::ApiGateway::GatewayResponse").values():
        properties = response["Properties"]
        # What API Gateway substitutes: $context.error.messageString is a quoted JSON string.
        body = json.loads(
            properties["ResponseTemplates"]["application/json"]
            .replace("$context.error.messageString", json.dumps("a message"))
            .replace("$context.error.validationErrorString", "[a validation error]")
            .replace("$context.requestId", "a-request-id")
        )
        problem.validate(body)
        status = properties["StatusCode"]
        assert body["status"] == int(status) and body["type"].endswith("/" + body["code"]), body
        headers = properties["ResponseParameters"]
        assert headers["gatewayresponse.header.Content-Type"] == f"'{PROBLEM_MEDIA_TYPE}'"
        if status.startswith("5"):
            continue  # failures: the document's description covers them
        for path, item in document["paths"].items():
            for method, operation in item.items():
                answer = operation["responses"].get(status)
                assert answer is not None, (properties["ResponseType"], status, path, method)
                if "$ref" in answer:
                    answer = document["components"]["responses"][answer["$ref"].rsplit("/", 1)[1]]
                schema = answer["content"][PROBLEM_MEDIA_TYPE]["schema"]
                refs = [schema] if "$ref" in schema else schema["anyOf"]
                assert {"$ref": "#/components/schemas/Problem"} in refs, (status, path)
                if "gatewayresponse.header.Retry-After" in headers:
                    assert "Retry-After" in answer["headers"], (status, path)


def test_a_handlers_error_answers_are_the_same_problem_as_the_gateways(synth: Synth) -> None:
    document = build_document(synth.config)
    problem = problem_validator(document, "Problem")
    refusals = [
        BadRequestError("'type' must be a string, got 1", code="invalid_field"),
        ThrottledError("over its rate", retry_after=2.0),
        GroupBacklogFullError("acme:A", 10, 10),
    ]
    for error in refusals:
        body = error.body()
        problem.validate(body)
        assert (body["status"], body["code"], body["detail"]) == (error.status, error.code, error.message)
    one = StreamEvent(id="0" * 26, tenant="acme", type="t", received_at=0)
    refused = answer([one], FakePut(), refused=1)  # over the tenant's event rate: none written
    assert refused.status == 429
    problem_validator(document, "EventsProblem").validate(refused.body)
    assert refused.body["results"][0]["status"] == "throttled"


class FakePut:
    written: dict[int, Any] = {}
    failed: dict[int, str] = {}
    throttled = False
