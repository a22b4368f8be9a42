"""Retrying a lost race in process, with jitter, within the invocation's time.

Two containers that wrote the same item at the same instant and both retry after the same fixed
pause meet again; a pause drawn at random from a window that doubles with each attempt ("full
jitter") spreads them. A pause is only taken if the invocation has the time for it and an attempt
after it (:data:`breakwater.aws.clients.DEADLINE`): a race still lost then costs only what the
caller does with a refusal, never the invocation's timeout.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from breakwater.aws.clients import DEADLINE, Deadline

BASE_PAUSE_S = 0.01
MAX_PAUSE_S = 0.1
ATTEMPT_S = 1.0  # what a retried call may need after the pause


def pause_before_retry(
    attempt: int,
    *,
    deadline: Deadline = DEADLINE,
    sleep: Callable[[float], None] = time.sleep,
    draw: Callable[[float, float], float] = random.uniform,
) -> bool:
    """Sleep before retry number ``attempt`` (0 for the first retry); False, without sleeping, when the
    invocation has no time for the pause and another attempt."""
    pause = draw(0.0, min(MAX_PAUSE_S, BASE_PAUSE_S * 2**attempt))
    remaining = deadline.remaining_s()
    if remaining is not None and remaining < pause + ATTEMPT_S:
        return False
    sleep(pause)
    return True
