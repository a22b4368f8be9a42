"""A probe Kinesis consumer: a record whose data is ``crash`` fails the invocation (a function error);
``fail`` is reported as a batch item failure; everything else succeeds. Each delivery is printed."""

import base64
import json


def handler(event, context):
    failures = []
    for record in event["Records"]:
        data = base64.b64decode(record["kinesis"]["data"]).decode()
        if data == "crash":
            raise RuntimeError("poison record")
        if data == "fail":
            failures.append({"itemIdentifier": record["kinesis"]["sequenceNumber"]})
    print(json.dumps({"delivered": [r["eventID"] for r in event["Records"]]}))
    return {"batchItemFailures": failures}
