"""A probe function for the mapping tests: the body says what to do with each record."""

import time


def handler(event, context):
    failures = []
    for record in event["Records"]:
        body = record["body"]
        if body.startswith("sleep"):
            time.sleep(0.3)
        if body.startswith("fail"):
            failures.append({"itemIdentifier": record["messageId"]})
        if body == "crash":
            raise RuntimeError("the whole batch fails")
    print(f'{{"remaining_ms": {context.get_remaining_time_in_millis()}, "records": {len(event["Records"])}}}')
    return {"batchItemFailures": failures}
