"""A function for the usage counting tests: sends the event's messages to its queue in one batch."""

import boto3

sqs = boto3.client("sqs")


def handler(event, context):
    entries = [{"Id": str(i), "MessageBody": body} for i, body in enumerate(event["bodies"])]
    sqs.send_message_batch(QueueUrl=event["queue_url"], Entries=entries)
    print("sent", len(entries))
    return {"sent": len(entries)}
