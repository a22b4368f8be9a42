from breakwater.counting import CounterBuffer


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
