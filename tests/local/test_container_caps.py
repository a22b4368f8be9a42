"""How many execution environments the runtime gives each function: its mappings' concurrency, within caps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from local.emulator.assembly import CloudAssembly
from local.emulator.discovery import ApiSpec, AuthorizerSpec, RouteSpec, mapping_concurrency
from local.emulator.runtime import RuntimeOptions, container_cap, serving_functions, warm_count


def sqs_mapping(function: str, queue: str, maximum: int | None) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "FunctionName": {"Ref": function},
        "EventSourceArn": {"Fn::GetAtt": [queue, "Arn"]},
    }
    if maximum is not None:
        properties["ScalingConfig"] = {"MaximumConcurrency": maximum}
    return {"Type": "AWS::Lambda::EventSourceMapping", "Properties": properties}


def test_a_functions_mapping_concurrency_is_the_sum_over_its_mappings() -> None:
    resources = {
        **{f"Live{i}Mapping": sqs_mapping("LiveWorker", f"Live{i}", 2) for i in range(9)},
        "SpilloverMapping": sqs_mapping("SidelineWorker", "Spillover", 2),
        "BacklogMapping": sqs_mapping("SidelineWorker", "Backlog", 3),
        "Unbounded": sqs_mapping("Other", "Queue", None),
        "Stream": {
            "Type": "AWS::Lambda::EventSourceMapping",
            "Properties": {"FunctionName": {"Ref": "Consumer"}, "ParallelizationFactor": 2},
        },
        "LiveWorker": {"Type": "AWS::Lambda::Function", "Properties": {}},
    }
    assembly = CloudAssembly(Path("cdk.out"), "Stack", {"Resources": resources})

    assert mapping_concurrency(assembly) == {"LiveWorker": 18, "SidelineWorker": 5}


def test_a_function_gets_more_containers_only_as_far_as_its_mappings_and_the_cap_allow() -> None:
    options = RuntimeOptions(max_containers=6, mapping_containers=10)

    assert container_cap(options, 0) == 6  # no mappings (the API's functions)
    assert container_cap(options, 4) == 6  # mappings that allow fewer: never below the default
    assert container_cap(options, 8) == 8
    assert container_cap(options, 18) == 10  # the host's cap
    assert container_cap(RuntimeOptions(max_containers=6, mapping_containers=0), 18) == 6  # none for mappings
    assert container_cap(RuntimeOptions(max_containers=6), 18) == 18  # no cap: as many as Lambda would run


def test_the_functions_a_mapping_or_the_api_invokes_are_warmed_in_full_the_others_with_one() -> None:
    api = ApiSpec(
        rest_api_id="api",
        stage="dev",
        routes=[
            RouteSpec(
                "POST", "/v1/messages", "Ingest", AuthorizerSpec("Authorizer", ("authorization",), 300)
            ),
            RouteSpec("POST", "/v1/events", "Events", None),
        ],
    )
    busy = serving_functions({"LiveWorker": 18, "SidelineWorker": 5}, api)
    assert busy == {"LiveWorker", "SidelineWorker", "Ingest", "Authorizer", "Events"}
    options = RuntimeOptions(warm_containers=10, warm_others=1)
    assert [warm_count(options, name, busy) for name in ("LiveWorker", "Ingest", "Controller")] == [10, 10, 1]
    every = RuntimeOptions(warm_containers=10)
    assert warm_count(every, "Controller", busy) == 10  # unset: every function as the busy ones
    assert serving_functions({}, None) == set()
