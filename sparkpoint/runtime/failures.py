"""How the runtime names a failure that ends an attempt of the job."""

from __future__ import annotations

from sparkpoint.errors import SparkpointError

# The participant id of the job itself (epoch, watermark) in every checkpoint.
JOB = "job"


class FailoverRequired(SparkpointError):
    pass


class RestoreFailed(SparkpointError):
    pass


def summarize(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    # Py4J errors carry the Python traceback of the worker; the last line names the cause.
    for line in reversed(text):
        if "Error" in line or "Exception" in line:
            return line.strip()[:400]
    return (text[-1] if text else type(e).__name__)[:400]
