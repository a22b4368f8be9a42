"""SQS's batch limits that moto 5.2.5 does not check: ten entries in a DeleteMessageBatch or a
ChangeMessageVisibilityBatch (``TooManyEntriesInBatchRequest``).

moto already refuses a SendMessageBatch of more than ten entries (``TooManyEntriesInBatchRequest``)
or over 1 MiB in total (``BatchRequestTooLong``), and a message over the queue's maximum size, 1 MiB
by default (``InvalidParameterValue``): those are left to it.
"""

from __future__ import annotations

import functools
from typing import Any

from moto.sqs.exceptions import TooManyEntriesInBatchRequest
from moto.sqs.responses import SQSResponse

from local.emulator.moto_patches import limits as limits_state
from local.emulator.moto_patches.patch import Kind, Patch, Replacement


def _at_most_ten(original: Any) -> Any:
    @functools.wraps(original)
    def batch(self: Any) -> Any:
        enforcement = limits_state.active()
        if enforcement is not None:
            entries = self._get_param("Entries", []) or []
            if len(entries) > enforcement.limits.sqs_batch_entries:
                with enforcement.lock:
                    enforcement.refused["TooManyEntriesInBatchRequest"] += 1
                raise TooManyEntriesInBatchRequest(len(entries))
        return original(self)

    return batch


PATCHES = (
    Patch(
        name="sqs_limits.batch_entries",
        kind=Kind.LIMITS,
        corrects="moto deletes or changes the visibility of any number of entries in one batch call; "
        "SQS refuses more than ten with TooManyEntriesInBatchRequest.",
        replaces=(
            Replacement(SQSResponse, "delete_message_batch", _at_most_ten),
            Replacement(SQSResponse, "change_message_visibility_batch", _at_most_ten),
        ),
    ),
)
