"""The emulator's container cap hands a freed container to the source holding the fewest."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from local.emulator.functions import FairSlots


def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _taker(slots: FairSlots, order: list[str]) -> Callable[[str], threading.Thread]:
    def start(source: str) -> threading.Thread:
        def take() -> None:
            slots.acquire(source)
            order.append(source)

        thread = threading.Thread(target=take, daemon=True)
        thread.start()
        return thread

    return start


def test_a_freed_slot_goes_to_the_waiting_source_that_holds_the_fewest() -> None:
    slots = FairSlots(2)
    slots.acquire("busy-queue")
    slots.acquire("busy-queue")
    order: list[str] = []
    start = _taker(slots, order)
    start("busy-queue")
    _until(lambda: slots.waiting() == ["busy-queue"])
    start("quiet-queue")
    _until(lambda: slots.waiting() == ["busy-queue", "quiet-queue"])

    slots.release("busy-queue")
    _until(lambda: len(order) == 1)
    assert order == ["quiet-queue"]  # it asked second, but held none
    assert slots.waiting() == ["busy-queue"]

    slots.release("busy-queue")
    _until(lambda: len(order) == 2)
    assert order == ["quiet-queue", "busy-queue"]


def test_first_come_among_sources_that_hold_as_many() -> None:
    slots = FairSlots(1)
    slots.acquire("a")
    order: list[str] = []
    start = _taker(slots, order)
    for source in ("b", "c", "d"):
        start(source)
        _until(lambda source=source: slots.waiting()[-1:] == [source])
    for served in range(1, 4):
        slots.release(order[-1] if order else "a")
        _until(lambda served=served: len(order) == served)
    assert order == ["b", "c", "d"]


def test_the_cap_holds_and_free_slots_are_taken_at_once() -> None:
    slots = FairSlots(3)
    held = 0
    most = 0
    lock = threading.Lock()

    def work(source: str) -> None:
        nonlocal held, most
        with slots.held(source):
            with lock:
                held += 1
                most = max(most, held)
            time.sleep(0.01)
            with lock:
                held -= 1

    threads = [threading.Thread(target=work, args=(f"queue-{i % 4}",)) for i in range(24)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert most == 3
    assert slots.waiting() == []


def test_releasing_a_slot_a_source_does_not_hold_is_an_error() -> None:
    slots = FairSlots(1)
    slots.acquire("a")
    with pytest.raises(ValueError, match="'b' holds no slot"):
        slots.release("b")
    with pytest.raises(ValueError, match="at least 1"):
        FairSlots(0)
