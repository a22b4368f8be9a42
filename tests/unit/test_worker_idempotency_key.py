"""The batched idempotency layer derives the same record key as Powertools' own layer."""

from __future__ import annotations

import pytest
from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer, IdempotencyConfig

from breakwater.aws.idempotency import KEY_PREFIX, BatchedPersistenceLayer


class _Client:  # never called: only the key is computed
    pass


@pytest.mark.parametrize("envelope_id", ["01M7ZW00MHMRWF3QJXMWXNB2JC", "x", 'é"\\ü'])
def test_the_key_is_the_one_powertools_derives(envelope_id: str) -> None:
    config = IdempotencyConfig(event_key_jmespath="id")
    ours = BatchedPersistenceLayer("table", client=_Client())  # type: ignore[arg-type]
    theirs = DynamoDBPersistenceLayer(table_name="table", boto3_client=_Client())
    for layer in (ours, theirs):
        layer.configure(config, key_prefix=KEY_PREFIX)
    data = {"id": envelope_id, "tenant": "acme", "payload": {"n": 1}}
    assert ours._get_hashed_idempotency_key(data) == theirs._get_hashed_idempotency_key(data)
