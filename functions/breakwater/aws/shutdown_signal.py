"""Lambda sends a function's runtime SIGTERM before it shuts the container down only when an extension
is registered. This registers a no-op internal extension (no events; its thread waits on the
Extensions API for ever), so a handler of SIGTERM really runs and flushes what no later invocation
would (:func:`flush_in_the_background`: ingest's tallies, a worker's counters kept for a later
write). It is what Lambda's own Rust runtime does for graceful shutdown; outside Lambda (no
``AWS_LAMBDA_RUNTIME_API``: tests, the emulator) it does nothing.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request
from collections.abc import Callable, Mapping
from types import FrameType
from typing import Any

from breakwater.observability import logger

RUNTIME_API_ENV = "AWS_LAMBDA_RUNTIME_API"
EXTENSION_NAME = "breakwater-shutdown-signal"
_REGISTER_TIMEOUT_S = 2.0


def register_for_shutdown_signal(environ: Mapping[str, str] | None = None) -> str | None:
    """Register the extension (during the function's init) and keep it waiting; its identifier, or
    None outside Lambda or when the Extensions API refused (then no SIGTERM comes: logged)."""
    api = (os.environ if environ is None else environ).get(RUNTIME_API_ENV)
    if not api:
        return None
    request = urllib.request.Request(
        f"http://{api}/2020-01-01/extension/register",
        data=json.dumps({"events": []}).encode(),
        headers={"Lambda-Extension-Name": EXTENSION_NAME, "Content-Type": "application/json"},
        method="POST",
    )
    try:
        # Lambda's own Runtime API, on the container's loopback
        with urllib.request.urlopen(request, timeout=_REGISTER_TIMEOUT_S) as response:  # noqa: S310
            identifier = response.headers.get("Lambda-Extension-Identifier")
    except OSError:
        logger.exception("the shutdown-signal extension was not registered: tallies flush on the timer only")
        return None
    if not identifier:
        return None
    threading.Thread(
        target=_wait_for_events, args=(api, identifier), name=EXTENSION_NAME, daemon=True
    ).start()
    return str(identifier)


def _wait_for_events(api: str, identifier: str) -> None:
    """An extension ends its init by asking for its next event; with none subscribed, the ask never
    returns before the container is shut down."""
    while True:
        request = urllib.request.Request(
            f"http://{api}/2020-01-01/extension/event/next",
            headers={"Lambda-Extension-Identifier": identifier},
        )
        try:
            with urllib.request.urlopen(request) as response:  # noqa: S310
                response.read()
        except OSError:
            return


def flush_in_the_background(
    flush: Callable[[bool], object], interval_s: float, *, name: str, install_signal: bool = True
) -> threading.Event:
    """Call ``flush(False)`` (what is due) every ``interval_s`` from a daemon thread, and ``flush(True)``
    (everything) at shutdown; returns the event that stops the thread.

    An invocation only flushes what is due when it runs; without this, what a container keeps would
    wait for a next invocation (or be lost with the container). Lambda sends SIGTERM before it shuts
    a container down when an extension is registered, so one is (:func:`register_for_shutdown_signal`);
    the handler flushes, then runs whatever handler was installed before. ``flush`` must be safe to
    call beside the handler (the thread runs while an invocation does).
    """
    stop = threading.Event()
    interval = max(interval_s, 0.1)

    def loop() -> None:
        while not stop.wait(interval):
            flush(False)

    threading.Thread(target=loop, name=name, daemon=True).start()
    if install_signal and threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGTERM)

        def on_term(signum: int, frame: FrameType | None) -> Any:
            stop.set()
            flush(True)
            if callable(previous):
                return previous(signum, frame)
            if previous == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.raise_signal(signal.SIGTERM)
            return None

        signal.signal(signal.SIGTERM, on_term)
        register_for_shutdown_signal()
    return stop
