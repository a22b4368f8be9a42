"""The replay job's Spark schema is the pydantic envelope, field for field."""

from __future__ import annotations

import types
import typing
from enum import Enum

import pytest
from pyspark.sql.types import DataType, LongType, StringType

from breakwater.envelope import Envelope
from glue_jobs.replay_transforms import ENVELOPE_SCHEMA


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
