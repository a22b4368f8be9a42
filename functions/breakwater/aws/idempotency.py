"""Processing idempotency per envelope id: Powertools idempotency on the idempotency table.

The key prefix is fixed (not derived from the function name), so the live and the sideline worker,
two functions, share one record per envelope: a message processed by either is never processed
again by the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.typing import LambdaContext

from breakwater.envelope import Envelope
from breakwater.processor import WorkContext

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

KEY_PREFIX = "breakwater.process"

Processor = Callable[[Envelope, WorkContext], dict[str, Any]]


def idempotent_processor(
    process: Processor, table_name: str, expires_after_seconds: int, *, client: DynamoDBClient | None = None
) -> tuple[Processor, Callable[[LambdaContext], None]]:
    """``process`` behind Powertools idempotency keyed by ``envelope.id``, and the per-invocation hook.

    Registering the Lambda context lets an in-progress record of a killed invocation expire with it.
    """
    persistence = DynamoDBPersistenceLayer(table_name=table_name, boto3_client=client)
    config = IdempotencyConfig(event_key_jmespath="id", expires_after_seconds=expires_after_seconds)

    @idempotent_function(
        data_keyword_argument="envelope", persistence_store=persistence, config=config, key_prefix=KEY_PREFIX
    )
    def run(*, envelope: Envelope, work: WorkContext) -> dict[str, Any]:
        return process(envelope, work)

    def call(envelope: Envelope, work: WorkContext) -> dict[str, Any]:
        result: dict[str, Any] = run(envelope=envelope, work=work)
        return result

    return call, config.register_lambda_context
