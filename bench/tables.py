"""The benches' DynamoDB tables on moto: the state table's key layout (``pk``, ``sk``, on demand)."""

from __future__ import annotations

from typing import Any


def create_pk_sk_table(client: Any, name: str) -> str:
    """Create ``name`` with the State table's keys (``pk`` hash, ``sk`` range, strings), on demand."""
    client.create_table(
        TableName=name,
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return name
