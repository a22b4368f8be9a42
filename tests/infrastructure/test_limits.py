"""Limits the stack sets from cdk.json that the functions would otherwise leave open."""

from __future__ import annotations

from tests.infrastructure.conftest import Synth
from tests.infrastructure.test_foundation import _env


def test_the_burst_pool_is_set_from_the_config_so_floors_hold(synth: Synth) -> None:
    worker = synth.config.worker
    assert worker.burst_share is not None
    live = _env(synth, synth.breakwater.consumers.live_worker)
    mapped = synth.config.queue_set.size + 1  # the live queues and the surge queue
    assert int(live["CONCURRENCY_BURST_SLOTS"]) == int(worker.burst_share * mapped * worker.max_concurrency)
    sideline = _env(synth, synth.breakwater.consumers.sideline_worker)
    assert 1 <= int(sideline["CONCURRENCY_BURST_SLOTS"]) < int(live["CONCURRENCY_BURST_SLOTS"])


def test_the_workers_know_after_how_many_receives_their_queues_dead_letter(synth: Synth) -> None:
    """A message that fails on its last receive is counted dead_lettered: the count must be the queues'."""
    for worker in (synth.breakwater.consumers.live_worker, synth.breakwater.consumers.sideline_worker):
        assert _env(synth, worker)["MAX_RECEIVE_COUNT"] == str(synth.config.queue_set.max_receive_count)


def test_every_queue_a_worker_reads_has_its_dead_letter_queue_where_the_worker_looks(synth: Synth) -> None:
    """A worker sends a message moved between failures to ``<queue url>-dlq`` itself, when allowed to."""
    from breakwater.backlog import dead_letter_queue_url

    template = synth.template
    queues = template.find_resources("AWS::SQS::Queue")
    names = {logical: props["Properties"].get("QueueName") for logical, props in queues.items()}
    mapped = [
        props["Properties"]["EventSourceArn"]["Fn::GetAtt"][0]
        for props in template.find_resources("AWS::Lambda::EventSourceMapping").values()
        if "Fn::GetAtt" in props["Properties"]["EventSourceArn"]
    ]
    standard = [q for q in mapped if q in names and not str(names[q]).endswith(".fifo")]  # not streams
    assert standard
    for logical in standard:
        redrive = queues[logical]["Properties"]["RedrivePolicy"]["deadLetterTargetArn"]["Fn::GetAtt"][0]
        assert dead_letter_queue_url(f"https://sqs/{names[logical]}") == f"https://sqs/{names[redrive]}"
