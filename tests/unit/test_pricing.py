"""The price table and the arithmetic that turns counted usage into $ per million delivered messages."""

from __future__ import annotations

import math

import pytest

from local.pricing import cost, usage


def test_every_price_names_its_unit_date_and_aws_pricing_page() -> None:
    prices = cost.load_prices()
    for unit, price in prices.items():
        assert price.price_usd > 0 and price.per > 0, unit
        assert price.source.startswith("https://aws.amazon.com/") and "/pricing/" in price.source, unit
        assert len(price.date) == 10 and price.date[4] == "-", unit
    for needed in (
        "apigateway.rest_requests",
        "lambda.requests",
        "lambda.gb_seconds_arm64",
        "lambda.gb_seconds_x86_64",
        "sqs.standard_requests",
        "sqs.fifo_requests",
        "dynamodb.write_request_units",
        "dynamodb.read_request_units",
        "kinesis.put_payload_units",
        "kinesis.shard_hours",
        "s3.put_requests",
        "s3.get_requests",
        "cloudwatch.metric_months",
        "logs.ingested_bytes",
    ):
        assert needed in prices


def test_sqs_bills_each_64_kb_chunk_of_a_request_and_at_least_one() -> None:
    assert usage.sqs_chunks(0) == 1
    assert usage.sqs_chunks(10 * 200) == 1  # a batch of ten small messages is one request
    assert usage.sqs_chunks(64 * 1024) == 1
    assert usage.sqs_chunks(64 * 1024 + 1) == 2
    assert usage.sqs_chunks(256 * 1024) == 4


def test_a_batch_of_ten_sends_is_one_request_and_a_fifo_queue_is_priced_apart() -> None:
    entries = [{"Id": str(i), "MessageBody": "x" * 500} for i in range(10)]
    standard = usage.sqs_usage("SendMessageBatch", {"QueueUrl": "https://q/live-0", "Entries": entries}, {})
    assert standard == {"sqs.standard_requests": 1}
    big = [{"Id": str(i), "MessageBody": "x" * 20_000} for i in range(10)]
    fifo = usage.sqs_usage("SendMessageBatch", {"QueueUrl": "https://q/ordered.fifo", "Entries": big}, {})
    assert fifo == {"sqs.fifo_requests": math.ceil(200_000 / 65_536)}


def test_dynamodb_units_round_up_per_item_and_transactions_count_double() -> None:
    assert usage.write_units(1) == 1
    assert usage.write_units(1024) == 1
    assert usage.write_units(1025) == 2
    assert usage.write_units(1025, transactional=True) == 4
    assert usage.read_units(100) == 0.5  # eventually consistent
    assert usage.read_units(100, consistent=True) == 1
    assert usage.read_units(4097, consistent=True) == 2
    assert usage.read_units(100, transactional=True) == 2


def test_item_size_counts_names_and_values_as_dynamodb_does() -> None:
    item = {"pk": {"S": "tenant#a"}, "n": {"N": "12345"}, "flag": {"BOOL": True}}
    assert usage.item_size(item) == (2 + 8) + (1 + 4) + (4 + 1)
    nested = {"m": {"M": {"k": {"S": "vv"}}}}
    assert usage.item_size(nested) == 1 + 3 + (1 + 1 + 2)


def test_a_transaction_of_two_small_puts_and_a_condition_check_is_six_write_units() -> None:
    request = {
        "TransactItems": [
            {"Put": {"TableName": "t", "Item": {"pk": {"S": "a"}}}},
            {"Put": {"TableName": "t", "Item": {"pk": {"S": "b"}}}},
            {"ConditionCheck": {"TableName": "t", "Key": {"pk": {"S": "c"}}}},
        ]
    }
    assert usage.dynamodb_usage("TransactWriteItems", request, {}) == {"dynamodb.write_request_units": 6}


def test_lambda_duration_is_rounded_up_to_the_millisecond_at_the_configured_memory() -> None:
    assert usage.gb_seconds(1000.0, 1024) == pytest.approx(1.0)
    assert usage.gb_seconds(0.2, 512) == pytest.approx(0.001 * 0.5)
    assert usage.gb_seconds(100.4, 256) == pytest.approx(0.101 * 0.25)


def test_kinesis_put_payload_units_are_25_kb_each() -> None:
    request = {"Records": [{"Data": "", "PartitionKey": "t"}, {"Data": "A" * 40_000, "PartitionKey": "t"}]}
    answer = {"Records": [{}, {}]}
    counted = usage.kinesis_usage("PutRecords", request, answer)
    assert counted["kinesis.put_payload_units"] == 1 + 2  # 30,000 bytes decoded: two units


def test_hourly_units_scale_with_the_window() -> None:
    assert cost.hourly_usage(3600, shards=2, metrics=730) == {
        "kinesis.shard_hours": 2.0,
        "cloudwatch.metric_months": 1.0,
    }


def test_cost_summary_prices_usage_per_million_delivered_messages_by_service() -> None:
    counted = {
        "apigateway.rest_requests": 1000,
        "lambda.requests": 200,
        "lambda.gb_seconds_arm64": 30.0,
        "sqs.standard_requests": 600,
        "dynamodb.write_request_units": 2000,
        "dynamodb.reported_capacity_units": 5,  # kept, not priced
    }
    summary = cost.cost_summary(counted, delivered=1000, window_s=60, requests=9000)
    by_service = summary["usd_per_million_by_service"]
    assert by_service["API Gateway"] == pytest.approx(3.50)  # one request per message
    assert by_service["Lambda"] == pytest.approx(0.2 * 0.2 + 30 * 0.0000133334 * 1000)
    assert by_service["SQS"] == pytest.approx(0.6 * 0.40)
    assert by_service["DynamoDB"] == pytest.approx(2 * 0.625)
    assert by_service["S3"] == 0
    assert summary["usd_per_million_delivered"] == pytest.approx(sum(by_service.values()))
    assert summary["aws_requests_per_delivered_message"] == 9.0
    assert summary["usage"]["dynamodb.reported_capacity_units"] == 5


def test_an_unknown_unit_is_an_error_not_free() -> None:
    with pytest.raises(KeyError):
        cost.price_usage({"sqs.standard_request": 1})


def test_lambda_duration_is_billed_with_aws_round_trips_in_place_of_the_emulator_s() -> None:
    latency = {"dynamodb": 8.0, "sqs": 15.0, "default": 20.0}
    measured = {
        "measured.aws_call_ms": 60.0,  # the emulator's waits: three DynamoDB calls, an SQS and an S3 one
        "measured.aws_calls.dynamodb": 3,
        "measured.aws_calls.sqs": 1,
        "measured.aws_calls.s3": 1,
    }
    assert usage.modelled_duration_ms(100.0, measured, latency) == 40 + 3 * 8 + 15 + 20
    assert usage.modelled_duration_ms(100.0, {}, latency) == 100.0  # no calls: as measured
    assert usage.modelled_duration_ms(50.0, measured, latency) == 3 * 8 + 15 + 20  # never below the calls


def test_the_stated_latencies_cover_every_service_and_measured_units_are_never_priced() -> None:
    latency = cost.aws_call_latency_ms()
    assert {"dynamodb", "sqs", "default"} <= set(latency) and all(ms > 0 for ms in latency.values())
    assert cost.price_usage({"measured.aws_call_ms": 5000.0, "measured.lambda_gb_seconds": 3.0}) == {}


def test_side_by_side_puts_each_configuration_beside_naive_with_the_ratio() -> None:
    breakwater = cost.cost_summary({"sqs.standard_requests": 4000}, delivered=1000, window_s=60)
    naive = cost.cost_summary({"sqs.standard_requests": 2000}, delivered=1000, window_s=60)
    text = cost.side_by_side({"breakwater": breakwater, "naive": naive})
    sqs_row = next(line for line in text.splitlines() if line.startswith("SQS"))
    assert "1.60" in sqs_row and "0.80" in sqs_row and "2.00x" in sqs_row
    assert any(line.startswith("total") for line in text.splitlines())
