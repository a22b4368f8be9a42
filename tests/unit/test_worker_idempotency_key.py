"""The batched idempotency layer derives the same record key as Powertools' own layer."""

from __future__ import annotations

import pytest
from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer, IdempotencyConfig

from breakwater.aws.idempotency import KEY_PREFIX, BatchedPersistenceLayer, IdempotentProcessor
from breakwater.envelope import Envelope, new_envelope_id
from breakwater.observability import PowertoolsSettings


class _Client:  # only the key is computed; a lock's put is recorded, never sent
    def __init__(self) -> None:
        self.puts: list[dict[str, object]] = []

    def put_item(self, **put: object) -> None:
        self.puts.append(put)


@pytest.mark.parametrize("envelope_id", ["01M7ZW00MHMRWF3QJXMWXNB2JC", "x", 'é"\\ü'])
def test_the_key_is_the_one_powertools_derives(envelope_id: str) -> None:
    config = IdempotencyConfig(event_key_jmespath="id")
    ours = BatchedPersistenceLayer("table", client=_Client())  # type: ignore[arg-type]
    theirs = DynamoDBPersistenceLayer(table_name="table", boto3_client=_Client())
    for layer in (ours, theirs):
        layer.configure(config, key_prefix=KEY_PREFIX)
    data = {"id": envelope_id, "tenant": "acme", "payload": {"n": 1}}
    assert ours._get_hashed_idempotency_key(data) == theirs._get_hashed_idempotency_key(data)


@pytest.mark.parametrize("disabled", [False, True])
def test_with_idempotency_disabled_the_batch_takes_no_lock(disabled: bool) -> None:
    envelope = Envelope(id=new_envelope_id(0), tenant="acme", type="test", enqueued_at=0)
    processor = IdempotentProcessor(
        lambda envelope, work: {},
        "table",
        3600,
        client=_Client(),  # type: ignore[arg-type]
        powertools=PowertoolsSettings(idempotency_disabled=disabled),
    )
    client = processor.persistence.client
    processor.lock([envelope])
    assert (client.puts == []) is disabled
