"""The replay job's Spark schema is the pydantic envelope, field for field, and so is the body it sends."""

from __future__ import annotations

import json
import types
import typing
from enum import Enum

import pytest
from pyspark.sql.types import DataType, LongType, StringType

from breakwater.envelope import Envelope, Origin
from glue_jobs.replay_save import envelope_body
from glue_jobs.replay_transforms import ENVELOPE_SCHEMA
from tests.spark.helpers import T0, envelope


def _spark_type_and_nullable(annotation: object) -> tuple[DataType, bool]:
    """The Spark type a pydantic annotation is read as, and whether it admits null."""
    if annotation is typing.Any:
        return StringType(), True  # payload: any JSON value, read as its JSON text
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [arg for arg in args if arg is not type(None)]
        return _spark_type_and_nullable(inner)[0], True
    if origin is typing.Literal:
        (kind,) = {type(arg) for arg in args}
        return _spark_type_and_nullable(kind)[0], False
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return StringType(), False
    if annotation is int:
        return LongType(), False
    if annotation is str:
        return StringType(), False
    raise AssertionError(f"no Spark mapping for {annotation!r}: extend the schema and this test")


def test_field_names_and_order_match() -> None:
    assert [f.name for f in ENVELOPE_SCHEMA.fields] == list(Envelope.model_fields)


@pytest.mark.parametrize("name", list(Envelope.model_fields))
def test_field_type_and_nullability_match(name: str) -> None:
    expected_type, expected_nullable = _spark_type_and_nullable(Envelope.model_fields[name].annotation)
    field = ENVELOPE_SCHEMA[name]
    assert (field.dataType, field.nullable) == (expected_type, expected_nullable)


def test_replayed_body_is_the_envelope_rehomed_to_replay() -> None:
    """The send builds bodies with ``json`` from the schema's fields; the model must read them back."""
    item = envelope(
        "acme", T0, request_id="r", trace_id="t", expires_at=T0 + 1, dedup_key="d", ordering_key="o",
        attempt=2,
    )  # fmt: skip
    row = json.loads(item.to_json())
    row["payload"] = json.dumps(row["payload"], separators=(",", ":"))  # as Spark reads it: JSON text

    replayed, original = envelope_body(row, "run-1")

    assert list(json.loads(original)) == list(json.loads(replayed)) == list(Envelope.model_fields)
    assert Envelope.from_json(original) == item
    assert Envelope.from_json(replayed) == item.model_copy(
        update={"origin": Origin.REPLAY, "replay_run": "run-1"}
    )
