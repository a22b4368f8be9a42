"""The per-tenant views read fields the handlers really log: every field a synthesized Contributor
Insights rule or saved Logs Insights query names is in the JSON lines the worker and ingest print,
as a scalar of the type the rule or query uses it as.

The field names come from the synthesized template (the rules' ``Keys``, ``ValueOf`` and ``Filters``,
the queries' text), never from a second list here.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from breakwater import processor
from breakwater.observability import logger
from breakwater.processor import WorkContext
from tests.infrastructure.conftest import Synth, synthesize
from tests.integration import worker_fixtures
from tests.integration.apigateway import ApiGateway
from tests.integration.conftest import START
from tests.integration.worker_fixtures import MAX_RECEIVE_COUNT, WorkerWorld, load, make_envelope

world = worker_fixtures.world  # the fixture

Line = dict[str, Any]
# Logs Insights words that are not fields: commands, operators, functions, sort orders.
_QUERY_WORDS = {
    "fields", "filter", "stats", "sort", "limit", "display", "by", "as", "and", "or", "not", "in", "like",
    "desc", "asc", "count", "sum", "max", "min", "avg", "pct", "bin",
}  # fmt: skip
_AGGREGATES = ("sum", "max", "min", "avg", "pct")


class Views:
    """The template's rules and saved queries, each with the kind of log group it reads."""

    def __init__(self, synth: Synth) -> None:
        stack = synth.breakwater
        kinds = {
            synth.logical_id(stack.consumers.live_worker.log_group): "worker",
            synth.logical_id(stack.consumers.sideline_worker.log_group): "worker",
            synth.logical_id(stack.ingest.log_group): "front door",
        }
        if stack.streaming is not None:
            kinds[synth.logical_id(stack.streaming.events.log_group)] = "front door"
        self.rules: list[tuple[str, dict[str, Any]]] = []
        for rule in synth.of_type("AWS::CloudWatch::InsightRule").values():
            _, parts = rule["Properties"]["RuleBody"]["Fn::Join"]  # the log group names are references
            refs = [part["Ref"] for part in parts if isinstance(part, dict)]
            body = json.loads("".join(part if isinstance(part, str) else "log-group" for part in parts))
            self.rules.append((_one_kind(kinds, refs), body))
        self.queries: list[tuple[str, str]] = []
        for query in synth.of_type("AWS::Logs::QueryDefinition").values():
            props = query["Properties"]
            refs = [group["Ref"] for group in props["LogGroupNames"]]
            self.queries.append((_one_kind(kinds, refs), props["QueryString"]))


def _one_kind(kinds: dict[str, str], refs: list[str]) -> str:
    (kind,) = {kinds[ref] for ref in refs}  # a view reads the worker's lines or the front door's
    return kind


@pytest.fixture(scope="module")
def views(tmp_path_factory: pytest.TempPathFactory) -> Views:
    return Views(synthesize(tmp_path_factory.mktemp("cdk-views")))


@pytest.fixture
def printed(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """What the functions' logger prints from now on (its handler writes to this buffer instead)."""
    buffer = io.StringIO()
    monkeypatch.setattr(logger.registered_handler, "stream", buffer)
    yield buffer


def json_lines(buffer: io.StringIO) -> list[Line]:
    return [json.loads(line) for line in buffer.getvalue().splitlines() if line.startswith("{")]


# --- what a rule and a query name ------------------------------------------------------------------------


def _field(path: str) -> str:
    assert path.startswith("$.") and "." not in path[2:], path  # a top-level field of the JSON line
    return path[2:]


def _matches(line: Line, filters: list[dict[str, Any]]) -> bool:
    """Whether a rule's filters (all of them) select ``line``."""
    for condition in filters:
        value = line.get(_field(condition["Match"]))
        if "In" in condition:
            if value not in condition["In"]:
                return False
        elif "GreaterThan" in condition:
            if not isinstance(value, int | float) or not value > condition["GreaterThan"]:
                return False
        else:
            raise AssertionError(f"a filter this test does not evaluate: {condition}")
    return True


def check_rule(body: dict[str, Any], lines: list[Line]) -> None:
    """Some line is selected by the rule, and in each such line the keys are scalars and the summed and
    compared fields are numbers."""
    contribution = body["Contribution"]
    selected = [line for line in lines if _matches(line, contribution["Filters"])]
    assert selected, f"no printed line is selected by {contribution}"
    numeric = [_field(c["Match"]) for c in contribution["Filters"] if "GreaterThan" in c]
    if "ValueOf" in contribution:
        numeric.append(_field(contribution["ValueOf"]))
    for line in selected:
        for key in contribution["Keys"]:
            assert isinstance(line.get(_field(key)), str | int), (key, line)
        for name in numeric:
            value = line.get(name)
            assert isinstance(value, int | float) and not isinstance(value, bool), (name, line)


def query_fields(query: str) -> tuple[set[str], set[str]]:
    """The log fields a Logs Insights query names, and those of them it uses as numbers."""
    text = re.sub(r'"[^"]*"|/[^/]*/', " ", query)  # no string literals, no regular expressions
    aliases = set(re.findall(r"\bas\s+(\w+)", text))
    words = set(re.findall(r"(?<![\w@.])[A-Za-z_]\w*", text))
    names = words - _QUERY_WORDS - aliases
    numeric = {
        name
        for name in names
        if re.search(rf"\b(?:{'|'.join(_AGGREGATES)})\(\s*{name}\b", text)
        or re.search(rf"\b{name}\s*[<>]", text)
    }
    return names, numeric


def check_query(query: str, lines: list[Line]) -> None:
    """Every field the query names is in a printed line of a tenant, a scalar; a number where the query
    sums, ranks or compares it."""
    names, numeric = query_fields(query)
    assert "tenant" in names  # each saved query shows one tenant
    per_tenant = [line for line in lines if isinstance(line.get("tenant"), str)]
    for name in names:
        values = [line[name] for line in per_tenant if name in line]
        assert values, f"no printed line of a tenant has {name!r} (query: {query})"
        for value in values:
            assert isinstance(value, str | int | float) and not isinstance(value, bool), (name, value)
            if name in numeric:
                assert isinstance(value, int | float), (name, value)


def test_the_query_parser_reads_fields_not_words_aliases_or_literals() -> None:
    query = (
        'filter message = "tenant batch" and tenant = "x" and first_attempts > 0\n'
        "| stats pct(age_ms, 99) as p99_ms, count() as n by bin(5m), status\n"
        "| filter message like /^processing (failed|cancelled)/\n| sort @timestamp desc"
    )
    assert query_fields(query) == (
        {"message", "tenant", "first_attempts", "age_ms", "status"},
        {"first_attempts", "age_ms"},
    )


# --- the lines the handlers print ------------------------------------------------------------------------


def test_every_worker_field_the_views_name_is_in_the_worker_s_lines(
    world: WorkerWorld, monkeypatch: pytest.MonkeyPatch, printed: io.StringIO, views: Views
) -> None:
    def globex_fails(envelope: Any, work: WorkContext) -> dict[str, Any]:
        if envelope.tenant == "globex":
            raise RuntimeError("the processor cannot take this payload")
        return {}

    monkeypatch.setattr(processor, "process", globex_fails)
    world.send("live-0", make_envelope("acme", age_ms=1_500))  # processed
    world.send("live-0", make_envelope("acme", age_ms=600_000))  # older than the sideline age: set aside
    world.send("live-0", make_envelope("globex", age_ms=2_000))  # fails every time, then dead-lettered
    handler = load(monkeypatch, "worker.handler", world.environment())

    for _ in range(MAX_RECEIVE_COUNT):
        world.deliver(handler, "live-0", requeue_failures=True)

    lines = json_lines(printed)
    batches = [line for line in lines if line.get("message") == "tenant batch"]
    by_tenant = {(line["tenant"], line["dead_lettered"]): line for line in batches}
    acme, globex = by_tenant[("acme", 0)], by_tenant[("globex", 1)]
    assert (acme["processed"], acme["sidelined"], acme["set_aside"], acme["first_attempts"]) == (1, 1, 1, 2)
    assert acme["first_attempt_age_ms_max"] >= 600_000
    assert globex["failed"] == 1 and globex["processed"] == 0
    assert len(batches) == 3  # one per tenant per batch: acme and globex, then globex again
    worker_rules = [body for kind, body in views.rules if kind == "worker"]
    worker_queries = [query for kind, query in views.queries if kind == "worker"]
    assert len(worker_rules) == 3 and len(worker_queries) == 2  # with the front door's: every view
    for body in worker_rules:
        check_rule(body, lines)
    for query in worker_queries:
        check_query(query, lines)


def test_every_front_door_field_the_views_name_is_in_ingest_s_lines(
    api: ApiGateway, printed: io.StringIO, views: Views, tenant_table_adapter: Any
) -> None:
    key = tenant_table_adapter.create("acme", "standard", now=START)
    statuses = [api.request(key, {"type": "t"}).status for _ in range(12)]  # past the burst of 10
    statuses.append(api.request(key, None, raw="{not json").status)

    assert statuses.count(429) >= 1 and statuses[-1] == 400
    lines = json_lines(printed)
    refusals = [line for line in lines if line.get("message") in {"throttled", "rejected"}]
    assert {(line["tenant"], line["status"]) for line in refusals} == {("acme", 429), ("acme", 400)}
    front_door_rules = [body for kind, body in views.rules if kind == "front door"]
    front_door_queries = [query for kind, query in views.queries if kind == "front door"]
    assert len(front_door_rules) == 1 and len(front_door_queries) == 1
    for body in front_door_rules:
        check_rule(body, lines)
    for query in front_door_queries:
        check_query(query, lines)
