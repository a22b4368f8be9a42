from breakwater.counting import CounterBuffer
from tests.polling import wait_for


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_nothing_is_due_before_the_interval_and_everything_after():
    clock = Clock()
    buffer = CounterBuffer(10.0, clock)
    buffer.add("acme", "accepted")
    buffer.add("acme", "accepted")
    buffer.add("globex", "throttled", 3)
    clock.now += 9.9
    assert buffer.take_due() == {}
    clock.now += 0.1
    assert buffer.take_due() == {"acme": {"accepted": 2}, "globex": {"throttled": 3}}
    assert buffer.take_due() == {}  # taken means reset


def test_the_interval_starts_with_the_first_count_after_a_flush():
    clock = Clock()
    buffer = CounterBuffer(5.0, clock)
    clock.now += 60  # idle time does not make the next count due at once
    buffer.add("acme", "accepted")
    assert buffer.take_due() == {}


def test_restored_tallies_go_out_with_the_next_flush():
    clock = Clock()
    buffer = CounterBuffer(0.0, clock)
    buffer.add("acme", "accepted")
    taken = buffer.take_all()
    buffer.restore(taken)
    buffer.add("acme", "accepted")
    assert buffer.take_all() == {"acme": {"accepted": 2}}


class _Sink:
    def __init__(self) -> None:
        self.added: list[dict] = []

    def add(self, deltas) -> dict:
        self.added.append({tenant: dict(counts) for tenant, counts in deltas.items()})
        return {}


class _NoQueues:
    def __len__(self) -> int:
        return 1

    def depth(self, index: int) -> int:
        return 0

    def send(self, index: int, body: str, group_id: str) -> str:
        return "m"


def _service(sink: _Sink, interval: float):
    import time

    from breakwater.ingest import IngestService, Router

    return IngestService(
        router=Router(_NoQueues(), 1, 5.0, time.time),
        gate=None,
        clock=time.time,
        max_payload_bytes=1024,
        max_ttl_seconds=60,
        counters=sink,
        counter_flush_seconds=interval,
    )


def test_tallies_are_flushed_by_the_timer_without_another_request():
    from breakwater.aws.front_door import flush_tallies_in_the_background
    from breakwater.ingest import TenantContext

    sink = _Sink()
    service = _service(sink, interval=0.05)
    stop = flush_tallies_in_the_background(service, install_signal=False)
    try:
        tenant = TenantContext(tenant="acme", tier="standard", rate=5, burst=10)
        service.accept(b'{"type": "t"}', tenant, request_id=None, trace_id=None)
        assert wait_for(lambda: sink.added == [{"acme": {"accepted": 1}}])
    finally:
        stop.set()


def test_sigterm_flushes_every_tally_then_runs_the_previous_handler():
    import signal

    from breakwater.aws.front_door import flush_tallies_in_the_background
    from breakwater.ingest import TenantContext

    seen: list[int] = []
    original = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        sink = _Sink()
        service = _service(sink, interval=3600)  # the timer would not flush for an hour
        stop = flush_tallies_in_the_background(service)
        tenant = TenantContext(tenant="acme", tier="standard", rate=5, burst=10)
        service.accept(b'{"type": "t"}', tenant, request_id=None, trace_id=None)
        assert sink.added == []
        signal.raise_signal(signal.SIGTERM)
        assert sink.added == [{"acme": {"accepted": 1}}]
        assert seen == [signal.SIGTERM] and stop.is_set()
    finally:
        signal.signal(signal.SIGTERM, original)


class _HalfDown(_Sink):
    """A sink whose write for ``down`` fails: the others land."""

    def __init__(self, down: str) -> None:
        super().__init__()
        self.down = down

    def add(self, deltas) -> dict:
        super().add(deltas)
        return {tenant: dict(counts) for tenant, counts in deltas.items() if tenant == self.down}


def test_only_the_tallies_whose_write_failed_go_out_again():
    from breakwater.ingest import TenantContext

    sink = _HalfDown("globex")
    service = _service(sink, interval=3600)
    for name in ("acme", "globex"):
        tenant = TenantContext(tenant=name, tier="standard", rate=5, burst=10)
        service.accept(b'{"type": "t"}', tenant, request_id=None, trace_id=None)
    service.flush_counters()
    sink.down = ""
    service.flush_counters()
    # acme's landed write is not made twice (counters only ever ADD); globex's goes out with the next flush
    assert sink.added == [{"acme": {"accepted": 1}, "globex": {"accepted": 1}}, {"globex": {"accepted": 1}}]
