"""The simulator's AWS usage: counted as AWS bills it, priced with local/pricing."""

from __future__ import annotations

from typing import Any

import pytest
import simpy

import sim  # noqa: F401
from breakwater.concurrency import ConcurrencyLimits, Grant
from local.pricing.cost import services
from sim.billing import CONTROLLER_MEMORY_MB, Billing, Meter, usage
from sim.config import blueprint, load_context
from sim.gates import LeaseTable
from sim.lambda_esm import LONG_POLL_S, EventSourceMapping, FunctionConcurrency, Invocation
from sim.messages import Message
from sim.run import run_scenario
from sim.scenarios import seed_scale
from sim.sqs import SqsQueue
from sim.worker import Costs

COSTS = Costs()


@pytest.fixture(scope="module")
def tiny() -> dict[str, dict[str, Any]]:
    config = blueprint(load_context(), [{"worker": {"max_concurrency": 2}}])
    scenario = seed_scale(
        "noisy",
        config,
        tenants=50,
        baseline_s=120,
        event_s=120,
        after_s=600,
        costs=COSTS,
    )
    return run_scenario(scenario, config, costs=COSTS, configurations=("naive", "breakwater")).results


def test_every_delivered_message_costs_sqs_requests(tiny: dict[str, dict[str, Any]]) -> None:
    naive = tiny["naive"]
    counted = naive["cost"]["usage"]
    # a SendMessage per message accepted, and receives and deletes on top
    assert counted["sqs.standard_requests"] >= naive["processed"] > 0
    assert counted["apigateway.rest_requests"] == naive["accepted"]  # nothing is throttled in naive
    assert "dynamodb.write_request_units" not in counted  # no gates, no counters, no controller


def test_breakwater_pays_for_its_gates_and_controller_in_dynamodb(tiny: dict[str, dict[str, Any]]) -> None:
    breakwater = tiny["breakwater"]
    counted = breakwater["cost"]["usage"]
    assert counted["dynamodb.write_request_units"] > breakwater["processed"]  # a gate write per batch
    assert counted["dynamodb.read_request_units"] > 0
    # the usage plan's refusals are answered by API Gateway, unbilled: fewer requests than offered
    assert counted["apigateway.rest_requests"] < breakwater["offered"]


def test_dollars_per_million_are_positive_and_the_services_add_up(tiny: dict[str, dict[str, Any]]) -> None:
    for result in tiny.values():
        by_service = result["usd_per_million_by_service"]
        assert result["usd_per_million"] > 0
        assert set(by_service) == set(services())
        assert sum(by_service.values()) == pytest.approx(result["usd_per_million"])
        assert by_service["Lambda"] > 0 and by_service["SQS"] > 0 and by_service["API Gateway"] > 0


def test_a_transactional_item_write_costs_two_units_and_a_plain_one_one() -> None:
    config = blueprint(load_context())
    meter = Meter(dynamodb_writes=3, dynamodb_transact_items=2)
    assert usage(meter, config, Billing())["dynamodb.write_request_units"] == 3 + 2 * 2


def test_a_burst_lease_is_a_transaction_of_the_tenant_and_the_pool() -> None:
    table = LeaseTable(burst_capacity=10)
    limits = ConcurrencyLimits(floor=1, ceiling=4)
    # a lone tenant's floor is first tried with one conditional write without reading; on an item
    # with no map of leases yet (or a floor taken) its condition fails, billed, and the batch reads;
    # a new tenant's item gets its map (one write) before the floor lease's write
    assert table.acquire_many({1: limits}, "a", 10_000, 0) == {1: Grant.FLOOR}
    assert (table.writes, table.transact_items, table.item_reads) == (3, 0, 2)  # the tenant and the pool
    assert table.acquire_many({1: limits}, "b", 10_000, 0) == {1: Grant.BURST}
    assert (table.writes, table.transact_items, table.item_reads) == (4, 2, 4)
    table.release("b", [1], 1.0)
    assert table.writes == 5  # the place given back in the pool's shard


def test_lambda_duration_is_billed_at_the_configured_memory() -> None:
    meter = Meter()
    meter.invoke("worker", 2, 1500)
    small = usage(meter, blueprint(load_context(), [{"worker": {"memory_mb": 512}}]), Billing())
    large = usage(meter, blueprint(load_context(), [{"worker": {"memory_mb": 2048}}]), Billing())
    assert small["lambda.requests"] == 2
    assert small["lambda.gb_seconds_arm64"] == pytest.approx(1.5 * 0.5)
    assert large["lambda.gb_seconds_arm64"] == pytest.approx(1.5 * 2)


def test_an_idle_poller_makes_an_empty_long_poll_every_twenty_seconds() -> None:
    env = simpy.Environment()
    queue = SqsQueue(env, "q", visibility_timeout_s=30.0)
    mapping = EventSourceMapping(
        env,
        queue,
        lambda batch, source, index: Invocation(1.0, lambda: source.delete(batch)),
        batch_size=10,
        batching_window_s=0.0,
        max_concurrency=5,
        function=FunctionConcurrency(env, None),
    )
    env.run(until=5 * LONG_POLL_S + 1)
    mapping.settle_polls()
    assert mapping.idle_polls == 5 * 5  # five pollers, five whole waits each
    queue.send(Message(0, 0, None, None, 1.0, False))
    env.run(until=6 * LONG_POLL_S)
    assert mapping.receives[1] == 1 and mapping.invocations == 1


def test_the_controllers_memory_is_the_stacks() -> None:
    from breakwater_cdk.control import CONTROLLER_MEMORY_MB as DEPLOYED

    assert CONTROLLER_MEMORY_MB == DEPLOYED
